"""What a plugin declares about each GGUF tensor it writes, and the check of a model against it.

A plugin's tensor table maps HF name patterns to `T` declarations: the GGUF name pattern, the
shape llama.cpp will ask for (numpy order: rows last), and whether llama.cpp can do without it.
Shapes are expressions over the model's dimensions (`"n_head * head_dim"`), which come from the
GGUF metadata the plugin writes (see `model_dims`), so the check is of the file llama.cpp will
load: every tensor it creates present once, with the shape the metadata implies, and nothing
it would not load. The check runs before the first byte is written; a failure names the tensor,
its HF source, the expected and found shapes and the config.json keys behind the dimensions.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ggufsmith.constants import Keys, arch_key
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata

# GGUF (and ggml's int64 element counts) cannot hold more; llama.cpp's loader checks the same.
MAX_ELEMENTS = 2**63 - 1


@dataclass(frozen=True)
class T:
    """One GGUF tensor: name pattern ({bid} for the block), expected shape, and when it must exist.

    shape: one expression per dimension, numpy order (rows last), over the names `model_dims` gives
           (n_embd, n_head, ...) and a plugin's own `dims()`; an int is a fixed size.
    optional: llama.cpp loads the model without it (TENSOR_NOT_REQUIRED), e.g. a bias or a tied
           output head; when present its shape is still checked.
    when:  an expression over the same names (`"n_expert > 0"`, `"is_recurrent[bid]"`): where it is
           false the tensor is not part of the model, and finding it is an error.
    blocks: for a {bid} pattern, the expression giving the number of blocks (an encoder-decoder's
           decoder blocks are counted apart from its encoder's).
    """

    name: str
    shape: tuple[str | int, ...] = ()
    optional: bool = False
    when: str | None = None
    blocks: str = "n_layer"

    def __init__(self, name: str, *shape: str | int, optional: bool = False, when: str | None = None,
                 blocks: str = "n_layer") -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", tuple(shape))
        object.__setattr__(self, "optional", optional)
        object.__setattr__(self, "when", when)
        object.__setattr__(self, "blocks", blocks)

    def at(self, prefix: str) -> T:
        """The same declaration under a prefixed name ("blk.{bid}." + "attn_q.weight")."""
        return T(prefix + self.name, *self.shape, optional=self.optional, when=self.when, blocks=self.blocks)


@dataclass(frozen=True)
class Split:
    """One HF tensor that holds several GGUF tensors side by side: equal parts along `axis`
    (e.g. transformers 5's fused experts, gate_up_proj (E, 2F, D), into ffn_gate_exps and
    ffn_up_exps). The parts stream row-slice by row-slice like any other tensor."""

    parts: tuple[T, ...]
    axis: int = -2

    def __init__(self, *parts: T, axis: int = -2) -> None:
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "axis", axis)

    def at(self, prefix: str) -> Split:
        return Split(*(part.at(prefix) for part in self.parts), axis=self.axis)


def gguf_name(entry: str | T) -> str:
    return entry.name if isinstance(entry, T) else entry


def table_entries(table: Mapping[str, str | T | Split]) -> Iterable[tuple[str, str | T]]:
    """(HF pattern, GGUF entry) pairs, a Split's parts each under the pattern of its HF tensor."""
    for hf_pattern, entry in table.items():
        for part in entry.parts if isinstance(entry, Split) else (entry,):
            yield hf_pattern, part


# -- dimensions ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dim:
    """A model dimension and where it comes from (for error messages)."""

    value: int | float | bool | Sequence[int]
    origin: str = ""


def model_dims(metadata: Metadata, arch: str, extra: Mapping[str, Any] | None = None) -> dict[str, Dim]:
    """The dimensions llama.cpp derives from a file's metadata (llama_model::load_hparams), by the
    names tensor shapes use. Absent keys take llama.cpp's defaults; `extra` (a plugin's own
    dims()) adds or overrides names."""
    dims: dict[str, Dim] = {}

    def key(template: str, name: str, default: Dim | None = None) -> None:
        full = arch_key(template, arch)
        if full in metadata:
            value = metadata[full].plain()
            dims[name] = Dim(value, metadata.origins.get(full, full))
        elif default is not None:
            dims[name] = default

    key(Keys.LLM.BLOCK_COUNT, "n_layer")
    key(Keys.LLM.CONTEXT_LENGTH, "n_ctx")
    key(Keys.LLM.EMBEDDING_LENGTH, "n_embd")
    key(Keys.LLM.FEED_FORWARD_LENGTH, "n_ff")
    key(Keys.Attention.HEAD_COUNT, "n_head")
    if "n_head" in dims:
        key(Keys.Attention.HEAD_COUNT_KV, "n_head_kv", dims["n_head"])
    if "n_embd" in dims and _scalar(dims.get("n_head")):
        per_head = Dim(int(dims["n_embd"].value) // max(1, int(dims["n_head"].value)), "n_embd / n_head")
        key(Keys.Attention.KEY_LENGTH, "head_dim", per_head)
        key(Keys.Attention.VALUE_LENGTH, "head_dim_v", dims["head_dim"])
        key(Keys.Rope.DIMENSION_COUNT, "n_rot", dims["head_dim"])
    key(Keys.LLM.EXPERT_COUNT, "n_expert", Dim(0, "no experts"))
    key(Keys.LLM.EXPERT_USED_COUNT, "n_expert_used", Dim(0, "no experts"))
    if "n_ff" in dims:
        key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, "n_ff_exp", dims["n_ff"])
    key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, "n_ff_shexp", Dim(0, "no shared expert"))
    key(Keys.SSM.CONV_KERNEL, "d_conv")
    key(Keys.SSM.INNER_SIZE, "d_inner")
    key(Keys.SSM.STATE_SIZE, "d_state")
    key(Keys.SSM.TIME_STEP_RANK, "dt_rank")
    key(Keys.SSM.GROUP_COUNT, "n_group")
    key(Keys.LLM.VOCAB_SIZE, "n_vocab")
    if "n_vocab" not in dims and Keys.Tokenizer.TOKENS in metadata:
        count = len(metadata[Keys.Tokenizer.TOKENS].value)
        dims["n_vocab"] = Dim(count, "the number of tokens in the tokenizer (padded to config.json vocab_size)")
    for name, value in (extra or {}).items():
        dims[name] = value if isinstance(value, Dim) else Dim(value, "")
    return dims


