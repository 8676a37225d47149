"""BERT encoders (`BertModel`, `BertForMaskedLM`) and the sentence-transformers models built on them
(all-MiniLM, BGE, E5, GTE ...), for llama.cpp's embedding tools.

llama.cpp's bert graph: token + token-type (row 0: every token is "sentence A") + absolute
position embeddings, a layer norm, then post-norm blocks (attention, add, norm; GELU MLP, add,
norm) with bidirectional attention, and the pooling the file names ({arch}.pooling_type, from the
sentence-transformers Pooling module). It has no language-model head: BertForMaskedLM's
prediction head (`cls.predictions.*`) and BertModel's pooler (a dense layer over the CLS token,
which sentence-transformers does not use) are left out, as llama.cpp's converter leaves them.
RoBERTa (`RobertaModel`) is the same graph: its position ids start after the padding id
(pad_token_id + 1, for the tokens of an unpadded text), so the rows before are cut off and the
context is that much shorter, as llama.cpp's converter does; its tokenizer is a byte-level BPE.
Every other tensor is stored as HF stores it.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import reject, sentence_transformers_folder
from ggufsmith.arch.tensors import Dim, T
from ggufsmith.constants import Keys
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.sentence_transformers import SentenceTransformersFolder

# Activations computed the way llama.cpp's GELU computes them (the erf form and its tanh
# approximation differ by less than the float16 table llama.cpp evaluates GELU through).
GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_python")


def layer_norm(hf: str, gguf: str) -> dict[str, T]:
    """A LayerNorm under both names checkpoints use: weight/bias, and TF-era gamma/beta."""
    weight, bias = T(f"{gguf}.weight", "n_embd"), T(f"{gguf}.bias", "n_embd")
    return {f"{hf}.weight": weight, f"{hf}.bias": bias, f"{hf}.gamma": weight, f"{hf}.beta": bias}


def linear(hf: str, gguf: str, rows: str, columns: str) -> dict[str, T]:
    """A dense layer; llama.cpp loads every bert-family bias as optional."""
    return {f"{hf}.weight": T(f"{gguf}.weight", rows, columns), f"{hf}.bias": T(f"{gguf}.bias", rows, optional=True)}


_LAYER = "encoder.layer.{bid}."
_BLOCK = "blk.{bid}."
_NAMES = {
    "embeddings.word_embeddings.weight": T("token_embd.weight", "n_vocab", "n_embd"),
    "embeddings.position_embeddings.weight": T("position_embd.weight", "n_ctx", "n_embd"),
    "embeddings.token_type_embeddings.weight": T("token_types.weight", "n_token_types", "n_embd", optional=True),
    **layer_norm("embeddings.LayerNorm", "token_embd_norm"),
    **linear(_LAYER + "attention.self.query", _BLOCK + "attn_q", "n_embd", "n_embd"),
    **linear(_LAYER + "attention.self.key", _BLOCK + "attn_k", "n_embd", "n_embd"),
    **linear(_LAYER + "attention.self.value", _BLOCK + "attn_v", "n_embd", "n_embd"),
    **linear(_LAYER + "attention.output.dense", _BLOCK + "attn_output", "n_embd", "n_embd"),
    **layer_norm(_LAYER + "attention.output.LayerNorm", _BLOCK + "attn_output_norm"),
    **linear(_LAYER + "intermediate.dense", _BLOCK + "ffn_up", "n_ff", "n_embd"),
    **linear(_LAYER + "output.dense", _BLOCK + "ffn_down", "n_embd", "n_ff"),
    **layer_norm(_LAYER + "output.LayerNorm", _BLOCK + "layer_output_norm"),
}


def encoder_keys(arch: str, folder: SentenceTransformersFolder | None, *, blocks: int,
                 context: int, embd: int, ff: int, heads: int, eps: float, token_types: int) -> Metadata:
    """The keys llama.cpp's bert-family encoders read (nomic-bert's too): sizes, the layer-norm
    epsilon, bidirectional attention, the sentence-transformers pooling, the token-type count."""
    metadata = Metadata()
    keys = ArchKeys(metadata, arch)
    keys.u32(Keys.LLM.BLOCK_COUNT, blocks)
    keys.u32(Keys.LLM.CONTEXT_LENGTH, context)
    keys.u32(Keys.LLM.EMBEDDING_LENGTH, embd)
    keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, ff)
    keys.u32(Keys.Attention.HEAD_COUNT, heads)
    keys.f32(Keys.Attention.LAYERNORM_EPS, eps)
    keys.bool(Keys.Attention.CAUSAL, False)
    pooling = folder.pooling if folder else None
    keys.u32(Keys.LLM.POOLING_TYPE, None if pooling is None else int(pooling))
    # A model key under the tokenizer's name: llama.cpp refuses a bert-family file without it.
    metadata.add_uint32(Keys.Tokenizer.TOKEN_TYPE_COUNT, token_types)
    return metadata


class Bert(Architecture):
    name = "bert"
    hf_classes = ("BertModel", "BertForMaskedLM", "RobertaModel", "XLMRobertaModel")
    model_types = ("bert", "roberta", "xlm-roberta")
    tokenizer_kind = "bert"  # WordPiece: tokenizer.json or vocab.txt (RoBERTa: see __init__)
    # BertForMaskedLM prefixes the encoder with "bert." (RoBERTa's heads with "roberta."); BertModel
    # and sentence-transformers folders do not.
    tensor_names = {**{f"{prefix}{hf}": entry for prefix in ("bert.", "roberta.", "") for hf, entry in _NAMES.items()}}
    ignored_tensors = (
        r"((bert|roberta)\.)?embeddings\.position_ids",  # a buffer (0, 1, 2, ...), not a weight
        r"((bert|roberta)\.)?pooler\.dense\.(weight|bias)",  # the pooler: not part of the embeddings
        r"cls\.predictions\..*",  # BertForMaskedLM's language-model head
    )
    dim_names = ("n_token_types",)
    # BertConfig's defaults, for config.json files that leave them out.
    config_defaults = {"type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
                       "position_embedding_type": "absolute"}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject(c, c.get_str("hidden_act") not in GELU, f"hidden_act is {c.get_str('hidden_act')!r} (not GELU)")
        reject(c, c.get_str("position_embedding_type") != "absolute",
               f"position_embedding_type is {c.get_str('position_embedding_type')!r} (not absolute)")
        reject(c, c.get_bool("is_decoder", default=False), "is_decoder is set (causal attention)")
        # XLM-RoBERTa (BGE-M3, multilingual-e5) is RoBERTa with a SentencePiece Unigram tokenizer.
        roberta = c.model_type in ("roberta", "xlm-roberta") or any(
            name in self.checkpoint_config.architectures for name in ("RobertaModel", "XLMRobertaModel"))
        # RoBERTa numbers positions from pad_token_id + 1 (RobertaConfig's default padding id is 1).
        self.position_offset = c.get_int("pad_token_id", default=1) + 1 if roberta else 0
        if roberta:
            # detected: RoBERTa's byte-level BPE (tokenizer.json, or vocab.json + merges.txt), XLM-R's Unigram
            self.tokenizer_kind = None
            if self.position_offset >= c.get_int("max_position_embeddings", min=1):
                raise ConversionError(f"{c.label}: pad_token_id = {self.position_offset - 1} leaves no position: "
                                      "RoBERTa numbers positions from pad_token_id + 1, and max_position_embeddings "
                                      f"is {c.get_int('max_position_embeddings')}")
        self.sentence_transformers = sentence_transformers_folder(c, self.name)

    def dims(self) -> dict[str, Dim]:
        count = self.config.get_int("type_vocab_size", min=1)
        return {"n_token_types": Dim(int(count), count.origin)}

    def metadata(self) -> Metadata:
        c = self.config
        return encoder_keys(self.name, self.sentence_transformers,
                            blocks=c.get_int("num_hidden_layers", min=1),
                            context=c.get_int("max_position_embeddings", min=1) - self.position_offset,
                            embd=c.get_int("hidden_size", min=1), ff=c.get_int("intermediate_size", min=1),
                            heads=c.get_int("num_attention_heads", min=1), eps=c.get_float("layer_norm_eps", min=0),
                            token_types=self.dims()["n_token_types"].value)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name == "position_embd.weight" and self.position_offset:
            offset = self.position_offset  # rows of the positions RoBERTa never gives a token of a text
            return tensor.map(lambda rows: rows[offset:], shape=(tensor.shape[0] - offset, *tensor.shape[1:]))
        return tensor
