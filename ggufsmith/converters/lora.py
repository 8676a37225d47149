"""A PEFT LoRA adapter -> the GGUF adapter file llama.cpp applies on top of its base model's GGUF
(`llama-cli --lora`, llama-cpp-python's `lora_path`).

llama.cpp (src/llama-adapter.cpp, llama-graph.cpp) reads `general.type = adapter`,
`adapter.type = lora`, `adapter.lora.alpha` and `general.architecture`, which must be the base
file's; and for each adapted GGUF tensor `<name>.lora_a` and `<name>.lora_b`, which it applies as
W x + alpha / r * B (A x), with r read from lora_b. In numpy order (rows last): lora_a is PEFT's A
(r, in) and lora_b its B (out, r); for the token embeddings, which llama.cpp looks up by row,
lora_a is (vocab, r) and lora_b (dim, r).

Names and layouts come from the base model's own plugin, so an adapter converts for every
architecture its base converts for. The update of a weight is the product left @ right of two
factors: B @ A for a linear layer (left: B, whose rows are the weight's rows), A^T @ B^T for an
embedding. The plugin maps and transforms the left factor in place of the weight: what it does to
rows (the llama q/k rotary permutation, a split of a fused tensor into parts) is then done to the
update. Whether a plugin's change of layout is such a row operation is not assumed: for each kind
of adapted tensor, it is tried once on a random matrix of the weight's full shape, and an adapter
whose layout change the factors cannot follow (a transposition, tensors joined into one) is
refused in one line. (The trial costs one matrix of the weight's size per kind of tensor the
plugin changes, as the base model's own conversion does; tensors it keeps as they are need none.)

PEFT scales each module's update by alpha / r (alpha / sqrt(r) with rsLoRA), alpha and r per
module with alpha_pattern / rank_pattern; llama.cpp by one alpha over each tensor's r. The file's
alpha is chosen so that modules at the adapter's default r and alpha need nothing else (lora_alpha,
or lora_alpha * sqrt(r) for rsLoRA); the left factor of any other module is multiplied by the ratio
of its scale to llama.cpp's, before the plugin lays it out.

Mixture-of-experts stacks (ffn_gate_exps, ffn_up_exps, ffn_down_exps: (E, out, in)) take a 3-D
lora_a (E, r, in) and lora_b (E, out, r), which llama.cpp multiplies by the routed experts' slices
(build_lora_mm_id) at one alpha / r, r from lora_b. A stack adapted through PEFT's
target_parameters arrives as stacked factors already (readers/peft_adapter.py) and is laid out as
any tensor (a fused gate_up splits its lora_b, both halves sharing lora_a); per-expert LoRAs
(`experts.N.w1`) are stacked by the plugin as the experts' weights are, their right factors beside.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufsmith.arch.base import Architecture, MappedTensor
from ggufsmith.arch.registry import find_architecture
from ggufsmith.arch.tensors import Dim, check_declared, model_dims
from ggufsmith.constants import GGML_QUANTIZATION_VERSION, Keys
from ggufsmith.converters.general_metadata import ParameterCount, general_metadata
from ggufsmith.converters.output_names import has_type_template, named_output
from ggufsmith.converters.plan import (AUTO_OUTTYPE, ConversionPlan, PlannedTensor, choose_type, guess_outtype,
                                       outtype_of)
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.output import check_target
from ggufsmith.gguf_writer.writer import tensor_data_size
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.peft_adapter import LoraPair, PeftAdapter, open_adapter

# The output types of llama.cpp's convert_lora_to_gguf.py (lora_b rows of r values fall back to
# F16 under Q8_0 when r is not a multiple of 32, as there).
LORA_OUTTYPES = ("f32", "f16", "bf16", "q8_0", AUTO_OUTTYPE)
# What an adapter's conversion reads of its base model (and downloads of it, with `download`).
BASE_FILES = ["config.json"]
TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"


@dataclass(frozen=True)
class AdaptedTensor:
    """One GGUF tensor of the base model and the factors of its update, in the GGUF's layout."""

    name: str  # the base model's GGUF tensor: "blk.0.attn_q.weight"
    pair: LoraPair
    lora_a: LazyTensor
    lora_b: LazyTensor


