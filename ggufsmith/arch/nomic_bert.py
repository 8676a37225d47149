"""Nomic BERT: nomic-embed-text v1 / v1.5 (`nomic-bert`) and v2-moe (`nomic-bert-moe`), for
llama.cpp's embedding tools.

The graph is bert's (post-norm blocks, bidirectional attention, token-type row 0 added to every
token) with rotary positions instead of a position table (NeoX rope over whole heads, as
transformers' rotate_half: no permutation). nomic-bert's MLP is a SwiGLU without biases;
nomic-bert-moe's is bert's GELU MLP with biases, replaced in every layer `i % moe_every_n_layers == 1`
by top-k experts behind a softmax router (GELU experts, weights not renormalized).

The tensors are named as nomic's own code names them (emb_ln, encoder.layers.N.attn.Wqkv,
mlp.fc11 ...), in the Hub checkpoints and in what transformers' NomicBertModel (dense only) saves
(it renames its q/k/v_proj back on saving). The configs differ: nomic's (n_embd, n_layer,
rotary_emb_base, activation_function, ...; the one llama.cpp's converter reads) or transformers'
(hidden_size, rope_parameters, hidden_act, ...): both are read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import numpy as np

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import reject, sentence_transformers_folder
from ggufsmith.arch.encoder import GELU, bert_attention, bert_embeddings, bert_mlp, encoder_keys, layer_norm
from ggufsmith.arch.hybrid import only_where
from ggufsmith.arch.rope import Rope
from ggufsmith.arch.tensors import Dim, T
from ggufsmith.constants import Keys
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor

log = logging.getLogger(__name__)

_B, _L = "blk.{bid}.", "encoder.layers.{bid}."
_MOE_LAYER = "bid % moe_every == 1"  # llama.cpp's and nomic's rule (moe_every 0: no MoE layer)
# nomic's own naming. Attention biases (v2-moe has them) are optional in llama.cpp's graph.
_NOMIC = {
    **bert_embeddings("emb_ln"),
    **bert_attention(_L, "attn.Wqkv", "attn.out_proj", "norm1"),
    **layer_norm(_L + "norm2", _B + "layer_output_norm"),
}
_SWIGLU = {  # llama.cpp's nomic-bert graph applies no MLP bias: a checkpoint with one is refused (config)
    _L + "mlp.fc11.weight": T(_B + "ffn_up.weight", "n_ff", "n_embd"),
    _L + "mlp.fc12.weight": T(_B + "ffn_gate.weight", "n_ff", "n_embd"),
    _L + "mlp.fc2.weight": T(_B + "ffn_down.weight", "n_embd", "n_ff"),
}
_MOE = {
    **only_where(bert_mlp(_L, "mlp.fc1", "mlp.fc2"), f"not ({_MOE_LAYER})"),
    **only_where({
        _L + "mlp.router.layer.weight": T(_B + "ffn_gate_inp.weight", "n_expert", "n_embd"),
        # megablocks' layout: every expert's rows stacked, (n_expert * n_ff, n_embd), for both matrices
        _L + "mlp.experts.mlp.w1": T(_B + "ffn_up_exps.weight", "n_expert", "n_ff", "n_embd"),
        _L + "mlp.experts.mlp.w2": T(_B + "ffn_down_exps.weight", "n_expert", "n_embd", "n_ff"),
    }, _MOE_LAYER),
}
_EXPERTS_BIAS = r"encoder\.layers\.\d+\.mlp\.experts\.bias"


class NomicBert(Architecture):
    name = "nomic-bert"
    hf_classes = ("NomicBertModel",)
    model_types = ("nomic_bert",)
    tokenizer_kind = None  # detected: WordPiece (v1, v1.5) or XLM-R's Unigram (v2-moe)
    tensor_names = {**_NOMIC, **_SWIGLU}
    ignored_tensors = (r"embeddings\.position_ids",)
    dim_names = ("n_token_types", "moe_every")
    moe = False

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        self.nomic_config = "n_embd" in c  # nomic's remote-code config, else transformers'
        act_key = "activation_function" if "activation_function" in c else "hidden_act"
        act = c.get_str(act_key, default="silu")
        reject(c, act not in (GELU if self.moe else ("swiglu", "silu")), f"{act_key} is {act!r}")
        if self.nomic_config:
            # what llama.cpp's graph does (its converter asserts the same); absent keys are nomic's defaults
            for key, expected in (("prenorm", False), ("causal", False), ("rotary_emb_interleaved", False),
                                  ("rotary_emb_fraction", 1.0), ("rotary_emb_scale_base", None),
                                  *(() if self.moe else (("mlp_fc1_bias", False), ("mlp_fc2_bias", False)))):
                value = c.get(key, default=expected)
                reject(c, value != expected, f"{key} is {value!r}")
        heads, embd = c.get_int("num_attention_heads", "n_head", min=1), c.get_int("hidden_size", "n_embd", min=1)
        self.head_dim = c.get_int("head_dim", default=embd // heads, min=1)
        reject(c, self.head_dim * heads != embd, f"head_dim {self.head_dim} times {heads} heads is not the width {embd}")
        self.rope = Rope(c, "rotary_emb_base")
        reject(c, self.rope.type != "default", f"rope_type is {self.rope.type!r}")
        self.sentence_transformers = sentence_transformers_folder(c, self.name)

    @classmethod
    def claims(cls, config: HFConfig) -> bool:
        return super().claims(config) and bool(config.get("moe_every_n_layers", default=0)) == cls.moe

    def dims(self) -> dict[str, Dim]:
        c = self.config
        return {"n_token_types": Dim(int(c.get_int("type_vocab_size", default=2, min=1)), "type_vocab_size"),
                "moe_every": Dim(int(c.get_int("moe_every_n_layers", default=0)), "moe_every_n_layers")}

    def context_length(self) -> int:
        """nomic's configs give the rope's reach (n_positions 8192) and the length trained on
        (max_trained_positions 2048): the second is the model's context, as llama.cpp writes it."""
        c = self.config
        if not self.nomic_config:
            return c.get_int("max_position_embeddings", default=2048, min=1)
        return min(c.get_int("n_positions", min=1), c.get_int("max_trained_positions", default=2048, min=1))

    def metadata(self) -> Metadata:
        c = self.config
        metadata = encoder_keys(self.name, self.sentence_transformers, blocks=c.get_int("num_hidden_layers", "n_layer", min=1),
                                context=self.context_length(), embd=c.get_int("hidden_size", "n_embd", min=1),
                                ff=c.get_int("intermediate_size", "n_inner", min=1),
                                heads=c.get_int("num_attention_heads", "n_head", min=1),
                                eps=c.get_float("layer_norm_eps", "layer_norm_epsilon", default=1e-12, min=0),
                                token_types=self.dims()["n_token_types"].value)
        keys = ArchKeys(metadata, self.name)
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.theta or 1000.0)  # NomicBertConfig's default
        # llama.cpp's default too (n_embd / n_head); written, as its converter writes them
        keys.u32(Keys.Attention.KEY_LENGTH, self.head_dim)
        keys.u32(Keys.Attention.VALUE_LENGTH, self.head_dim)
        return metadata


