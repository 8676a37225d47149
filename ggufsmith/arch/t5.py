"""T5 (`T5ForConditionalGeneration`: llama.cpp's `t5`) and its encoder alone (`T5EncoderModel`,
sentence-T5 and the text encoders of image models: `t5encoder`).

llama.cpp's graphs: pre-norm blocks with RMS norms, attention without the 1/sqrt(head_dim) scale
(T5 folds it into the weights) plus a learned relative-position bias that only block 0 holds
(every block reuses it; llama.cpp computes the buckets with T5's max distance of 128), a feed-forward
that is ReLU (T5) or, when `ffn_gate` is present, gated GELU (T5 v1.1, flan-T5, `gated-gelu`).
The decoder adds cross-attention over the encoder's output. One token embedding is shared by
encoder and decoder (`shared.weight`; the per-stack `embed_tokens` copies are the same tensor).

The output head: a stored `lm_head.weight` is `output`. Without one, transformers multiplies the
decoder's output by d_model**-0.5 before the tied head unless config.json says the head is untied
(`tie_word_embeddings: false`, or transformers 5's `scale_decoder_outputs: false`; mT5 never scales);
llama.cpp has no such step and uses `token_embd` itself, so for that case we write `output` as the
shared embedding times d_model**-0.5 (llama.cpp's converter writes none: its logits are sqrt(d_model) times too large).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig, MappedTensor
from ggufsmith.arch.common import reject, sentence_transformers_folder
from ggufsmith.arch.encoder import pooling_key
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor

_MAX_DISTANCE = 128  # llama.cpp's relative-position buckets assume T5's (llama_relative_position_bucket)
_OUTPUT = "output.weight"


def _attention(hf: str, gguf: str, blocks: str, *, relative_bias: bool) -> dict[str, T]:
    table = {f"{hf}.{p}.weight": T(f"{gguf}_{g}.weight", "n_embd_qkv", "n_embd", blocks=blocks)
             for p, g in (("q", "q"), ("k", "k"), ("v", "v"))}
    table[f"{hf}.o.weight"] = T(f"{gguf}_o.weight", "n_embd", "n_embd_qkv", blocks=blocks)
    if relative_bias:  # only block 0 has it; llama.cpp loads it as optional in every block
        table[f"{hf}.relative_attention_bias.weight"] = T(f"{gguf}_rel_b.weight", "n_rel_buckets", "n_head",
                                                          optional=True, blocks=blocks)
    return table


def _feed_forward(hf: str, gguf: str, blocks: str) -> dict[str, T]:
    up = T(f"{gguf}.ffn_up.weight", "n_ff", "n_embd", blocks=blocks)
    return {f"{hf}.wi.weight": up, f"{hf}.wi_1.weight": up,  # ReLU's one input, gated GELU's linear half
            f"{hf}.wi_0.weight": T(f"{gguf}.ffn_gate.weight", "n_ff", "n_embd", optional=True, blocks=blocks),
            f"{hf}.wo.weight": T(f"{gguf}.ffn_down.weight", "n_embd", "n_ff", blocks=blocks)}


def _stack(side: str, blocks: str) -> dict[str, T]:
    """Encoder ("enc") or decoder ("dec") blocks: attention, [cross-attention,] feed-forward."""
    hf, gguf = f"{'encoder' if side == 'enc' else 'decoder'}.block.{{bid}}.layer.", f"{side}.blk.{{bid}}"
    ffn_layer = 1 if side == "enc" else 2
    table = {f"{hf}0.layer_norm.weight": T(f"{gguf}.attn_norm.weight", "n_embd", blocks=blocks),
             **_attention(f"{hf}0.SelfAttention", f"{gguf}.attn", blocks, relative_bias=True),
             f"{hf}{ffn_layer}.layer_norm.weight": T(f"{gguf}.ffn_norm.weight", "n_embd", blocks=blocks),
             **_feed_forward(f"{hf}{ffn_layer}.DenseReluDense", gguf, blocks),
             f"{side.replace('enc', 'encoder').replace('dec', 'decoder')}.final_layer_norm.weight":
                 T(f"{side}.output_norm.weight", "n_embd")}
    if side == "dec":
        table[f"{hf}1.layer_norm.weight"] = T(f"{gguf}.cross_attn_norm.weight", "n_embd", blocks=blocks)
        table.update(_attention(f"{hf}1.EncDecAttention", f"{gguf}.cross_attn", blocks, relative_bias=False))
    return table


class T5(Architecture):
    name = "t5"
    hf_classes = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration")
    model_types = ("t5", "mt5")
    tokenizer_kind = None  # T5's Unigram (spiece.model or tokenizer.json: "t5"); Pile-T5's SentencePiece BPE
    tensor_names = {
        "shared.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        **_stack("enc", "n_layer"),
        **_stack("dec", "n_dec_layer"),
        "lm_head.weight": T(_OUTPUT, "n_vocab", "n_embd", optional=True),
    }
    # The per-stack copies of the shared embedding (the same tensor, saved by some checkpoints).
    ignored_tensors = (r"(encoder|decoder)\.embed_tokens\.weight",)
    dim_names = ("n_embd_qkv", "n_rel_buckets", "n_dec_layer")
    config_defaults = {"d_kv": 64, "num_heads": 8, "relative_attention_num_buckets": 32,
                       "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
                       "feed_forward_proj": "relu", "n_positions": 512}
    has_decoder = True

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        projection = c.get_str("feed_forward_proj")
        reject(c, projection not in ("relu", "gated-gelu"),
               f"feed_forward_proj is {projection!r} (llama.cpp runs 'relu', or 'gated-gelu' when ffn_gate is present)")
        reject(c, c.get_int("relative_attention_max_distance") != _MAX_DISTANCE,
               f"relative_attention_max_distance is {c.get_int('relative_attention_max_distance')} (not {_MAX_DISTANCE})")
        # llama.cpp sizes its per-layer settings by the encoder's depth and fails to load a deeper decoder.
        reject(c, self.has_decoder and self.dims()["n_dec_layer"] > c.get_int("num_layers", min=1),
               f"num_decoder_layers ({self.dims()['n_dec_layer']}) is larger than num_layers ({c.get_int('num_layers')})")
        self.sentence_transformers = sentence_transformers_folder(c, self.name)

    def dims(self) -> dict[str, int]:
        c = self.config
        layers = c.get_int("num_layers", min=1)
        return {"n_embd_qkv": c.get_int("num_heads", min=1) * c.get_int("d_kv", min=1),
                "n_rel_buckets": c.get_int("relative_attention_num_buckets", min=1),
                "n_dec_layer": c.get_int("num_decoder_layers", default=layers, min=1) if self.has_decoder else 0}

    def metadata(self) -> Metadata:
        c = self.config
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("n_positions", min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get_int("d_model", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("d_ff", min=1))
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_layers", min=1))
        if self.has_decoder:
            keys.u32(Keys.LLM.DECODER_BLOCK_COUNT, self.dims()["n_dec_layer"])
        keys.u32(Keys.Attention.HEAD_COUNT, c.get_int("num_heads", min=1))
        keys.u32(Keys.Attention.KEY_LENGTH, c.get_int("d_kv", min=1))
        keys.u32(Keys.Attention.VALUE_LENGTH, c.get_int("d_kv", min=1))
        eps = c.get_float("layer_norm_epsilon", min=0)
        keys.f32(Keys.Attention.LAYERNORM_EPS, eps)  # written as llama.cpp's converter does; the graph reads the RMS one
        keys.u32(Keys.Attention.REL_BUCKETS_COUNT, c.get_int("relative_attention_num_buckets", min=1))
        keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, eps)
        if self.has_decoder:
            keys.u32(Keys.LLM.DECODER_START_TOKEN_ID, c.get_int("decoder_start_token_id", default=0))
        else:
            # llama.cpp's default is causal: without this key its t5encoder embeddings mask every later
            # token (measured: 3 standard deviations off transformers' on the test model).
            keys.bool(Keys.Attention.CAUSAL, False)
            pooling_key(keys, self.sentence_transformers)
        return metadata

    def _scaled_tied_head(self) -> bool:
        c = self.config
        if c.model_type == "mt5" or "MT5ForConditionalGeneration" in self.checkpoint_config.architectures:
            return False  # mT5 is T5 v1.1: transformers' MT5 model never scales (its config says tied regardless)
        return (c.get_bool("tie_word_embeddings", default=True) is not False
                and c.get_bool("scale_decoder_outputs", default=True) is not False)

    def map_tensors(self, source: Mapping[str, LazyTensor]) -> list[MappedTensor]:
        mapped = super().map_tensors(source)
        if not self.has_decoder or any(m.name == _OUTPUT for m in mapped) or not self._scaled_tied_head():
            return mapped
        embedding = next(m for m in mapped if m.name == "token_embd.weight")
        scale = np.float32(self.config.get_int("d_model", min=1) ** -0.5)
        head = embedding.tensor.map(lambda rows: rows.astype(np.float32) * scale, dtype="F32")
        return [*mapped, MappedTensor(_OUTPUT, embedding.sources, head)]


class T5Encoder(T5):
    name = "t5encoder"
    hf_classes = ("T5EncoderModel",)
    model_types = ()  # a T5 config names model_type "t5": the class decides
    tensor_names = {
        "shared.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        **_stack("enc", "n_layer"),
    }
    has_decoder = False
