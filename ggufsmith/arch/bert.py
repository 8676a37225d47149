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
CamemBERT (`CamembertModel`) is RoBERTa with a SentencePiece Unigram tokenizer, as XLM-RoBERTa.
DistilBERT (`DistilBertModel`, `DistilBertForMaskedLM`) is BERT's graph under names and config keys
of its own, without token types and with the layer-norm epsilon fixed at 1e-12; its MaskedLM head
(`vocab_*`) is left out. Every other tensor is stored as HF stores it.

Classifiers and rerankers (`*ForSequenceClassification`: cross-encoder/ms-marco-MiniLM,
bge-reranker) run through llama.cpp's rank pooling ({arch}.pooling_type = rank, written here so the
file scores without --pooling rank): the CLS token's state, `cls` (a dense layer) and tanh, then
`cls.output` (one row per label). BERT's head is its pooler (dense + tanh over the CLS token) and a
`classifier` layer; RoBERTa's is `classifier.dense` + tanh and `classifier.out_proj`. llama.cpp
gives every label's logit ({arch}.classifier.output_labels names them, one per row); softmax or
sigmoid over them is the caller's, as with transformers' logits.
"""

from __future__ import annotations

import logging

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import reject, sentence_transformers_folder
from ggufsmith.arch.tensors import Dim, T
from ggufsmith.constants import GGUFValueType, Keys, PoolingType, arch_key
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.sentence_transformers import SentenceTransformersFolder

log = logging.getLogger(__name__)

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
BLOCK = "blk.{bid}."
_NAMES = {
    "embeddings.word_embeddings.weight": T("token_embd.weight", "n_vocab", "n_embd"),
    "embeddings.position_embeddings.weight": T("position_embd.weight", "n_ctx", "n_embd"),
    "embeddings.token_type_embeddings.weight": T("token_types.weight", "n_token_types", "n_embd", optional=True),
    **layer_norm("embeddings.LayerNorm", "token_embd_norm"),
    **linear(_LAYER + "attention.self.query", BLOCK + "attn_q", "n_embd", "n_embd"),
    **linear(_LAYER + "attention.self.key", BLOCK + "attn_k", "n_embd", "n_embd"),
    **linear(_LAYER + "attention.self.value", BLOCK + "attn_v", "n_embd", "n_embd"),
    **linear(_LAYER + "attention.output.dense", BLOCK + "attn_output", "n_embd", "n_embd"),
    **layer_norm(_LAYER + "attention.output.LayerNorm", BLOCK + "attn_output_norm"),
    **linear(_LAYER + "intermediate.dense", BLOCK + "ffn_up", "n_ff", "n_embd"),
    **linear(_LAYER + "output.dense", BLOCK + "ffn_down", "n_embd", "n_ff"),
    **layer_norm(_LAYER + "output.LayerNorm", BLOCK + "layer_output_norm"),
}


# The classification heads, only in *ForSequenceClassification models (n_cls_out: their label count).
_HEAD = "n_cls_out > 0"
_OUTPUT = {"weight": T("cls.output.weight", "n_cls_out", "n_embd", when=_HEAD),
           "bias": T("cls.output.bias", "n_cls_out", when=_HEAD)}
_BERT_HEAD = {  # BERT's pooler (dense + tanh over the CLS token), then `classifier`
    "bert.pooler.dense.weight": T("cls.weight", "n_embd", "n_embd", when=_HEAD),
    "bert.pooler.dense.bias": T("cls.bias", "n_embd", when=_HEAD),
    "classifier.weight": _OUTPUT["weight"], "classifier.bias": _OUTPUT["bias"],
}
_ROBERTA_HEAD = {  # RoBERTa's classifier.dense + tanh, then classifier.out_proj
    "classifier.dense.weight": T("cls.weight", "n_embd", "n_embd", when=_HEAD),
    "classifier.dense.bias": T("cls.bias", "n_embd", when=_HEAD),
    "classifier.out_proj.weight": _OUTPUT["weight"], "classifier.out_proj.bias": _OUTPUT["bias"],
}
_CLASSIFIERS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
                "XLMRobertaForSequenceClassification")

# DistilBERT: BERT's graph under its own names, without token types (`distilbert.` before the encoder
# of its MaskedLM and classifier models).
_DISTIL_LAYER = "transformer.layer.{bid}."
_DISTILBERT_NAMES = {
    "embeddings.word_embeddings.weight": _NAMES["embeddings.word_embeddings.weight"],
    "embeddings.position_embeddings.weight": _NAMES["embeddings.position_embeddings.weight"],
    **layer_norm("embeddings.LayerNorm", "token_embd_norm"),
    **linear(_DISTIL_LAYER + "attention.q_lin", BLOCK + "attn_q", "n_embd", "n_embd"),
    **linear(_DISTIL_LAYER + "attention.k_lin", BLOCK + "attn_k", "n_embd", "n_embd"),
    **linear(_DISTIL_LAYER + "attention.v_lin", BLOCK + "attn_v", "n_embd", "n_embd"),
    **linear(_DISTIL_LAYER + "attention.out_lin", BLOCK + "attn_output", "n_embd", "n_embd"),
    **layer_norm(_DISTIL_LAYER + "sa_layer_norm", BLOCK + "attn_output_norm"),
    **linear(_DISTIL_LAYER + "ffn.lin1", BLOCK + "ffn_up", "n_ff", "n_embd"),
    **linear(_DISTIL_LAYER + "ffn.lin2", BLOCK + "ffn_down", "n_embd", "n_ff"),
    **layer_norm(_DISTIL_LAYER + "output_layer_norm", BLOCK + "layer_output_norm"),
}
_DISTILBERT_CLASSES = ("DistilBertModel", "DistilBertForMaskedLM", "DistilBertForSequenceClassification")
# config.json's names of what llama.cpp reads: BERT's (RoBERTa's, CamemBERT's), and DistilBERT's own
# (it fixes the layer-norm epsilon at 1e-12 and has no token types).
_BERT_CONFIG = {"layers": "num_hidden_layers", "embd": "hidden_size", "heads": "num_attention_heads",
                "ff": "intermediate_size", "act": "hidden_act"}
_DISTILBERT_CONFIG = {"layers": "n_layers", "embd": "dim", "heads": "n_heads", "ff": "hidden_dim", "act": "activation"}


def output_labels(config: HFConfig) -> list[str]:
    """A classifier's labels in id order, from config.json's id2label (transformers' default when
    absent: LABEL_0, LABEL_1)."""
    id2label = config.get_dict("id2label", default={"0": "LABEL_0", "1": "LABEL_1"})
    ids = sorted(id2label, key=lambda k: int(k) if str(k).isdigit() else -1)
    if [str(k) for k in ids] != [str(i) for i in range(len(ids))] or not ids or not all(
            isinstance(v, str) for v in id2label.values()):
        raise ConversionError(f"{config.path}: id2label must map each id from 0 to its label name (found keys "
                              f"{list(id2label)[:5]}); it names the classifier's output rows")
    return [id2label[k] for k in ids]


def is_jina_v3(config: HFConfig) -> bool:
    """jina-embeddings-v3 as jina publishes it for its own code: an XLMRobertaModel config with
    rotary positions and task adapters, which the jina-bert-v3 plugin converts."""
    return "XLMRobertaModel" in config.architectures and (
        "lora_adaptations" in config or config.get("position_embedding_type", default=None) == "rotary")


def encoder_keys(arch: str, folder: SentenceTransformersFolder | None, *, blocks: int,
                 context: int, embd: int, ff: int, heads: int, eps: float, token_types: int,
                 pooling: PoolingType | None = None) -> Metadata:
    """The keys llama.cpp's bert-family encoders read (nomic-bert's too): sizes, the layer-norm
    epsilon, bidirectional attention, the pooling (`pooling`, else the sentence-transformers
    folder's), the token-type count."""
    metadata = Metadata()
    keys = ArchKeys(metadata, arch)
    keys.u32(Keys.LLM.BLOCK_COUNT, blocks)
    keys.u32(Keys.LLM.CONTEXT_LENGTH, context)
    keys.u32(Keys.LLM.EMBEDDING_LENGTH, embd)
    keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, ff)
    keys.u32(Keys.Attention.HEAD_COUNT, heads)
    keys.f32(Keys.Attention.LAYERNORM_EPS, eps)
    keys.bool(Keys.Attention.CAUSAL, False)
    pooling = pooling or (folder.pooling if folder else None)
    keys.u32(Keys.LLM.POOLING_TYPE, None if pooling is None else int(pooling))
    # A model key under the tokenizer's name: llama.cpp refuses a bert-family file without it.
    metadata.add_uint32(Keys.Tokenizer.TOKEN_TYPE_COUNT, token_types)
    return metadata


