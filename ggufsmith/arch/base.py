"""The interface an architecture plugin implements, and the shared machinery behind it.

A plugin answers four questions and nothing else:
  1. Which HF classes / model types it claims  -> `hf_classes`, `model_types`
  2. Which GGUF keys follow from config.json   -> `metadata()`
  3. Which GGUF name each HF tensor gets       -> `tensor_names` (patterns with {bid} / {xid})
  4. Which tensors change layout               -> `transform()`
plus which tokenizer exporter it uses (`tokenizer_kind`). Everything else (reading checkpoints,
choosing tensor types, quantizing, writing) is the pipeline's job.

Tensor name patterns: `{bid}` matches a block number; `{xid}` matches an expert number, and all
experts of one block are stacked (in expert order) into one GGUF tensor of shape
(n_expert, *expert_shape).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ggufsmith.constants import GGUFValueType, arch_key
from ggufsmith.arch.common import without_mtp
from ggufsmith.arch.tensors import Split, T, check_model, gguf_name, model_dims
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.errors import ConversionError, GGUFError
from ggufsmith.gguf_writer.metadata import Metadata, check_key

log = logging.getLogger(__name__)


class ArchKeys:
    """Writes `{arch}.*` keys with the types llama.cpp expects; skips values that are None."""

    def __init__(self, metadata: Metadata, arch: str) -> None:
        self.metadata = metadata
        self.arch = arch

    def _add(self, template: str, value: Any, vtype: GGUFValueType) -> None:
        if value is None:
            return
        key = arch_key(template, self.arch)
        origin = getattr(value, "origin", None)  # a ConfigInt names its config key
        check_key(key)  # a bad key is the plugin's error, not the config value's
        try:
            self.metadata.add(key, value, vtype)
        except GGUFError as e:
            if origin is None:
                raise
            raise ConversionError(f"{value.file}: {origin} = {int(value)} does not fit {key} ({vtype.name})") from None
        if origin:
            self.metadata.origins[key] = origin

    def u32(self, template: str, value: int | None) -> None:
        self._add(template, _integral(value), GGUFValueType.UINT32)

    def u64(self, template: str, value: int | None) -> None:
        """For keys the spec types as uint64 where no llama.cpp reader insists on uint32 (rwkv, whisper)."""
        self._add(template, _integral(value), GGUFValueType.UINT64)

    def f32(self, template: str, value: float | None) -> None:
        self._add(template, None if value is None else float(value), GGUFValueType.FLOAT32)

    def bool(self, template: str, value: bool | None) -> None:
        self._add(template, None if value is None else bool(value), GGUFValueType.BOOL)

    def string(self, template: str, value: str | None) -> None:
        self._add(template, value, GGUFValueType.STRING)

    def array(self, template: str, values: Sequence[Any], element_type: GGUFValueType) -> None:
        """An array key (one value per layer, ...) of `element_type` elements."""
        key = arch_key(template, self.arch)
        check_key(key)
        self.metadata.add_array(key, values, element_type)


def _integral(value: Any) -> Any:
    """Integers as they are (a ConfigInt keeps its origin); whole floats (4096.0) as ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass(frozen=True)
class LanguageModelOf:
    """Where a multimodal checkpoint (vision or audio encoder + language model) keeps its language
    model, for plugins that convert only that part (llama.cpp loads the encoders from a separate
    mmproj file). A plugin declares it as `language_model = LanguageModelOf(...)`; it applies when
    config.json has the `config` section:
      - the plugin's `self.config` is that section (`text_config`), so the plugin reads it as it
        reads the config of the text-only model;
      - tensor names starting with a key of `prefixes` are matched against the tensor table with
        that prefix replaced by its value (`"model.language_model."` -> `"model."`), so one table
        serves both; the first prefix that matches wins;
      - tensors under a key of `skipped` are left out, with one warning naming what was skipped;
      - any other tensor must match the table as usual (an unknown part is an error, never dropped).
    """

    prefixes: Mapping[str, str]
    skipped: Mapping[str, str]  # HF prefix -> what it holds, for the notice ("vision tower")
    config: str = "text_config"


