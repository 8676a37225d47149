"""Reading a batch plan file (YAML or TOML): which sources, which output types, where the files go.

    output_dir: out                # relative paths are from the plan file's folder
    sources:
      - path: models/a             # a model folder ...
        outtypes: [f16, q8_0, q4_k_m]
      - repo: TinyLlama/TinyLlama-1.1B-Chat-v1.0   # ... or a Hugging Face repo id, from the local cache
        outtypes: [q6_k]
        imatrix: imatrix.gguf
        options: {pure: false, output_tensor_type: q8_0}

docs/batch.md lists every key. Everything is checked before any work starts; an error is one line
naming the plan file, the entry (sources[1]) and the key. Nothing here opens a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ggufsmith.errors import BatchError

# Options of a preset outtype, as `convert`'s flags (--pure, --tensor-type, ...).
PRESET_OPTIONS = ("pure", "output_tensor_type", "token_embedding_type", "leave_output_tensor", "tensor_types",
                  "override_kv", "include_weights", "exclude_weights")
# Keys a source may have; all but path/repo/revision/download may also be given under `defaults`.
SOURCE_KEYS = ("path", "repo", "revision", "download", "outtypes", "imatrix", "arch", "model_name", "metadata",
               "options", "output_dir", "name_pattern", "outputs", "split_max_size", "split_max_tensors")
TOP_KEYS = ("output_dir", "name_pattern", "max_memory", "jobs", "threads", "defaults", "sources")
# Fields a name pattern may use (docs/batch.md); missing ones are empty and their separators dropped.
PATTERN_FIELDS = ("basename", "size_label", "finetune", "version", "type", "name", "source")

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass
class SourceSpec:
    """One source of a batch and what to make of it; paths are absolute."""

    index: int  # position in the plan's sources list, for messages
    label: str  # the path or repo id as written
    outtypes: list[str]
    output_dir: Path
    path: Path | None = None
    repo: str | None = None
    revision: str | None = None
    download: bool = False
    imatrix: Path | None = None
    arch: str | None = None
    model_name: str | None = None
    metadata: Path | None = None  # a --metadata JSON file of general.* overrides
    metadata_digest: str = ""  # its contents' sha256, so that editing it redoes the outputs
    options: dict[str, Any] = field(default_factory=dict)
    name_pattern: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)  # outtype -> file name, overriding the pattern
    split_max_size: int = 0  # bytes of tensor data per part (0: no limit), as --split-max-size
    split_max_tensors: int = 0  # tensors per part (0: no limit), as --split-max-tensors

    def fingerprint(self, outtype: str) -> str:
        """What decides an output's bytes, hashed: a recorded output made with other settings is redone."""
        settings = {"source": str(self.path or f"{self.repo}@{self.revision or 'main'}"), "outtype": outtype,
                    "imatrix": str(self.imatrix or ""), "arch": self.arch, "model_name": self.model_name,
                    "metadata": self.metadata_digest, "options": self.options, "split": [self.split_max_size, self.split_max_tensors]}
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BatchPlan:
    path: Path
    sources: list[SourceSpec]
    max_memory: int | None = None
    jobs: int | None = None
    threads: int | None = None  # conversion threads of each source

    @property
    def n_outputs(self) -> int:
        return sum(len(s.outtypes) for s in self.sources)