def convert_lora(adapter_dir: str | Path, dst: str | Path | None = None, outtype: str = "f16",
                 base: str | Path | None = None, *, dry_run: bool = False, progress: bool = False, force: bool = False,
                 threads: int | None = None, model_name: str | None = None, download: bool = False) -> ConversionPlan:
    """Convert the PEFT LoRA adapter in `adapter_dir` to the GGUF adapter file `dst`; returns the plan
    (its `output` is the path written).

    `dst` may be an existing folder, or None for the adapter's own folder (as convert_lora_to_gguf.py
    without --outfile): the file is then named as that script names it,
    <basename or name>-<size label>-<finetune>-<version>-<TYPE>-LoRA.gguf, from the adapter's model
    card and folder name; `{ftype}` or `{outtype}` in a file name is replaced by the type.
    `base`: the base model's folder or repository id (only its config.json is read); default: the
    adapter config's base_model_name_or_path, a folder or a repository id in the local Hugging Face
    cache (fetched first only with `download`). `outtype`: f32, f16, bf16, q8_0 or auto (the
    adapter's own 16-bit type). `dst` appears only once complete."""
    if outtype.lower() not in LORA_OUTTYPES:
        raise ConversionError(f"unknown output type {outtype!r} for an adapter; choose one of: {', '.join(LORA_OUTTYPES)}")
    dst = Path(adapter_dir if dst is None else dst)
    named_later = dst.is_dir() or has_type_template(dst.name)
    with open_adapter(adapter_dir) as adapter:
        if not named_later:
            check_target(dst, adapter.files, force=force)  # before any work
        config = HFConfig.from_dir(base_folder(adapter, base, download=download))
        plugin = find_architecture(config)(config)
        plan = make_lora_plan(adapter, plugin, outtype, model_name=model_name)
        if named_later:  # the type a name says is general.file_type's (MOSTLY_F16: F16)
            dst = named_output(dst, plan.metadata, plan.file_type.name.partition("_")[2], adapter=True)
            check_target(dst, adapter.files, force=force)
        plan.output = dst
        if not dry_run:
            from ggufsmith.converters.fanout import write_plans

            write_plans([(plan, dst)], progress=progress, inputs=adapter.files, force=force, threads=threads)
    return plan


def base_folder(adapter: PeftAdapter, base: str | Path | None, *, download: bool = False) -> Path:
    """The base model's folder: `base` (a folder or a repository id), else the adapter config's
    base_model_name_or_path; a one-line error saying to pass --base when neither is found."""
    from ggufsmith.readers.hub import looks_like_repo_id, resolve_source

    if base is not None:
        folder, _ = resolve_source(base, download=download, files=BASE_FILES)
        if not folder.is_dir():
            raise ConversionError(f"--base {base}: no such folder; give the base model's folder or repository id")
        return folder
    name = adapter.config.get("base_model_name_or_path")
    where = f"{adapter.config_path}: base_model_name_or_path"
    if not isinstance(name, str) or not name:
        raise ConversionError(f"{where} is not set; pass --base with the base model's folder or repository id")
    if Path(name).is_dir():
        return Path(name)
    if not looks_like_repo_id(name):
        raise ConversionError(f"{where} {name!r} is no folder here; pass --base with the base model's folder")
    try:
        return resolve_source(name, download=download, files=BASE_FILES)[0]
    except ConversionError as e:
        raise ConversionError(f"{where}: {e}; or pass --base with the base model's folder") from None


