"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (`Phi3ForCausalLM`): a llama-layout decoder whose q, k and v
are one fused matrix (all queries, all keys, all values: llama.cpp's attn_qkv as it is) and whose
gate and up projections are one matrix of 2 * intermediate_size rows (gate first), which llama.cpp
loads as ffn_up and splits itself. NeoX-style rope (no permutation), partial in Phi-4-mini.

The 128k-context models use LongRoPE: per-pair frequency divisors for short and long contexts,
written as llama.cpp's rope_factors_short/long tensors, and a scale of cos and sin (the attention
factor) as rope.scaling.attn_factor (see arch/rope.py). transformers reads the old type names
"su" and "yarn" of Phi-3 configs as LongRoPE; so do we.

sliding_window is written as llama.cpp's converter writes it (0 when the config has none), but
llama.cpp's phi3 attends to the whole context: the same logits as transformers up to the window.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import QKV_ROWS
from ggufsmith.arch.decoder import LLAMA_NORMS, Decoder, embeddings, fused_gate_up_mlp, in_block, norms
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig

LONGROPE_ALIASES = ("su", "yarn")  # older Phi-3 configs; transformers' Phi3Config reads both as longrope


class Phi3(Decoder):
    name = "phi3"
    hf_classes = ("Phi3ForCausalLM",)
    model_types = ("phi3",)
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(**LLAMA_NORMS),
            "self_attn.qkv_proj.weight": T("attn_qkv.weight", QKV_ROWS, "n_embd"),
            "self_attn.o_proj.weight": T("attn_output.weight", "n_embd", "n_embd"),
            **fused_gate_up_mlp(),
        }),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        if self.rope.type in LONGROPE_ALIASES:
            self.rope.type = "longrope"

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.Rope.DIMENSION_COUNT, int(self.rope.partial_rotary_factor() * self.head_dim))
        if self.rope.type != "longrope":  # else written with the LongRoPE keys
            keys.u32(Keys.Rope.SCALING_ORIG_CTX_LEN, c.get_int("original_max_position_embeddings", default=None, min=1))
        keys.u32(Keys.Attention.SLIDING_WINDOW, c.get_int("sliding_window", default=0))