def load_plan(path: str | Path) -> BatchPlan:
    """Read and check a plan file (.yaml/.yml or .toml)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise BatchError(f"{path}: cannot read the plan: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise BatchError(f"{path}: not UTF-8 text; a plan is a YAML or TOML file") from None
    data = _parse(path, text)
    return plan_from_dict(data, path)


def _parse(path: Path, text: str) -> dict[str, Any]:
    if path.suffix.lower() == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise BatchError(f"{path}: not valid TOML: {e}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise BatchError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise BatchError(f"{path}: a plan is a mapping with a `sources` list (see docs/batch.md)")
    return data


def plan_from_dict(data: dict[str, Any], path: Path) -> BatchPlan:
    """A plan from its parsed contents; relative paths are from `path`'s folder."""
    from ggufsmith.converters.plan import all_outtypes

    base = path.resolve().parent
    _check_keys(path, "the plan", data, TOP_KEYS)
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise BatchError(f"{path}: defaults: expected a mapping of source keys")
    _check_keys(path, "defaults", defaults, [k for k in SOURCE_KEYS if k not in ("path", "repo", "revision", "download")])
    raw_sources = data.get("sources")
    if not isinstance(raw_sources, list) or not raw_sources:
        raise BatchError(f"{path}: `sources` must be a non-empty list of sources (each with `path` or `repo`)")
    output_dir = base / _string(path, "the plan", "output_dir", data.get("output_dir", "."))
    known_types = all_outtypes()
    sources = []
    for i, raw in enumerate(raw_sources):
        where = f"sources[{i}]"
        if not isinstance(raw, dict):
            raise BatchError(f"{path}: {where}: expected a mapping with `path` or `repo`, got {raw!r}")
        _check_keys(path, where, raw, SOURCE_KEYS)
        entry = {**{k: v for k, v in data.items() if k in ("name_pattern",)}, **defaults, **raw}
        if ("path" in raw) == ("repo" in raw):
            raise BatchError(f"{path}: {where}: give exactly one of `path` (a model folder) or `repo` (a Hugging Face repo id)")
        outtypes = entry.get("outtypes")
        if isinstance(outtypes, str):
            outtypes = [outtypes]
        if not isinstance(outtypes, list) or not outtypes or not all(isinstance(o, str) for o in outtypes):
            raise BatchError(f"{path}: {where}: `outtypes` must be a non-empty list of output types, e.g. [f16, q4_k_m]")
        outtypes = [o.lower() for o in outtypes]
        for o in outtypes:
            if o not in known_types:
                raise BatchError(f"{path}: {where}: unknown output type {o!r}; choose from {', '.join(known_types)}")
        if len(set(outtypes)) != len(outtypes):
            raise BatchError(f"{path}: {where}: an output type is listed twice in {outtypes}")
        spec = SourceSpec(
            index=i, label=str(raw.get("path") or raw.get("repo")), outtypes=outtypes,
            output_dir=base / _string(path, where, "output_dir", entry["output_dir"]) if "output_dir" in entry else output_dir,
            name_pattern=_optional_string(path, where, "name_pattern", entry.get("name_pattern")),
            arch=_optional_string(path, where, "arch", entry.get("arch")),
            model_name=_optional_string(path, where, "model_name", entry.get("model_name")),
            options=_options(path, where, entry.get("options") or {}),
            outputs=_outputs(path, where, entry.get("outputs") or {}, outtypes),
        )
        if "path" in raw:
            spec.path = base / _string(path, where, "path", raw["path"])
        else:
            spec.repo = _string(path, where, "repo", raw["repo"])
            if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", spec.repo):
                raise BatchError(f"{path}: {where}: repo {spec.repo!r} is not a Hugging Face repo id like org/name")
            spec.revision = _optional_string(path, where, "revision", raw.get("revision"))
            spec.download = bool(raw.get("download", False))
        if entry.get("imatrix") is not None:
            spec.imatrix = base / _string(path, where, "imatrix", entry["imatrix"])
        if entry.get("metadata") is not None:
            spec.metadata = base / _string(path, where, "metadata", entry["metadata"])
            spec.metadata_digest = _metadata_digest(path, where, spec.metadata)
        spec.split_max_size, spec.split_max_tensors = _split_limits(path, where, entry)
        if spec.name_pattern is not None:
            _check_pattern(path, where, spec.name_pattern)
        sources.append(spec)
    plan = BatchPlan(path, sources, max_memory=parse_size(data.get("max_memory"), f"{path}: max_memory"),
                     jobs=_optional_int(path, "jobs", data.get("jobs")),
                     threads=_optional_int(path, "threads", data.get("threads")))
    return plan


def _check_keys(path: Path, where: str, mapping: dict, allowed) -> None:
    for key in mapping:
        if key not in allowed:
            raise BatchError(f"{path}: {where}: unknown key {key!r}; known keys: {', '.join(allowed)}")