def _scalar(dim: Dim | None) -> bool:
    return dim is not None and isinstance(dim.value, int) and not isinstance(dim.value, bool)


# -- expressions over dimensions ---------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}


class _Unknown(Exception):
    """An expression names a dimension the model does not have."""


def evaluate(expression: str | int, dims: Mapping[str, Dim], bid: int | None = None) -> Any:
    """The value of a shape or condition expression; per-layer dims (lists) are taken at `bid`."""
    if isinstance(expression, int):
        return expression
    return _eval(ast.parse(expression, mode="eval").body, dims, bid)


def _eval(node: ast.AST, dims: Mapping[str, Dim], bid: int | None) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id == "bid":
            return bid
        if node.id not in dims:
            raise _Unknown(node.id)
        value = dims[node.id].value
        if isinstance(value, (list, tuple)) and bid is not None:
            return value[bid] if bid < len(value) else value[-1]
        return value
    if isinstance(node, ast.Subscript):
        container = dims[node.value.id].value if isinstance(node.value, ast.Name) and node.value.id in dims else None
        if container is None:
            raise _Unknown(getattr(node.value, "id", "?"))
        return container[_eval(node.slice, dims, bid)]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left, dims, bid), _eval(node.right, dims, bid))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, dims, bid)
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, dims, bid) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return _COMPARE[type(node.ops[0])](_eval(node.left, dims, bid), _eval(node.comparators[0], dims, bid))
    raise ValueError(f"unsupported expression {ast.unparse(node)!r}")


def _names_in(expression: str | int) -> list[str]:
    if isinstance(expression, int):
        return []
    return [n.id for n in ast.walk(ast.parse(expression, mode="eval")) if isinstance(n, ast.Name) and n.id != "bid"]


# -- the check -------------------------------------------------------------------------------------

@dataclass
class Declared:
    """A plugin's table turned around: GGUF name pattern -> declaration and the HF patterns feeding it."""

    spec: T
    regex: re.Pattern
    hf_patterns: list[str] = field(default_factory=list)


def declarations(table: Mapping[str, str | T | Split]) -> list[Declared]:
    by_name: dict[str, Declared] = {}
    for hf_pattern, entry in table_entries(table):
        if not isinstance(entry, T):
            continue
        known = by_name.get(entry.name)
        if known is None:
            regex = re.compile(re.escape(entry.name).replace(r"\{bid\}", r"(?P<bid>\d+)"))
            known = by_name[entry.name] = Declared(entry, regex)
        elif known.spec != entry:
            raise ConversionError(f"plugin bug: {entry.name} is declared twice with different shapes")
        known.hf_patterns.append(hf_pattern)
    return list(by_name.values())