def make_lora_plan(adapter: PeftAdapter, plugin: Architecture, outtype: str = "f16", *,
                   model_name: str | None = None) -> ConversionPlan:
    """Every lora_a / lora_b tensor's name, shape, type and size, and the adapter's keys."""
    if outtype.lower() == AUTO_OUTTYPE:
        outtype = guess_outtype({p.a_name: p.a for p in adapter.pairs})
    target, file_type = outtype_of(outtype)
    alpha = file_alpha(adapter)
    planned = []
    for adapted in adapted_tensors(adapter, plugin, alpha):
        lora_a, lora_b = adapted.lora_a, adapted.lora_b
        for suffix, tensor, source in (("lora_a", lora_a, adapted.pair.a_name), ("lora_b", lora_b, adapted.pair.b_name)):
            ggml_type, note = choose_type(adapted.name, tensor.shape, target, plugin)
            name = f"{adapted.name}.{suffix}"
            planned.append(PlannedTensor(name, (source,), tensor.shape, tensor.dtype, ggml_type,
                                         tensor_data_size(name, tensor.shape, ggml_type), note, tensor))
    return ConversionPlan(plugin, outtype.lower(), file_type, adapter_metadata(adapter, plugin, alpha, model_name),
                          planned)


def file_alpha(adapter: PeftAdapter) -> float:
    """adapter.lora.alpha: llama.cpp's scale alpha / r then equals PEFT's for the modules of the
    adapter's default rank and alpha (see the module docstring)."""
    alpha = adapter.alpha()
    if adapter.config.get("use_rslora"):
        rank = adapter.config.get("r", 8)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ConversionError(f"{adapter.config_path}: r is {rank!r}; expected a positive integer")
        return alpha * math.sqrt(rank)
    return alpha


def adapter_metadata(adapter: PeftAdapter, plugin: Architecture, alpha: float, model_name: str | None) -> Metadata:
    """The keys, in the order llama.cpp's convert_lora_to_gguf.py writes them: the base model's
    architecture, general.type adapter, adapter.type, the adapter's own general.* keys (its model
    card and folder name), the alpha."""
    metadata = Metadata()
    metadata.add_string(Keys.General.ARCHITECTURE, plugin.name)
    metadata.add_string(Keys.General.TYPE, "adapter")
    metadata.add_string(Keys.Adapter.TYPE, "lora")
    general = general_metadata(adapter.folder, {}, ParameterCount(), model_name)
    for key, value in general.items():
        if key != Keys.General.TYPE:  # "model" there
            metadata.add_value(key, value)
    metadata.add_float32(Keys.Adapter.LORA_ALPHA, alpha)
    metadata.add_uint32(Keys.General.QUANTIZATION_VERSION, GGML_QUANTIZATION_VERSION)
    return metadata


# -- names and layouts through the base model's plugin -----------------------------------------------

def adapted_tensors(adapter: PeftAdapter, plugin: Architecture, alpha: float) -> list[AdaptedTensor]:
    """Each adapted module's GGUF tensor and factors, mapped and laid out by the base's plugin,
    checked against the base model's config; one-line errors for what llama.cpp cannot apply.
    The left factors carry PEFT's scale over llama.cpp's (alpha / r under the file's `alpha`)."""
    config_path = adapter.config_path
    pairs = {p.weight_name: p for p in adapter.pairs}
    left = {p.weight_name: _scaled_left_factor(adapter, p, alpha) for p in adapter.pairs}
    try:
        _check_stacked_ranks(config_path, plugin, pairs)
        mapped = plugin.map_tensors(left)
    except ConversionError as e:
        raise ConversionError(f"{config_path}: the adapter does not fit a {plugin.name} base model: {e}") from None
    adapted: list[AdaptedTensor] = []
    mapped_sources: set[str] = set()
    checked: set[tuple] = set()
    dims = _base_dims(plugin)
    tied = _output_tied(plugin)
    for m in mapped:
        if not m.sources:
            continue  # computed from the config (rope_freqs): not part of the adapter
        pair = pairs[m.sources[0]]
        mapped_sources.update(m.sources)
        _refuse_unappliable(config_path, plugin, m.name, pair, tied)
        kind = (re.sub(r"\.\d+\.", ".#.", pair.weight_name), pair.a.shape, pair.b.shape)
        if m.tensor is not left[pair.weight_name] and kind not in checked:  # laid out otherwise than stored
            checked.add(kind)
            _check_row_layout(config_path, plugin, pair)
        right = _right_factor(pair) if len(m.sources) == 1 else _stacked_right_factor(config_path, plugin, m, pairs)
        shape = (*m.tensor.shape[:-1], right.shape[-1])
        check_declared(plugin.tensor_names, m.name, shape, [f"{pair.weight_name} in the adapter"], dims,
                       plugin.config.label)
        if pair.embedding:  # llama.cpp looks its rows up by token: (vocab, r); lora_b as PEFT's B (dim, r)
            adapted.append(AdaptedTensor(m.name, pair, m.tensor, pair.b))
        else:
            adapted.append(AdaptedTensor(m.name, pair, right, m.tensor))
    dropped = [name for name in pairs if name not in mapped_sources]
    if dropped:
        raise ConversionError(f"{config_path}: the adapter adapts {dropped[0]}, which the {plugin.name} base model "
                              f"does not have as a tensor of its own in GGUF (a tied output head, or a part "
                              "ggufsmith leaves out); llama.cpp cannot apply it")
    return adapted


