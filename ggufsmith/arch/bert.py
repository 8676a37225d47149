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

from ggufsmith.arch.base import Architecture, HFConfig
from ggufsmith.arch.common import reject, sentence_transformers_folder
from ggufsmith.arch.encoder import (
    GELU, bert_attention, bert_embeddings, bert_mlp, classifier_head, encoder_keys, output_labels,
    output_labels_key, with_prefixes,
)
from ggufsmith.arch.tensors import Dim
from ggufsmith.constants import PoolingType
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor

log = logging.getLogger(__name__)

_LAYER = "encoder.layer.{bid}."
_NAMES = {
    **bert_embeddings("embeddings.LayerNorm", positions=True),
    **bert_attention(_LAYER, ("attention.self.query", "attention.self.key", "attention.self.value"),
                     "attention.output.dense", "attention.output.LayerNorm"),
    **bert_mlp(_LAYER, "intermediate.dense", "output.dense", "output.LayerNorm"),
}
# The classification heads, only in *ForSequenceClassification models. BERT's: its pooler (dense +
# tanh over the CLS token), then `classifier`; RoBERTa's: classifier.dense + tanh, then classifier.out_proj.
_BERT_HEAD = classifier_head("bert.pooler.dense", "classifier")
_ROBERTA_HEAD = classifier_head("classifier.dense", "classifier.out_proj")
_CLASSIFIERS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
                "XLMRobertaForSequenceClassification")

# DistilBERT: BERT's graph under its own names, without token types (`distilbert.` before the encoder
# of its MaskedLM and classifier models).
_DISTIL_LAYER = "transformer.layer.{bid}."
_DISTILBERT_NAMES = {
    **bert_embeddings("embeddings.LayerNorm", positions=True, token_types=False),
    **bert_attention(_DISTIL_LAYER, ("attention.q_lin", "attention.k_lin", "attention.v_lin"), "attention.out_lin",
                     "sa_layer_norm"),
    **bert_mlp(_DISTIL_LAYER, "ffn.lin1", "ffn.lin2", "output_layer_norm"),
}
_DISTILBERT_CLASSES = ("DistilBertModel", "DistilBertForMaskedLM", "DistilBertForSequenceClassification")
# config.json's names of what llama.cpp reads: BERT's (RoBERTa's, CamemBERT's), and DistilBERT's own
# (it fixes the layer-norm epsilon at 1e-12 and has no token types).
_BERT_CONFIG = {"layers": "num_hidden_layers", "embd": "hidden_size", "heads": "num_attention_heads",
                "ff": "intermediate_size", "act": "hidden_act"}
_DISTILBERT_CONFIG = {"layers": "n_layers", "embd": "dim", "heads": "n_heads", "ff": "hidden_dim", "act": "activation"}


def is_jina_v3(config: HFConfig) -> bool:
    """jina-embeddings-v3 as jina publishes it for its own code: an XLMRobertaModel config with
    rotary positions and task adapters, which the jina-bert-v3 plugin converts."""
    return "XLMRobertaModel" in config.architectures and (
        "lora_adaptations" in config or config.get("position_embedding_type", default=None) == "rotary")


class Bert(Architecture):
    name = "bert"
    hf_classes = ("BertModel", "BertForMaskedLM", "RobertaModel", "XLMRobertaModel", "CamembertModel", *_CLASSIFIERS,
                  *_DISTILBERT_CLASSES)
    model_types = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert")
    tokenizer_kind = "bert"  # WordPiece: tokenizer.json or vocab.txt (RoBERTa: see __init__)
    # BertForMaskedLM prefixes the encoder with "bert." (RoBERTa's heads with "roberta."); BertModel
    # and sentence-transformers folders do not.
    encoder_names = with_prefixes(_NAMES, "bert.", "roberta.", "")
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
            self.tensor_names = with_prefixes(_DISTILBERT_NAMES, "distilbert.", "")
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
        output_labels_key(metadata, self.name, self.labels)
        return metadata

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name == "position_embd.weight" and self.position_offset:
            offset = self.position_offset  # rows of the positions RoBERTa never gives a token of a text
            return tensor.map(lambda rows: rows[offset:], shape=(tensor.shape[0] - offset, *tensor.shape[1:]))
        return tensor
