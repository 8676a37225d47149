"""dots.llm1 (`Dots1ForCausalLM`): a Qwen3-style decoder (per-head q/k RMSNorm, NeoX rope) whose
first `first_k_dense_replace` blocks have a dense MLP and the others a routed mixture of experts
beside shared experts. Routing as DeepSeek V3's: sigmoid scores, a per-expert bias that only
chooses (`e_score_correction_bias`, llama.cpp's exp_probs_b), the chosen scores optionally
renormalized (norm_topk_prob) and scaled (routed_scaling_factor), the experts chosen among the
topk_group best of n_group groups (llama.cpp's expert_group keys, the same group score: the sum of
each group's two best).

llama.cpp's dots1 has neither grouped-query attention (it loads keys and values as wide as the
queries) nor sliding-window layers: such configs are refused. expert_gating_func (sigmoid) is
written: llama.cpp's converter leaves it out, and llama.cpp aborts on such a file's first MoE layer.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import ROUTER, Decoder, in_block, llama_decoder, routing_keys, sparse_blocks, sparse_dims
from ggufsmith.arch.tensors import Dim, T
from ggufsmith.readers.config import HFConfig


class Dots1(Decoder):
    name = "dots1"
    hf_classes = ("Dots1ForCausalLM",)
    model_types = ("dots1",)
    tensor_names = {
        **{hf: spec for hf, spec in llama_decoder(o_bias="none", qk_norm=True).items() if ".mlp." not in hf},
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's dots1 requires it
        **in_block(sparse_blocks(bias_optional=False)),
    }
    f32_tensors = ROUTER
    # Dots1Config's defaults for the keys a config.json may leave out.
    config_defaults = {"first_k_dense_replace": 0, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
                       "n_group": 1, "topk_group": 1}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject(c, self.n_head_kv != self.n_head, "num_key_value_heads differs from num_attention_heads")
        n_layer = c.get_int("num_hidden_layers", min=1)
        reject(c, "sliding_attention" in self.layer_types(["full_attention"] * n_layer), "layer_types has sliding_attention layers")

    def dims(self) -> dict[str, Dim]:
        return sparse_dims(self.config)

    def family_keys(self, keys: ArchKeys) -> None:
        # Dots1Config names no scoring function: its router always scores with a sigmoid.
        routing_keys(keys, self.config, scoring="sigmoid", grouped=True)