def _string(path: Path, where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BatchError(f"{path}: {where}: `{key}` must be a non-empty string, got {value!r}")
    return value


def _optional_string(path: Path, where: str, key: str, value: Any) -> str | None:
    return None if value is None else _string(path, where, key, value)


def _metadata_digest(path: Path, where: str, metadata: Path) -> str:
    """The sha256 of a source's --metadata file, once its keys are checked as `convert` checks them."""
    from ggufsmith.converters.general_metadata import read_metadata_overrides
    from ggufsmith.errors import ConversionError, one_line

    try:
        read_metadata_overrides(metadata)
        return hashlib.sha256(metadata.read_bytes()).hexdigest()
    except (ConversionError, OSError) as e:
        raise BatchError(f"{path}: {where}: metadata: {one_line(e)}") from None


def _split_limits(path: Path, where: str, entry: dict[str, Any]) -> tuple[int, int]:
    """split_max_size (4G, 500M, or bytes: powers of 1000 as --split-max-size) and split_max_tensors."""
    from ggufsmith.converters.split import parse_split_size
    from ggufsmith.errors import ConversionError

    size, tensors = entry.get("split_max_size", 0), entry.get("split_max_tensors", 0)
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
        try:
            size = parse_split_size(str(size))
        except ConversionError:
            raise BatchError(f"{path}: {where}: split_max_size {size!r}: expected a number of bytes, optionally "
                             "followed by K, M or G (powers of 1000), e.g. 4G") from None
    if isinstance(tensors, bool) or not isinstance(tensors, int) or tensors < 0:
        raise BatchError(f"{path}: {where}: split_max_tensors must be a whole number of at least 1, got {tensors!r}")
    return size, tensors


def _optional_int(path: Path, key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BatchError(f"{path}: `{key}` must be a whole number of at least 1, got {value!r}")
    return value


def _options(path: Path, where: str, options: Any) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise BatchError(f"{path}: {where}: `options` must be a mapping of preset options ({', '.join(PRESET_OPTIONS)})")
    _check_keys(path, f"{where}.options", options, PRESET_OPTIONS)
    for key in ("pure", "leave_output_tensor"):
        if key in options and not isinstance(options[key], bool):
            raise BatchError(f"{path}: {where}.options.{key}: expected true or false, got {options[key]!r}")
    for key in ("override_kv", "include_weights", "exclude_weights"):
        if key in options and not (isinstance(options[key], list) and all(isinstance(v, str) for v in options[key])):
            raise BatchError(f"{path}: {where}.options.{key}: expected a list of strings")
    tensor_types = options.get("tensor_types")
    if isinstance(tensor_types, dict):  # {attn_v: q8_0} as well as ["attn_v=q8_0"]
        options = {**options, "tensor_types": [f"{k}={v}" for k, v in tensor_types.items()]}
    elif tensor_types is not None and not (isinstance(tensor_types, list) and all(isinstance(v, str) for v in tensor_types)):
        raise BatchError(f"{path}: {where}.options.tensor_types: expected a mapping PATTERN: TYPE or a list of PATTERN=TYPE")
    try:
        quantize_args(options)  # the same checks as convert's flags
    except Exception as e:  # argparse's ArgumentTypeError and the quantizer's own errors
        raise BatchError(f"{path}: {where}.options: {' '.join(str(e).split())}") from None
    return options


def quantize_args(options: dict[str, Any]):
    """`options` as the argparse namespace convert's preset flags give (for cli.quantize.build_request)."""
    from argparse import Namespace

    from ggufsmith.cli.quantize import ggml_type_arg, tensor_type_arg

    def type_or_none(key: str):
        return ggml_type_arg(options[key]) if options.get(key) else None

    return Namespace(
        imatrix=None, include_weights=list(options.get("include_weights", [])),
        exclude_weights=list(options.get("exclude_weights", [])), pure=bool(options.get("pure", False)),
        output_tensor_type=type_or_none("output_tensor_type"), token_embedding_type=type_or_none("token_embedding_type"),
        leave_output_tensor=bool(options.get("leave_output_tensor", False)),
        tensor_type=[tensor_type_arg(text) for text in options.get("tensor_types", [])],
        override_kv=list(options.get("override_kv", [])), prune_layers=[],
    )


def _outputs(path: Path, where: str, outputs: Any, outtypes: list[str]) -> dict[str, str]:
    if not isinstance(outputs, dict):
        raise BatchError(f"{path}: {where}: `outputs` must map an output type to a file name")
    named = {}
    for outtype, name in outputs.items():
        if str(outtype).lower() not in outtypes:
            raise BatchError(f"{path}: {where}.outputs: {outtype!r} is not one of this source's outtypes {outtypes}")
        named[str(outtype).lower()] = _string(path, f"{where}.outputs", str(outtype), name)
    return named


def _check_pattern(path: Path, where: str, pattern: str) -> None:
    for name in re.findall(r"{([^{}]*)}", pattern):
        if name not in PATTERN_FIELDS:
            raise BatchError(f"{path}: {where}: name_pattern field {{{name}}} is unknown; use {', '.join(PATTERN_FIELDS)}")


def parse_size(value: Any, what: str) -> int | None:
    """A byte count: a number, or "8GiB", "8G", "512M" (binary units)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", str(value), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise BatchError(f"{what}: {value!r} is not a memory size like 8GiB, 8G or 512M")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
