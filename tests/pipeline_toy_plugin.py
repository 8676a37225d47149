"""A test-only architecture plugin for exercising the conversion pipeline without a real one.

It maps the tensor names of transformers' LlamaForCausalLM to llama.cpp's GGUF names and writes
a few llama keys, with no layout transform except for one tensor (so that both the row-sliced
and the whole-tensor paths of the pipeline run). It is NOT the llama plugin and makes no claim
that llama.cpp can run its output.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.gguf_writer.metadata import Metadata


class ToyLlama(Architecture):
    name = "toyllama"
    hf_classes = ("ToyLlamaForCausalLM",)
    model_types = ("toyllama",)
    tokenizer_kind = None
    tensor_names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
        "model.layers.{bid}.input_layernorm.weight": "blk.{bid}.attn_norm.weight",
        "model.layers.{bid}.self_attn.q_proj.weight": "blk.{bid}.attn_q.weight",
        "model.layers.{bid}.self_attn.k_proj.weight": "blk.{bid}.attn_k.weight",
        "model.layers.{bid}.self_attn.v_proj.weight": "blk.{bid}.attn_v.weight",
        "model.layers.{bid}.self_attn.o_proj.weight": "blk.{bid}.attn_output.weight",
        "model.layers.{bid}.post_attention_layernorm.weight": "blk.{bid}.ffn_norm.weight",
        "model.layers.{bid}.mlp.gate_proj.weight": "blk.{bid}.ffn_gate.weight",
        "model.layers.{bid}.mlp.up_proj.weight": "blk.{bid}.ffn_up.weight",
        "model.layers.{bid}.mlp.down_proj.weight": "blk.{bid}.ffn_down.weight",
        "model.layers.{bid}.mlp.router.weight": "blk.{bid}.ffn_gate_inp.weight",
        "model.layers.{bid}.extra.weight": "blk.{bid}.extra.weight",
        "model.layers.{bid}.experts.{xid}.up.weight": "blk.{bid}.ffn_up_exps.weight",
    }
    ignored_tensors = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)
    f32_tensors = (r"blk\.\d+\.extra\.weight",)

    def metadata(self) -> Metadata:
        md = Metadata()
        keys = ArchKeys(md, self.name)
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, self.config.get("hidden_size"))
        keys.u32(Keys.LLM.BLOCK_COUNT, self.config.get("num_hidden_layers"))
        return md

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith("attn_k.weight"):  # an identity map: exercises the whole-tensor path
            return tensor.map(lambda a: a * 1)
        return tensor


def register() -> None:
    """Make `--arch toyllama` work in this process (for CLI tests run in a subprocess)."""
    from ggufsmith.arch.registry import all_architectures

    all_architectures()[ToyLlama.name] = ToyLlama