class Bert(Architecture):
    name = "bert"
    hf_classes = ("BertModel", "BertForMaskedLM", "RobertaModel", "XLMRobertaModel", "CamembertModel", *_CLASSIFIERS,
                  *_DISTILBERT_CLASSES)
    model_types = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert")
    tokenizer_kind = "bert"  # WordPiece: tokenizer.json or vocab.txt (RoBERTa: see __init__)
    # BertForMaskedLM prefixes the encoder with "bert." (RoBERTa's heads with "roberta."); BertModel
    # and sentence-transformers folders do not.
    encoder_names = {f"{prefix}{hf}": entry for prefix in ("bert.", "roberta.", "") for hf, entry in _NAMES.items()}
    tensor_names = {**encoder_names, **_BERT_HEAD, **_ROBERTA_HEAD}  # a classifier has its family's head only
    ignored_tensors = (
        r"((bert|roberta)\.)?embeddings\.position_ids",  # a buffer (0, 1, 2, ...), not a weight
        r"((bert|roberta)\.)?pooler\.dense\.(weight|bias)",  # the pooler: not part of the embeddings
        r"cls\.predictions\..*",  # BertForMaskedLM's language-model head
    )
    dim_names = ("n_token_types", "n_cls_out")
    # BertConfig's defaults, for config.json files that leave them out.
    config_defaults = {"type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
                       "position_embedding_type": "absolute"}
    position_embedding = "absolute"  # the position_embedding_type llama.cpp's graph for this arch has

    @classmethod
    def claims(cls, config: HFConfig) -> bool:
        return super().claims(config) and not is_jina_v3(config)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        self.distilbert = c.model_type == "distilbert" or any(a in _DISTILBERT_CLASSES for a in c.architectures)
        self.config_names = _DISTILBERT_CONFIG if self.distilbert else _BERT_CONFIG
        act = self.config_names["act"]
        reject(c, c.get_str(act) not in GELU, f"{act} is {c.get_str(act)!r} (not GELU)")
        reject(c, "DistilBertForSequenceClassification" in c.architectures,
               "DistilBertForSequenceClassification's head applies ReLU after pre_classifier (llama.cpp's rank "
               "pooling applies tanh there: the scores would be wrong)")
        reject(c, c.get_str("position_embedding_type") != self.position_embedding,
               f"position_embedding_type is {c.get_str('position_embedding_type')!r} (not {self.position_embedding})")
        reject(c, c.get_bool("is_decoder", default=False), "is_decoder is set (causal attention)")
        # XLM-RoBERTa (BGE-M3, multilingual-e5) is RoBERTa with a SentencePiece Unigram tokenizer.
        # CamemBERT is RoBERTa with a SentencePiece Unigram tokenizer too.
        roberta = c.model_type in ("roberta", "xlm-roberta", "camembert", "jina_embeddings_v3") or any(
            name in self.checkpoint_config.architectures for name in ("RobertaModel", "XLMRobertaModel", "CamembertModel"))
        # RoBERTa numbers positions from pad_token_id + 1 (RobertaConfig's default padding id is 1).
        self.position_offset = c.get_int("pad_token_id", default=1) + 1 if roberta else 0
        if roberta:
            # detected: RoBERTa's byte-level BPE (tokenizer.json, or vocab.json + merges.txt), XLM-R's Unigram
            self.tokenizer_kind = None
            if self.position_offset >= c.get_int("max_position_embeddings", min=1):
                raise ConversionError(f"{c.label}: pad_token_id = {self.position_offset - 1} leaves no position: "
                                      "RoBERTa numbers positions from pad_token_id + 1, and max_position_embeddings "
                                      f"is {c.get_int('max_position_embeddings')}")
        if self.distilbert:  # DistilBertForMaskedLM's head is vocab_transform, vocab_layer_norm, vocab_projector
            self.tensor_names = {f"{prefix}{hf}": entry for prefix in ("distilbert.", "") for hf, entry in
                                 _DISTILBERT_NAMES.items()}
            self.ignored_tensors = (r"(distilbert\.)?embeddings\.position_ids", r"vocab_(transform|layer_norm|projector)\..*")
        self.sentence_transformers = sentence_transformers_folder(c, self.name)
        self.labels = output_labels(c) if any(name in _CLASSIFIERS for name in c.architectures) else []
        if self.labels:  # BERT's pooler is its classification head's first layer
            self.ignored_tensors = tuple(p for p in self.ignored_tensors if "pooler" not in p)
            self.tensor_names = {**self.encoder_names, **(_ROBERTA_HEAD if roberta else _BERT_HEAD)}
            if not roberta and self.dims()["n_token_types"].value > 1:
                log.warning("%s: llama.cpp gives every token of a pair token type 0, where transformers gives the "
                            "second text type 1: this reranker's scores will differ from transformers' by what its "
                            "two token_type_embeddings rows differ", c.label)

    def dims(self) -> dict[str, Dim]:
        if self.distilbert:  # no token types; llama.cpp needs a count, and 1 is what its converter writes
            token_types = Dim(1, "DistilBERT has no token types")
        else:
            count = self.config.get_int("type_vocab_size", min=1)
            token_types = Dim(int(count), count.origin)
        return {"n_token_types": token_types, "n_cls_out": Dim(len(self.labels), "id2label")}

    def metadata(self) -> Metadata:
        c, names = self.config, self.config_names
        pooling = PoolingType.RANK if self.labels else None  # a classification head runs in rank pooling only
        metadata = encoder_keys(self.name, self.sentence_transformers, pooling=pooling,
                                blocks=c.get_int(names["layers"], min=1),
                                context=c.get_int("max_position_embeddings", min=1) - self.position_offset,
                                embd=c.get_int(names["embd"], min=1), ff=c.get_int(names["ff"], min=1),
                                heads=c.get_int(names["heads"], min=1),
                                eps=1e-12 if self.distilbert else c.get_float("layer_norm_eps", min=0),
                                token_types=self.dims()["n_token_types"].value)
        if self.labels:
            metadata.add_array(arch_key(Keys.LLM.CLASSIFIER_OUTPUT_LABELS, self.name), self.labels,
                               GGUFValueType.STRING)
        return metadata

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name == "position_embd.weight" and self.position_offset:
            offset = self.position_offset  # rows of the positions RoBERTa never gives a token of a text
            return tensor.map(lambda rows: rows[offset:], shape=(tensor.shape[0] - offset, *tensor.shape[1:]))
        return tensor