def _left_factor(pair: LoraPair) -> LazyTensor:
    """The factor whose rows are the adapted weight's rows: B for a linear layer, A^T for an embedding."""
    return pair.a.swap_last_axes() if pair.embedding else pair.b


def _right_factor(pair: LoraPair) -> LazyTensor:
    return pair.b.swap_last_axes() if pair.embedding else pair.a


def _scaled_left_factor(adapter: PeftAdapter, pair: LoraPair, alpha: float) -> LazyTensor:
    """The left factor times PEFT's scale over llama.cpp's alpha / r: 1 for the modules of the
    adapter's own r and alpha. Scaling rows commutes with every layout change the plugin may make
    (those are checked to be row operations), and per module it serves experts stacked into one
    tensor, whose lora_b llama.cpp scales by one alpha / r."""
    factor = adapter.scale(pair) * pair.rank / alpha
    left = _left_factor(pair)
    return left if math.isclose(factor, 1.0, rel_tol=1e-12) else _scaled(left, factor)


def _check_stacked_ranks(config_path: Path, plugin: Architecture, pairs: dict[str, LoraPair]) -> None:
    """Refuse experts of different ranks that the plugin stacks into one tensor: llama.cpp applies
    one rank (lora_b's) to a whole stack. Found by laying out placeholders of rank 1 (lazy: nothing
    is read), which stack whatever the ranks. A layout the placeholders do not fit is left to the
    checks that follow, which name what the factors cannot follow."""
    probe = {name: LazyTensor((*_left_factor(p).shape[:-1], 1), "F32", lambda: np.zeros(0), name)
             for name, p in pairs.items()}
    try:
        mapped = plugin.map_tensors(probe)
    except ConversionError:
        return
    for m in mapped:
        group = [pairs[name] for name in m.sources]
        other = next((p for p in group if p.rank != group[0].rank), None)
        if other is not None:
            raise ConversionError(f"{other.a_name} has rank {other.rank}, {group[0].a_name} {group[0].rank}; "
                                  f"llama.cpp applies one rank to all the experts stacked in {m.name}: "
                                  "the experts need one rank")


def _stacked_right_factor(config_path: Path, plugin: Architecture, mapped: MappedTensor,
                          pairs: dict[str, LoraPair]) -> LazyTensor:
    """The right factors of the experts the plugin stacked into one tensor (`experts.{xid}.w1`
    LoRAs of each expert), stacked in its order: lora_a (E, r, in) beside lora_b (E, out, r). Their
    ranks agree (_check_stacked_ranks); any other join of several tensors is refused."""
    group = [pairs[name] for name in mapped.sources]
    if len(mapped.tensor.shape) != len(_left_factor(group[0]).shape) + 1 or mapped.tensor.shape[0] != len(group):
        raise ConversionError(f"{config_path}: the {plugin.name} base model joins {mapped.sources[0]} and "
                              f"{len(group) - 1} more into one tensor {mapped.name}; adapters of such tensors "
                              "are not supported yet: merge the adapter into the base model (PEFT "
                              "merge_and_unload) and convert that")
    return LazyTensor.stack([_right_factor(p) for p in group], source=f"{mapped.name}.lora_a")


