"""What the bidirectional encoders share: the bert-family tensor tables (BERT, DistilBERT, nomic-bert,
jina-bert-v3), the keys of llama.cpp's bert-family graphs, the pooling key every embedding model
writes, and the classification heads llama.cpp runs through rank pooling.

llama.cpp's bert-family block is post-norm: attention (q, k, v or one fused qkv), its output
projection, a layer norm over the residual sum (attn_output_norm); the MLP (ffn_up, ffn_down), a
layer norm over its residual sum (layer_output_norm). The checkpoints differ only in the names.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.tensors import T
from ggufsmith.constants import GGUFValueType, Keys, PoolingType, arch_key
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.sentence_transformers import SentenceTransformersFolder

# Activations computed the way llama.cpp's GELU computes them (the erf form and its tanh
# approximation differ by less than the float16 table llama.cpp evaluates GELU through).
GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_python")
BLOCK = "blk.{bid}."


def layer_norm(hf: str, gguf: str) -> dict[str, T]:
    """A LayerNorm under both names checkpoints use: weight/bias, and TF-era gamma/beta."""
    weight, bias = T(f"{gguf}.weight", "n_embd"), T(f"{gguf}.bias", "n_embd")
    return {f"{hf}.weight": weight, f"{hf}.bias": bias, f"{hf}.gamma": weight, f"{hf}.beta": bias}


def linear(hf: str, gguf: str, rows: str, columns: str) -> dict[str, T]:
    """A dense layer; llama.cpp loads every bert-family bias as optional."""
    return {f"{hf}.weight": T(f"{gguf}.weight", rows, columns), f"{hf}.bias": T(f"{gguf}.bias", rows, optional=True)}


def with_prefixes(table: dict[str, T], *prefixes: str) -> dict[str, T]:
    """The table under each HF prefix a checkpoint may put before it (a task head's "bert.", ...)."""
    return {f"{prefix}{hf}": entry for prefix in prefixes for hf, entry in table.items()}


def bert_embeddings(norm: str, *, positions: bool = False, token_types: bool = True) -> dict[str, T]:
    """Token embeddings, the position table (absolute positions only), the token-type table (its row
    0 added to every token; optional in llama.cpp), and their layer norm, named `norm` in the checkpoint."""
    table = {"embeddings.word_embeddings.weight": T("token_embd.weight", "n_vocab", "n_embd")}
    if positions:
        table["embeddings.position_embeddings.weight"] = T("position_embd.weight", "n_ctx", "n_embd")
    if token_types:
        table["embeddings.token_type_embeddings.weight"] = T("token_types.weight", "n_token_types", "n_embd",
                                                             optional=True)
    return {**table, **layer_norm(norm, "token_embd_norm")}


def bert_attention(layer: str, qkv: str | tuple[str, str, str], output: str, norm: str,
                   qkv_rows: str = "3 * n_embd") -> dict[str, T]:
    """A post-norm block's attention: `qkv` the checkpoint's q, k and v layers, or its one fused layer
    (rows q, k, v: llama.cpp's attn_qkv as stored), `output` its projection, `norm` the layer norm after."""
    if isinstance(qkv, str):
        projections = linear(layer + qkv, BLOCK + "attn_qkv", qkv_rows, "n_embd")
    else:
        projections = {hf: spec for name, gguf in zip(qkv, ("attn_q", "attn_k", "attn_v"))
                       for hf, spec in linear(layer + name, BLOCK + gguf, "n_embd", "n_embd").items()}
    return {**projections, **linear(layer + output, BLOCK + "attn_output", "n_embd", "n_embd"),
            **layer_norm(layer + norm, BLOCK + "attn_output_norm")}


def bert_mlp(layer: str, up: str, down: str, norm: str | None = None) -> dict[str, T]:
    """A post-norm block's GELU MLP and `norm`, the layer norm after it (None: named apart, where the
    MLP is not the same in every block)."""
    table = {**linear(layer + up, BLOCK + "ffn_up", "n_ff", "n_embd"),
             **linear(layer + down, BLOCK + "ffn_down", "n_embd", "n_ff")}
    return {**table, **layer_norm(layer + norm, BLOCK + "layer_output_norm")} if norm else table


def pooling_key(keys: ArchKeys, folder: SentenceTransformersFolder | None, pooling: PoolingType | None = None) -> None:
    """{arch}.pooling_type: `pooling`, else the sentence-transformers Pooling module's (none: not written)."""
    pooling = pooling or (folder.pooling if folder else None)
    keys.u32(Keys.LLM.POOLING_TYPE, None if pooling is None else int(pooling))


def encoder_keys(arch: str, folder: SentenceTransformersFolder | None, *, blocks: int, context: int, embd: int,
                 ff: int, heads: int, eps: float, token_types: int | None,
                 pooling: PoolingType | None = None) -> Metadata:
    """The keys llama.cpp's bert-family encoders read (nomic-bert's, modern-bert's too): sizes, the
    layer-norm epsilon, bidirectional attention, the pooling (`pooling`, else the sentence-transformers
    folder's), the token-type count (None: the graph has no token types)."""
    metadata = Metadata()
    keys = ArchKeys(metadata, arch)
    keys.u32(Keys.LLM.BLOCK_COUNT, blocks)
    keys.u32(Keys.LLM.CONTEXT_LENGTH, context)
    keys.u32(Keys.LLM.EMBEDDING_LENGTH, embd)
    keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, ff)
    keys.u32(Keys.Attention.HEAD_COUNT, heads)
    keys.f32(Keys.Attention.LAYERNORM_EPS, eps)
    keys.bool(Keys.Attention.CAUSAL, False)
    pooling_key(keys, folder, pooling)
    if token_types is not None:
        # A model key under the tokenizer's name: llama.cpp refuses a bert-family file without it.
        metadata.add_uint32(Keys.Tokenizer.TOKEN_TYPE_COUNT, token_types)
    return metadata


# Classification heads (*ForSequenceClassification), run by llama.cpp's rank pooling: the CLS token's
# state, `cls` (a dense layer) and tanh, then `cls.output` (one row per label; n_cls_out: their count).
_HEAD = "n_cls_out > 0"


def classifier_head(dense: str, output: str) -> dict[str, T]:
    """A head of a dense layer (+ tanh) and an output layer, under the checkpoint's names."""
    return {f"{dense}.weight": T("cls.weight", "n_embd", "n_embd", when=_HEAD),
            f"{dense}.bias": T("cls.bias", "n_embd", when=_HEAD),
            f"{output}.weight": T("cls.output.weight", "n_cls_out", "n_embd", when=_HEAD),
            f"{output}.bias": T("cls.output.bias", "n_cls_out", when=_HEAD)}


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


def output_labels_key(metadata: Metadata, arch: str, labels: list[str]) -> None:
    """{arch}.classifier.output_labels: one name per row of cls.output (none for an embedding model)."""
    if labels:
        metadata.add_array(arch_key(Keys.LLM.CLASSIFIER_OUTPUT_LABELS, arch), labels, GGUFValueType.STRING)
