"""GPT-J (`GPTJForCausalLM`). llama.cpp knows the architecture name and its tensor names but has no
graph for it, so no GGML runtime loads these files yet (see docs/architectures.md).

Each block runs attention and MLP in parallel on the output of its single layer norm (ln_1):
x + attn(ln_1 x) + mlp(ln_1 x). Rotary embeddings cover the first rotary_dim dimensions of each head
and rotate adjacent pairs (GPT-J's rotate_every_two), which is GGML's normal rope mode, so q and k
are written as they are: every tensor keeps the checkpoint's layout ("reference").
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.arch.common import weights_and_biases
from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata


class GPTJ(Architecture):
    name = "gptj"
    hf_classes = ("GPTJForCausalLM",)
    model_types = ("gptj",)
    tokenizer_kind = "gpt2"
    tensor_names = {
        "transformer.wte.weight": "token_embd.weight",
        **weights_and_biases({"transformer.ln_f": "output_norm", "lm_head": "output"}),
        **weights_and_biases(
            {
                "ln_1": "attn_norm",
                "attn.q_proj": "attn_q",
                "attn.k_proj": "attn_k",
                "attn.v_proj": "attn_v",
                "attn.out_proj": "attn_output",
                "mlp.fc_in": "ffn_up",
                "mlp.fc_out": "ffn_down",
            },
            hf_prefix="transformer.h.{bid}.",
            gguf_prefix="blk.{bid}.",
        ),
    }
    # Buffers older transformers saved with the weights: the causal mask and the rotary table.
    ignored_tensors = (r"transformer\.h\.\d+\.attn\.(bias|masked_bias|embed_positions)",)

    def metadata(self) -> Metadata:
        c = self.config
        n_embd = c.get("n_embd", "hidden_size")
        n_head = c.get("n_head", "num_attention_heads")
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get("n_positions", "max_position_embeddings"))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, n_embd)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get("n_layer", "num_hidden_layers"))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get("n_inner", default=4 * n_embd))
        keys.u32(Keys.Rope.DIMENSION_COUNT, c.get("rotary_dim", default=n_embd // n_head))
        keys.u32(Keys.Attention.HEAD_COUNT, n_head)
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get("layer_norm_epsilon"))
        return metadata