def _refuse_unappliable(config_path: Path, plugin: Architecture, name: str, pair: LoraPair, tied: bool) -> None:
    if pair.embedding and name != TOKEN_EMBD:
        raise ConversionError(f"{config_path}: the adapter adapts the embedding {pair.weight_name} ({name}); "
                              "llama.cpp applies an embedding adapter to the token embeddings only")
    if name == TOKEN_EMBD and not pair.embedding:
        raise ConversionError(f"{config_path}: the adapter adapts {pair.weight_name} as a linear layer, but it "
                              "is the token embeddings in llama.cpp")
    if tied and name in (TOKEN_EMBD, OUTPUT):
        raise ConversionError(
            f"{config_path}: the adapter adapts {pair.weight_name}, but the {plugin.name} base model ties its "
            f"output head to its token embeddings ({plugin.config.label} tie_word_embeddings): llama.cpp "
            "cannot apply an adapter to tied embeddings"
        )


def _output_tied(plugin: Architecture) -> bool:
    """Whether the base model's output head is its token embeddings (no `output` tensor in its GGUF),
    as transformers decides it: tie_word_embeddings, true unless set. A model without an output
    head (an embedding model) ties nothing."""
    if not plugin.has_output_head:
        return False
    value = plugin.config.get("tie_word_embeddings", default=None)
    if value is None:
        value = plugin.checkpoint_config.get("tie_word_embeddings", default=True)
    return bool(value)


def _base_dims(plugin: Architecture) -> dict[str, Dim]:
    """The dimensions of the base model's tensors, from its config (as for the base's own check)."""
    dims = model_dims(plugin.metadata(), plugin.name, plugin.dims())
    vocab = plugin.config.get("vocab_size", default=None)
    if "n_vocab" not in dims and isinstance(vocab, int):
        dims["n_vocab"] = Dim(vocab, f"{plugin.config.label} vocab_size")
    return dims


def _check_row_layout(config_path: Path, plugin: Architecture, pair: LoraPair) -> None:
    """Refuse a plugin whose change of this weight's layout is not an operation on its rows alone:
    laid out through the plugin, a random update L @ R of the weight's full shape must equal
    (L laid out) @ R, part by part."""
    rng = np.random.default_rng(0)
    rank = pair.rank
    *experts, rows, _ = _left_factor(pair).shape  # experts: (E,) for the stacked experts of one parameter
    columns = _right_factor(pair).shape[-1]
    left = rng.standard_normal((*experts, rows, rank)).astype(np.float32)
    right = rng.standard_normal((*experts, rank, columns)).astype(np.float32)
    name = pair.weight_name
    whole = {m.name: m.tensor for m in plugin.map_tensors({name: LazyTensor.from_array(left @ right)}) if m.sources}
    factor = {m.name: m.tensor for m in plugin.map_tensors({name: LazyTensor.from_array(left)}) if m.sources}
    for gguf_name, tensor in whole.items():
        expected = tensor.load()
        laid_out = factor[gguf_name].load()
        follows = (laid_out.shape[-1] == rank and expected.shape == (*laid_out.shape[:-1], columns)
                   and np.allclose(laid_out.astype(np.float64) @ right, expected, rtol=1e-4, atol=1e-4 * rank))
        if not follows:
            raise ConversionError(
                f"{config_path}: the {plugin.name} base model changes the layout of {gguf_name} (from {name}) in a "
                "way the adapter's low-rank factors cannot follow; merge the adapter into the base model (PEFT "
                "merge_and_unload) and convert that"
            )


def _scaled(tensor: LazyTensor, factor: float) -> LazyTensor:
    return tensor.map(lambda a: (a.astype(np.float64) * factor).astype(np.float32), dtype="F32")