def check_model(
    arch: str,
    table: Mapping[str, str | T],
    tensors: Iterable[tuple[str, tuple[int, ...], Sequence[str]]],
    dims: Mapping[str, Dim],
    config_path: str = "config.json",
) -> None:
    """Raise ConversionError unless `tensors` ((GGUF name, shape, HF sources) after mapping) are
    exactly what llama.cpp will load for this metadata: see the module docstring."""
    tensors = list(tensors)
    for name, shape, sources in tensors:
        _check_size(name, shape, sources)
    declared = declarations(table)
    present = {name: (shape, sources) for name, shape, sources in tensors}
    for name, (shape, sources) in present.items():
        _check_declared(declared, name, shape, sources, dims, config_path)

    missing = []
    for d in declared:
        if d.spec.optional:
            continue
        if "{bid}" in d.spec.name:
            count = _block_count(d.spec, dims)
            if count is None:
                continue  # the metadata does not say how many blocks: nothing to count against
            names = [(d.spec.name.format(bid=bid), bid) for bid in range(count)]
        else:
            names = [(d.spec.name, None)]
        for name, bid in names:
            if name not in present and _applies(d.spec, dims, bid):
                hf = d.hf_patterns[0].replace("{bid}", str(bid)).replace("{xid}", "*")
                missing.append((name, hf, d.spec.blocks if bid is not None else None))
    if missing:
        shown = ", ".join(f"{name} (from {hf})" for name, hf, _ in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        blocks = missing[0][2]
        counted = f" ({config_path} {_origin(blocks, dims)} = {_block_count(T('', blocks=blocks), dims)})" if blocks else ""
        raise ConversionError(f"the checkpoint lacks {shown}{more}, which llama.cpp needs{counted}")


def check_declared(table: Mapping[str, str | T | Split], name: str, shape: tuple[int, ...], sources: Sequence[str],
                   dims: Mapping[str, Dim], config_path: str = "config.json") -> bool:
    """Raise ConversionError unless GGUF tensor `name` (one tensor, e.g. one a LoRA adapter updates)
    is part of the model these dims describe, with the shape the table declares; False when the
    table declares no such tensor."""
    return _check_declared(declarations(table), name, shape, sources, dims, config_path)


def _check_declared(declared: list[Declared], name: str, shape: tuple[int, ...], sources: Sequence[str],
                    dims: Mapping[str, Dim], config_path: str) -> bool:
    for d in declared:
        m = d.regex.fullmatch(name)
        if m is None:
            continue
        bid = int(m.group("bid")) if "bid" in d.regex.groupindex else None
        count = _block_count(d.spec, dims)
        if bid is not None and count is not None and bid >= count:
            raise ConversionError(
                f"{_describe(name, sources)} belongs to block {bid}, but {config_path} "
                f"{_origin(d.spec.blocks, dims)} = {count}; the checkpoint and the config disagree"
            )
        if not _applies(d.spec, dims, bid):
            raise ConversionError(
                f"{_describe(name, sources)} is not part of this model ({d.spec.when} is false for it); "
                f"{config_path} does not describe this checkpoint"
            )
        _check_shape(d.spec, name, shape, sources, dims, bid, config_path)
        return True
    return False


def _block_count(spec: T, dims: Mapping[str, Dim]) -> int | None:
    try:
        return int(evaluate(spec.blocks, dims))
    except _Unknown:
        return None


def _origin(expression: str, dims: Mapping[str, Dim]) -> str:
    return dims[expression].origin if expression in dims else expression


def _applies(spec: T, dims: Mapping[str, Dim], bid: int | None) -> bool:
    if spec.when is None:
        return True
    try:
        return bool(evaluate(spec.when, dims, bid))
    except _Unknown:
        return False


def _check_shape(spec: T, name: str, shape: tuple[int, ...], sources: Sequence[str], dims: Mapping[str, Dim],
                 bid: int | None, config_path: str) -> None:
    if not spec.shape:
        return
    try:
        expected = tuple(int(evaluate(e, dims, bid)) for e in spec.shape)
    except _Unknown:
        return  # the model lacks a dimension this shape needs: nothing to compare with
    if tuple(shape) == expected:
        return
    names = sorted({n for e in spec.shape for n in _names_in(e)})
    why = ", ".join(f"{n} = {_show(dims[n].value, bid)} from {dims[n].origin}" for n in names if n in dims)
    raise ConversionError(
        f"{_describe(name, sources)} has shape {_fmt(shape)}, but {config_path} implies "
        f"{_fmt(expected)} ({' x '.join(map(str, spec.shape))}: {why})"
    )


def _check_size(name: str, shape: tuple[int, ...], sources: Sequence[str]) -> None:
    if any(d <= 0 for d in shape):
        raise ConversionError(f"{_describe(name, sources)} has shape {_fmt(shape)}: an empty tensor cannot be stored")
    count = 1
    for d in shape:
        count *= d
    if count > MAX_ELEMENTS:
        raise ConversionError(f"{_describe(name, sources)} has {count} elements, more than GGUF can index")


def _describe(name: str, sources: Sequence[str]) -> str:
    if not sources:
        return f"tensor {name}"
    shown = sources[0] if len(sources) == 1 else f"{sources[0]} and {len(sources) - 1} more"
    return f"tensor {name} (from {shown})"


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _show(value: Any, bid: int | None) -> Any:
    if isinstance(value, (list, tuple)) and bid is not None and bid < len(value):
        return value[bid]
    return value