class NomicBertMoe(NomicBert):
    name = "nomic-bert-moe"
    tensor_names = {**_NOMIC, **_MOE}
    ignored_tensors = (r"embeddings\.position_ids", _EXPERTS_BIAS)  # see read_scalars
    moe = True

    def context_length(self) -> int:
        # v2-moe was trained on texts of up to 512 tokens (its sentence_bert_config max_seq_length),
        # which its config does not say; llama.cpp's converter writes 512 too.
        return min(super().context_length(), 512)

    def metadata(self) -> Metadata:
        c = self.config
        metadata = super().metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("num_experts", "num_local_experts", min=1))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("moe_top_k", max=int(c.get_int("num_experts", "num_local_experts"))))
        keys.u32(Keys.LLM.MOE_EVERY_N_LAYERS, c.get_int("moe_every_n_layers", min=1))
        return metadata

    def read_scalars(self, source: Mapping[str, LazyTensor]) -> None:
        """The experts' shared output bias: llama.cpp's graph has no such term (its converter drops
        it). Zero, as nomic initializes it, it changes nothing; otherwise one warning says how large."""
        super().read_scalars(source)
        largest = max((float(np.abs(t.load()).max()) for name, t in source.items()
                       if re.fullmatch(_EXPERTS_BIAS, name)), default=0.0)
        if largest:
            log.warning("%s: the experts' output bias (mlp.experts.bias, up to %.3g) is left out: llama.cpp's %s "
                        "graph has none, so its embeddings are not quite the model's",
                        self.config.path, largest, self.name)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if not name.endswith(("ffn_up_exps.weight", "ffn_down_exps.weight")):
            return tensor
        experts = int(self.config.get_int("num_experts", "num_local_experts", min=1))
        rows, embd = tensor.shape
        if rows % experts:
            raise ConversionError(f"{tensor.source}: {rows} rows do not split into num_experts = {experts} "
                                  "experts; config.json does not describe this checkpoint")
        stacked = tensor.reshape(experts, rows // experts, embd)
        if name.endswith("ffn_up_exps.weight"):
            return stacked
        # w2 holds each expert's down projection transposed (n_ff rows of n_embd)
        return stacked.map(lambda a: np.ascontiguousarray(a.transpose(0, 2, 1)), shape=(experts, embd, rows // experts))