@dataclass(frozen=True)
class MappedTensor:
    """One output tensor: its GGUF name, the HF tensors it is made of, and the lazy data."""

    name: str
    sources: tuple[str, ...]
    tensor: LazyTensor


class Architecture:
    """Base class of architecture plugins. Subclasses are mostly declarations."""

    name: ClassVar[str]  # general.architecture, e.g. "llama"
    hf_classes: ClassVar[tuple[str, ...]] = ()  # config.json "architectures" values claimed
    model_types: ClassVar[tuple[str, ...]] = ()  # config.json "model_type" values claimed
    # tokenizer exporter: "llama" (SentencePiece), "gpt2" (byte-level BPE), "gemma4", "rwkv"; None: detect
    tokenizer_kind: ClassVar[str | None] = None
    # HF pattern -> GGUF tensor: a T declaring its GGUF name pattern and the shape llama.cpp loads it
    # with (checked before anything is written; see arch/tensors.py), a Split of one HF tensor into
    # several GGUF ones (a fused gate_up), or just the GGUF name.
    tensor_names: ClassVar[dict[str, str | T | Split]] = {}
    ignored_tensors: ClassVar[tuple[str, ...]] = ()  # regexes of HF names dropped on purpose (checked first)
    # Name prefixes of multi-token-prediction layers, which llama.cpp runs the model without: left out
    # with one notice (their export as a separate file is a later feature).
    mtp_prefixes: ClassVar[tuple[str, ...]] = ()
    f32_tensors: ClassVar[tuple[str, ...]] = ()  # regexes of GGUF names kept F32 whatever the outtype
    # Regex of the HF output-head tensor that is dropped when config.json ties it to the token
    # embeddings (tie_word_embeddings, true unless set false, as in transformers): the reader then
    # uses token_embd in its place. None: the plugin decides itself (llama keeps a stored lm_head).
    tied_output_head: ClassVar[str | None] = None
    # False for a model whose GGUF has no output head at all (an embedding model), whose token
    # embeddings are then tied to nothing (converters/lora.py: an adapter may change them).
    has_output_head: ClassVar[bool] = True
    # The names dims() adds to tensors.model_dims' (for the check that shape expressions use known names).
    dim_names: ClassVar[tuple[str, ...]] = ()
    # Multimodal checkpoints whose language model this plugin converts (see LanguageModelOf).
    language_model: ClassVar[LanguageModelOf | None] = None
    # Values the family's transformers config class fills in for keys config.json leaves out (the
    # Hub's Gemma 3 text_config gives only what differs from them); self.config has them.
    config_defaults: ClassVar[Mapping[str, Any]] = {}
    # HF tensors of one number per block that llama.cpp reads as metadata, not as tensors (Apertus'
    # xIELU parameters): HF pattern with {bid} -> a name. read_scalars() loads them before planning
    # (the pipeline calls it) into self.scalars[name], one float per block; they are not mapped.
    scalar_tensors: ClassVar[dict[str, str]] = {}

    def __init__(self, config: HFConfig) -> None:
        # config.json as a whole, and the config of the model converted (its text_config section
        # for a multimodal checkpoint): plugins read self.config.
        self.checkpoint_config = config
        self.multimodal = self.language_model is not None and self.language_model.config in config
        self.config = config.sub(self.language_model.config) if self.multimodal else config
        if self.config_defaults:
            self.config = self.config.with_defaults(self.config_defaults)
        self._skipped_notice = ""  # what map_tensors left out of a multimodal checkpoint, told by check()
        self.scalars: dict[str, list[float]] = {}

    def read_scalars(self, source: Mapping[str, LazyTensor]) -> None:
        """Load the `scalar_tensors` of the checkpoint into self.scalars (for metadata())."""
        for hf_pattern, name in self.scalar_tensors.items():
            regex = _pattern_regex(hf_pattern)
            by_block: dict[int, float] = {}
            for hf_name, tensor in source.items():
                m = regex.fullmatch(hf_name)
                if m is None:
                    continue
                if tensor.n_elements != 1:
                    raise ConversionError(f"tensor {hf_name} has shape {list(tensor.shape)}; expected a single number")
                by_block[int(m["bid"])] = float(np.asarray(tensor.load(), dtype=np.float64).reshape(-1)[0])
            missing = sorted(set(range(max(by_block, default=-1) + 1)) - set(by_block))
            if missing:
                raise ConversionError(f"the checkpoint lacks {hf_pattern.format(bid=missing[0])}")
            self.scalars[name] = [by_block[bid] for bid in sorted(by_block)]

    # -- question 2 -----------------------------------------------------------------------
    def metadata(self) -> Metadata:
        """The `{arch}.*` keys (not general.* nor tokenizer.*, which the pipeline writes)."""
        raise NotImplementedError(f"{type(self).__name__} must implement metadata()")

    def dims(self) -> dict[str, Any]:
        """Dimensions the tensor shapes use beyond those read from the metadata (tensors.model_dims)."""
        return {}

    def check(self, mapped: list[MappedTensor], metadata: Metadata) -> None:
        """Refuse a model llama.cpp would not load: a declared tensor missing, of the wrong shape,
        in a block past the block count, or not part of this model (see arch/tensors.py)."""
        dims = model_dims(metadata, self.name, self.dims())
        check_model(self.name, self.tensor_names, [(m.name, m.tensor.shape, m.sources) for m in mapped], dims,
                    self.config.label)
        if self._skipped_notice:
            log.warning("%s", self._skipped_notice)  # once the conversion is known to go ahead

    # -- question 4 -----------------------------------------------------------------------
    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        """Layout change of one output tensor, by GGUF name. Default: none. Return `tensor` itself
        for a tensor kept as stored: converters/lora.py then applies adapters to it without a trial
        of the change (LoRA factors follow changes of rows only)."""
        return tensor

    def split_tensor(self, entry: Split, tensor: LazyTensor) -> list[LazyTensor]:
        """The parts of one HF tensor that holds several GGUF tensors, in the order of entry.parts.
        Default: equal parts along entry.axis. A plugin whose parts are not equal slices (DeepSeek's
        kv_b_proj: per head, key rows then value rows) overrides it."""
        return tensor.split(len(entry.parts), entry.axis)

    def extra_tensors(self) -> dict[str, LazyTensor]:
        """Tensors the GGUF needs that the checkpoint does not hold, by GGUF name (e.g. llama3's
        rope_freqs, computed from config.json). They come first in the file. Default: none."""
        return {}

    # -- question 3: the shared mapping machinery ------------------------------------------
    def map_tensors(self, source: Mapping[str, LazyTensor]) -> list[MappedTensor]:
        """Every HF tensor mapped to its GGUF name, experts stacked, transforms applied, after the
        plugin's extra_tensors().

        An HF tensor that matches no pattern and is not ignored is an error: silently dropping a
        weight would give a model that loads and produces wrong output.
        """
        if self.mtp_prefixes:
            source = without_mtp(source, self.config.path, self.mtp_prefixes)
        patterns = _compile_patterns(self.tensor_names)
        ignored = [re.compile(p) for p in self._ignored_patterns()]
        singles: dict[str, tuple[str, LazyTensor]] = {}
        expert_groups: dict[str, dict[int, tuple[str, LazyTensor]]] = {}
        order: list[str] = []
        unmapped: list[str] = []
        table_names = self._language_model_names(source) if self.multimodal else {}
        for hf_name, tensor in source.items():
            if table_names.get(hf_name, hf_name) is None:
                continue  # a skipped part of a multimodal checkpoint
            table_name = table_names.get(hf_name, hf_name)
            # Ignoring wins over a name pattern, so that a tied output head (mapped when untied) is dropped.
            if any(p.fullmatch(table_name) for p in ignored):
                continue
            target = _match(patterns, table_name)
            if target is None:
                unmapped.append(hf_name)
                continue
            entry, bid, expert = target
            names = [gguf_name(part).format(bid=bid) for part in entry.parts] if isinstance(entry, Split) \
                else [gguf_name(entry).format(bid=bid)]
            pieces = self.split_tensor(entry, tensor) if isinstance(entry, Split) else [tensor]
            for name, piece in zip(names, pieces):
                if name not in singles and name not in expert_groups:
                    order.append(name)
                if expert is None:
                    if name in singles:
                        raise ConversionError(f"{hf_name} and {singles[name][0]} both map to {name}")
                    singles[name] = (hf_name, piece)
                else:
                    expert_groups.setdefault(name, {})[expert] = (hf_name, piece)
        if unmapped:
            shown = ", ".join(unmapped[:5]) + (f" and {len(unmapped) - 5} more" if len(unmapped) > 5 else "")
            raise ConversionError(
                f"the {self.name} plugin has no GGUF name for tensor(s) {shown}; "
                "the checkpoint may be of a variant this plugin does not support"
            )
        mapped = [MappedTensor(name, (), tensor) for name, tensor in self.extra_tensors().items()]
        for name in order:
            if name in singles:
                hf_name, tensor = singles[name]
                sources = (hf_name,)
            else:
                group = expert_groups[name]
                missing = sorted(set(range(len(group))) - set(group))
                if missing:
                    raise ConversionError(f"{name}: experts {missing} are missing from the checkpoint")
                sources = tuple(group[i][0] for i in range(len(group)))
                tensor = LazyTensor.stack([group[i][1] for i in range(len(group))], source=f"{name} <- {sources[0]}...")
            mapped.append(MappedTensor(name, sources, self.transform(name, tensor)))
        return mapped

    def _language_model_names(self, source: Mapping[str, LazyTensor]) -> dict[str, str | None]:
        """HF name -> the name the tensor table knows it by (None: skipped), for a multimodal
        checkpoint; tells once, in one line, which parts are left out."""
        spec = self.language_model
        names: dict[str, str | None] = {}
        skipped: dict[str, int] = {}
        for hf_name in source:
            part = next((p for p in spec.skipped if hf_name.startswith(p)), None)
            if part is not None:
                names[hf_name] = None
                skipped[part] = skipped.get(part, 0) + 1
                continue
            prefix = next((p for p in spec.prefixes if hf_name.startswith(p)), None)
            if prefix is not None:
                names[hf_name] = spec.prefixes[prefix] + hf_name[len(prefix):]
        if skipped:
            parts = ", ".join(f"{spec.skipped[p]} ({n} tensors {p}*)" for p, n in skipped.items())
            self._skipped_notice = (f"{self.checkpoint_config.path}: "
                                    f"{', '.join(self.checkpoint_config.architectures) or self.name}: "
                                    f"converting the language model only; left out: {parts}")
        return names

    def _ignored_patterns(self) -> tuple[str, ...]:
        scalars = tuple(_pattern_regex(p).pattern for p in self.scalar_tensors)  # metadata, see read_scalars
        if self.tied_output_head and self.config.get("tie_word_embeddings", default=True):
            return (*self.ignored_tensors, *scalars, self.tied_output_head)
        return (*self.ignored_tensors, *scalars)

    def keep_f32(self, gguf_name: str) -> bool:
        return any(re.fullmatch(p, gguf_name) for p in self.f32_tensors)

    @classmethod
    def claims(cls, config: HFConfig) -> bool:
        return any(a in cls.hf_classes for a in config.architectures) or (
            not config.architectures and config.model_type in cls.model_types
        )


def _pattern_regex(hf_pattern: str) -> re.Pattern:
    """An HF name pattern ({bid}: block number, {xid}: expert number) as a regex."""
    return re.compile(re.escape(hf_pattern).replace(r"\{bid\}", r"(?P<bid>\d+)").replace(r"\{xid\}", r"(?P<xid>\d+)"))


def _compile_patterns(table: Mapping[str, str | T | Split]) -> list[tuple[re.Pattern, str | T | Split]]:
    return [(_pattern_regex(hf_pattern), entry) for hf_pattern, entry in table.items()]


def _match(patterns: Iterable[tuple[re.Pattern, str | T | Split]], hf_name: str) -> tuple[str | T | Split, str, int | None] | None:
    """(table entry, block number or "", expert number or None) of the first pattern matching."""
    for regex, entry in patterns:
        m = regex.fullmatch(hf_name)
        if m:
            groups = m.groupdict()
            expert = int(groups["xid"]) if groups.get("xid") is not None else None
            return entry, groups.get("bid") or "", expert
    return None
