"""GPT-J (`GPTJForCausalLM`). llama.cpp knows the architecture name and its tensor names but has no
graph for it, so no GGML runtime loads these files yet (see docs/architectures.md).

Each block runs attention and MLP in parallel on the output of its single layer norm (ln_1):
x + attn(ln_1 x) + mlp(ln_1 x). Rotary embeddings cover the first rotary_dim dimensions of each head
and rotate adjacent pairs (GPT-J's rotate_every_two), which is GGML's normal rope mode, so q and k
are written as they are: every tensor keeps the checkpoint's layout ("reference").
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.arch.common import ATTN_NORM, ATTN_OUTPUT, FFN_DOWN, FFN_UP, OUTPUT_NORM, TOKEN_EMBD, weights_and_biases
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata


_LAYER, _BLOCK = "transformer.h.{bid}.", "blk.{bid}."


class GPTJ(Architecture):
    name = "gptj"
    hf_classes = ("GPTJForCausalLM",)
    model_types = ("gptj",)
    tokenizer_kind = "gpt2"
    tensor_names = {
        "transformer.wte.weight": TOKEN_EMBD,
        **weights_and_biases({"transformer.ln_f": OUTPUT_NORM, "lm_head": T("output", "n_vocab", "n_embd")}),
        **weights_and_biases({"ln_1": ATTN_NORM, "mlp.fc_in": FFN_UP, "mlp.fc_out": FFN_DOWN}, _LAYER, _BLOCK),
        **weights_and_biases(  # GPT-J's attention projections have no biases
            {"attn.q_proj": T("attn_q", "n_embd", "n_embd"), "attn.k_proj": T("attn_k", "n_embd", "n_embd"),
             "attn.v_proj": T("attn_v", "n_embd", "n_embd"), "attn.out_proj": ATTN_OUTPUT},
            _LAYER, _BLOCK, biases="none",
        ),
    }
    # Buffers older transformers saved with the weights: the causal mask and the rotary table.
    ignored_tensors = (r"transformer\.h\.\d+\.attn\.(bias|masked_bias|embed_positions)",)

    def metadata(self) -> Metadata:
        c = self.config
        n_embd = c.get_int("n_embd", "hidden_size", min=1)
        n_head = c.get_int("n_head", "num_attention_heads", min=1)
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("n_positions", "max_position_embeddings", min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, n_embd)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("n_layer", "num_hidden_layers", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("n_inner", default=4 * n_embd, min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, c.get_int("rotary_dim", default=n_embd // n_head, min=0))
        keys.u32(Keys.Attention.HEAD_COUNT, n_head)
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_epsilon", min=0))
        return metadata
