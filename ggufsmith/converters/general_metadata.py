"""The general.* keys of a converted model: who made it, what it is called, how large it is.

Sources, in the precedence llama.cpp's converter uses so that both tools name a model alike:
the model card's YAML front matter (README.md), then the model id in config.json's
`_name_or_path` (only when it looks like "org/name", not a local path), then the folder name.
A model id such as "Mistral-7B-Instruct-v0.2" is split into basename, size label, finetune and
version. Recommended sampling settings come from generation_config.json.

A value of the wrong type in generation_config.json is an error naming the key (the file configures
the model's use); in the model card it is a warning and the key is left out (the card is prose
metadata, see readers/model_card.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ggufsmith.constants import GGUFValueType, Keys
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.jsonfile import read_json, shown
from ggufsmith.readers.model_card import ModelCard

G = Keys.General


@dataclass
class ModelId:
    """The parts of a model id like "TinyLlama/TinyLlama-1.1B-Chat-v1.0"."""

    name: str | None = None
    organization: str | None = None
    basename: str | None = None
    finetune: str | None = None
    version: str | None = None
    size_label: str | None = None


def title_case(text: str) -> str:
    """"tiny-llama v1.0" -> "Tiny Llama v1.0": capitalize lowercase words, keep versions and acronyms."""
    words = text.strip().replace("-", " ").split()
    return " ".join(
        w.title() if w.islower() and not re.fullmatch(r"v\d+(\.\d+)*|\d.*", w) else w for w in words
    )


_VERSION = re.compile(r"(v|iter)?\d+(\.\d+)*", re.IGNORECASE)
_QUANT_TYPE = re.compile(r"i?q\d(_\w)*|b?fp?(16|32)", re.IGNORECASE)
_SIZE = re.compile(r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)", re.IGNORECASE)
_FINETUNE_WORDS = re.compile(r"chat|instruct|vision|lora", re.IGNORECASE)


def parse_model_id(model_id: str | None, total_params: int = 0) -> ModelId:
    if not model_id:
        return ModelId()
    if " " in model_id:  # a human-written name, not an id
        return ModelId(name=model_id)
    org, _, full_name = model_id.rpartition("/") if "/" in model_id else (None, "", model_id)
    if org is not None and (not org or org.startswith(".")):
        org = None
    parts = [p for p in full_name.split("-") if p]
    kinds: list[set[str]] = [set() for _ in parts]
    for i, part in enumerate(parts):
        if _VERSION.fullmatch(part):
            kinds[i].add("version")
        elif _QUANT_TYPE.fullmatch(part):
            kinds[i].add("type")
            parts[i] = part.upper()
        elif i > 0 and _SIZE.fullmatch(part):
            parts[i], kind = _size_part(part, total_params)
            kinds[i].add(kind)
        elif i > 0 and _FINETUNE_WORDS.fullmatch(part):
            kinds[i].add("finetune")
    # A numeric size label wins over word ones ("small", "xl").
    if any(c.isdigit() for p, k in zip(parts, kinds) if "size_label" in k for c in p):
        for p, k in zip(parts, kinds):
            if "size_label" in k and p.isalpha():
                k.discard("size_label")
    # The basename is the run of plain words (and versions) at the start; later plain words are finetunes.
    at_start = True
    for p, k in zip(parts, kinds):
        if at_start and ((not k and p[0].isalpha()) or "version" in k):
            k.add("basename")
        else:
            at_start = False
            if not k:
                k.add("finetune")
    for k in reversed(kinds):  # a trailing version belongs to the version, not the basename
        if "basename" in k and len(k) > 1:
            k.discard("basename")
        else:
            break

    def joined(kind: str, exclude: str | None = None) -> str | None:
        picked = [p for p, k in zip(parts, kinds) if kind in k and (exclude is None or exclude not in k)]
        return "-".join(dict.fromkeys(picked) if kind == "size_label" else picked) or None

    result = ModelId(
        name=full_name, organization=org, basename=joined("basename"), finetune=joined("finetune"),
        version=joined("version", exclude="basename"), size_label=joined("size_label"),
    )
    if result.size_label is None and result.finetune is None and result.version is None:
        result.basename = None  # too little structure to tell the basename apart
    return result


def _size_part(part: str, total_params: int) -> tuple[str, str]:
    """Normalize a size like "7b" / "1_1B" / "7b1"; a size far from the real one is a context length."""
    part = part.replace("_", ".")
    if part[-1].isdigit():  # bloom's "7b1" means 7.1B
        part = part[:-2] + "." + part[-1] + part[-2]
    if len(part) > 1 and part[-2].isdigit() and part[-1] in "kmbt":
        part = part[:-1] + part[-1].upper()
    if total_params > 0:
        try:
            claimed = float(part[:-1]) * 1000 ** " KMBT".index(part[-1])
        except ValueError:
            return part, "size_label"
        if abs(claimed - total_params) > 7 * total_params // 8:
            return part[:-1] + part[-1].lower(), "finetune"  # e.g. "32k" context
    return part, "size_label"


def rounded_count(n: int, min_digits: int = 2) -> str:
    """1_100_048_384 -> "1.1B", 124_000_000 -> "124M", 4_600 -> "4.6K"."""
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n > threshold:
            scaled = n / threshold
            break
    else:
        scaled, suffix = n / 1e3, "K"
    decimals = max(min_digits - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{decimals}f}{suffix}"


@dataclass
class ParameterCount:
    total: int = 0
    shared: int = 0
    expert: int = 0  # parameters of one expert, summed over the expert tensors
    expert_count: int = 0

    def size_label(self) -> str:
        if self.expert_count:
            return f"{self.expert_count}x{rounded_count(self.shared + self.expert)}"
        return rounded_count(self.total)


def count_parameters(tensors: list[tuple[str, tuple[int, ...]]]) -> ParameterCount:
    """Count parameters of the output tensors; stacked expert tensors ("*_exps.*") count once per expert."""
    count = ParameterCount()
    expert_sum = expert_tensors = 0
    for name, shape in tensors:
        size = 1
        for d in shape:
            size *= d
        if "_exps." in name and len(shape) >= 3:
            n_expert = shape[-2] if ".bias" in name else shape[-3]
            count.expert += size // n_expert
            expert_sum += n_expert
            expert_tensors += 1
        else:
            count.shared += size
        count.total += size
    if expert_tensors:
        count.expert_count = expert_sum // expert_tensors
    return count


def _hub_reference(ref: str | dict[str, str], total_params: int) -> dict[str, str]:
    """A base model or data set named in the model card, as name/organization/version/repo_url."""
    if isinstance(ref, dict):
        return ref
    entry: dict[str, str] = {}
    hub_id = ref
    if ref.startswith(("http://", "https://", "ssh://")):
        entry["repo_url"] = ref
        m = re.match(r"https?://huggingface.co/([^/]+/[^/]+)$", ref)
        if not m:
            return entry
        hub_id = m.group(1)
    local_path = _is_local_path(hub_id)
    if local_path:  # a card written on the trainer's machine: the folder's name, no Hub id to link to
        hub_id = hub_id.replace("\\", "/").rstrip("/").rpartition("/")[2]
    parsed = parse_model_id(hub_id, total_params)
    if parsed.name:
        entry["name"] = title_case(parsed.name)
    if parsed.organization:
        entry["organization"] = title_case(parsed.organization)
    if parsed.version:
        entry["version"] = parsed.version
    if "repo_url" not in entry and parsed.organization and parsed.name and not local_path:
        entry["repo_url"] = f"https://huggingface.co/{parsed.organization}/{parsed.name}"
    return entry


def _is_local_path(ref: str) -> bool:
    """A folder on some disk rather than a Hub id "Org/Model" (which has at most one slash)."""
    return ref.startswith(("/", ".", "~", "\\")) or ref.count("/") > 1 or re.match(r"[A-Za-z]:[\\/]", ref) is not None


_SAMPLING = (  # generation_config.json name(s) -> key, type
    (("sequence",), G.SAMPLING_SEQUENCE, GGUFValueType.STRING),
    (("top_k",), G.SAMPLING_TOP_K, GGUFValueType.INT32),
    (("top_p",), G.SAMPLING_TOP_P, GGUFValueType.FLOAT32),
    (("min_p",), G.SAMPLING_MIN_P, GGUFValueType.FLOAT32),
    (("xtc_probability",), G.SAMPLING_XTC_PROBABILITY, GGUFValueType.FLOAT32),
    (("xtc_threshold",), G.SAMPLING_XTC_THRESHOLD, GGUFValueType.FLOAT32),
    (("temperature",), G.SAMPLING_TEMP, GGUFValueType.FLOAT32),
    (("penalty_last_n",), G.SAMPLING_PENALTY_LAST_N, GGUFValueType.INT32),
    (("penalty_repeat", "repetition_penalty"), G.SAMPLING_PENALTY_REPEAT, GGUFValueType.FLOAT32),
    (("mirostat",), G.SAMPLING_MIROSTAT, GGUFValueType.INT32),
    (("mirostat_tau",), G.SAMPLING_MIROSTAT_TAU, GGUFValueType.FLOAT32),
    (("mirostat_eta",), G.SAMPLING_MIROSTAT_ETA, GGUFValueType.FLOAT32),
)


GENERATION_CONFIG = "generation_config.json"
_INT32_RANGE = range(-(2**31), 2**31)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _read_sampling(path: Path) -> dict[str, Any]:
    """key -> value: the recommended sampling settings of generation_config.json, each checked for type and range."""
    if not path.is_file():
        return {}
    generation = read_json(path)
    found = {}
    for names, key, vtype in _SAMPLING:
        name = next((n for n in names if generation.get(n) is not None), None)
        if name is not None:
            found[key] = _sampling_value(path, name, generation[name], vtype)
    return found


def _sampling_value(path: Path, name: str, value: Any, vtype: GGUFValueType) -> Any:
    if vtype == GGUFValueType.STRING:
        if isinstance(value, str):
            return value
        expected = "a string"
    elif vtype == GGUFValueType.INT32:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 40.0 is 40: some tools write every number as a float
        if isinstance(value, int) and not isinstance(value, bool) and value in _INT32_RANGE:
            return value
        expected = "an integer (32-bit)"
    else:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= _FLOAT32_MAX:
            return float(value)
        expected = "a finite number within float32 range"
    raise ConversionError(f"{path}: {name} is {shown(value)}, expected {expected}; fix or remove it")


def general_metadata(model_dir: Path, config: dict[str, Any], params: ParameterCount, name: str | None = None,
                     overrides: MetadataOverrides | None = None, repo_id: str | None = None) -> Metadata:
    """general.type, the sampling settings and the authorship keys, in llama.cpp's order.

    `overrides` (--metadata FILE) replace what the model card, config and folder name give;
    `name` (--model-name) wins over both. `repo_id`: the Hub id the folder was found by (a cache
    snapshot's folder is named by a commit hash), used in place of the folder's name."""
    model_dir = Path(model_dir)
    card = ModelCard.from_dir(model_dir)
    found: dict[str, Any] = {}

    def take(field_name: str, value: Any) -> None:
        if value is not None and found.get(field_name) is None:
            found[field_name] = value

    for field_name, keys in (
        ("name", ("name", "model_name")), ("author", ("author", "model_author", "model_creator")),
        ("version", ("version", "model_version")), ("organization", ("organization", "model_organization")),
        ("description", ("description", "model_description")), ("finetune", ("finetune", "model_finetune")),
        ("basename", ("basename", "model_basename", "model_type")), ("size_label", ("size_label", "model_size_label")),
        ("source_url", ("url", "model_url")), ("source_doi", ("doi", "model_doi")),
        ("source_uuid", ("uuid", "model_uuid")), ("source_repo_url", ("repo_url", "model_repo_url")),
        ("license_name", ("license_name",)), ("license_link", ("license_link",)),
    ):
        take(field_name, card.text(*keys))
    take("license", card.text("license", allow_list=True))

    name_or_path = config.get("_name_or_path")
    ids = []
    if isinstance(name_or_path, str) and not _is_local_path(name_or_path):
        ids.append(name_or_path)
    folder_name = repo_id or model_dir.resolve().name
    ids.append(folder_name)
    for model_id in ids:
        parsed = parse_model_id(model_id, params.total)
        take("name", title_case(parsed.name) if parsed.name else None)
        take("organization", title_case(parsed.organization) if parsed.organization else None)
        for attr in ("basename", "finetune", "version", "size_label"):
            take(attr, getattr(parsed, attr))
    overrides = overrides or MetadataOverrides()
    found.update(overrides.fields)
    if name is not None:
        found["name"] = name
    if found.get("name") is None:
        found["name"] = folder_name
    if found.get("size_label") is None and params.total > 0:
        found["size_label"] = params.size_label()

    md = Metadata()
    md.add_string(G.TYPE, "model")
    sampling = _read_sampling(model_dir / GENERATION_CONFIG) | overrides.sampling
    for _, key, vtype in _SAMPLING:
        if key in sampling:
            md.add(key, sampling[key], vtype)
    for field_name, key in (
        ("name", G.NAME), ("author", G.AUTHOR), ("version", G.VERSION), ("organization", G.ORGANIZATION),
        ("finetune", G.FINETUNE), ("basename", G.BASENAME), ("description", G.DESCRIPTION),
        ("quantized_by", G.QUANTIZED_BY), ("size_label", G.SIZE_LABEL),
    ):
        if found.get(field_name) is not None:
            md.add_string(key, str(found[field_name]))
    license_ = found.get("license")
    if license_ is not None:
        md.add_string(G.LICENSE, ",".join(license_) if isinstance(license_, list) else str(license_))
    for field_name, key in (
        ("license_name", G.LICENSE_NAME), ("license_link", G.LICENSE_LINK), ("url", G.URL), ("doi", G.DOI),
        ("uuid", G.UUID), ("repo_url", G.REPO_URL), ("source_url", G.SOURCE_URL),
        ("source_doi", G.SOURCE_DOI), ("source_uuid", G.SOURCE_UUID), ("source_repo_url", G.SOURCE_REPO_URL),
    ):
        if found.get(field_name) is not None:
            md.add_string(key, str(found[field_name]))
    lists = overrides.lists
    base_models = lists.get("base_models", card.references("base_model", "base_models", "base_model_sources"))
    _add_references(md, base_models, G.BASE_MODEL_COUNT, _BASE_MODEL_KEYS, params.total)
    datasets = lists.get("datasets", card.references("datasets", "dataset", "dataset_sources"))
    _add_references(md, datasets, G.DATASET_COUNT, _DATASET_KEYS, params.total)
    tags = lists.get("tags", card.texts("tags", "pipeline_tag"))
    if tags:
        md.add_array(G.TAGS, tags, GGUFValueType.STRING)
    languages = lists.get("languages", card.texts("languages", "language"))
    if languages:
        md.add_array(G.LANGUAGES, languages, GGUFValueType.STRING)
    return md


_REFERENCE_FIELDS = ("name", "author", "version", "organization", "description", "url", "doi", "uuid", "repo_url")
_BASE_MODEL_KEYS = {f: getattr(G, f"BASE_MODEL_{f.upper()}") for f in _REFERENCE_FIELDS}
_DATASET_KEYS = {f: getattr(G, f"DATASET_{f.upper()}") for f in _REFERENCE_FIELDS}


def _add_references(md: Metadata, refs: list, count_key: str, key_templates: dict[str, str], total_params: int) -> None:
    if not refs:
        return
    md.add_uint32(count_key, len(refs))
    for i, ref in enumerate(refs):
        entry = _hub_reference(ref, total_params)
        for field_name, template in key_templates.items():
            if field_name in entry:
                md.add_string(template.format(id=i), entry[field_name])


# -- --metadata FILE ------------------------------------------------------------------------------
# llama.cpp's converter reads a JSON object of general.* keys that replace what it found in the
# model card, config and folder name (gguf-py's Metadata.load). The same keys, with the same
# effect: a key replaces the value found, --model-name still wins over general.name, and
# general.license is not among them. A key llama.cpp does not know is refused here, naming it,
# where llama.cpp would silently drop it (a misspelt key would otherwise pass unnoticed).

_OVERRIDE_FIELDS = {  # key -> field of `found` in general_metadata
    G.NAME: "name", G.AUTHOR: "author", G.VERSION: "version", G.ORGANIZATION: "organization",
    G.FINETUNE: "finetune", G.BASENAME: "basename", G.DESCRIPTION: "description", G.QUANTIZED_BY: "quantized_by",
    G.SIZE_LABEL: "size_label", G.LICENSE_NAME: "license_name", G.LICENSE_LINK: "license_link", G.URL: "url",
    G.DOI: "doi", G.UUID: "uuid", G.REPO_URL: "repo_url", G.SOURCE_URL: "source_url", G.SOURCE_DOI: "source_doi",
    G.SOURCE_UUID: "source_uuid", G.SOURCE_REPO_URL: "source_repo_url",
}
_OVERRIDE_LISTS = {"general.base_models": "base_models", "general.datasets": "datasets", G.TAGS: "tags",
                   G.LANGUAGES: "languages"}
_SAMPLING_TYPES = {key: vtype for _, key, vtype in _SAMPLING}


@dataclass
class MetadataOverrides:
    """The contents of a --metadata file, checked: authorship fields, sampling keys and lists."""

    fields: dict[str, str] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    lists: dict[str, list] = field(default_factory=dict)


def read_metadata_overrides(path: str | Path) -> MetadataOverrides:
    """The --metadata JSON file; a value of the wrong type or an unknown key is an error naming it."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: expected a JSON object of general.* keys, found {type(data).__name__}")
    overrides = MetadataOverrides()
    for key, value in data.items():
        if key in _OVERRIDE_FIELDS:
            if not isinstance(value, str):
                raise ConversionError(f"{path}: {key} is {shown(value)}, expected a string")
            overrides.fields[_OVERRIDE_FIELDS[key]] = value
        elif key in _SAMPLING_TYPES:
            overrides.sampling[key] = _sampling_value(path, key, value, _SAMPLING_TYPES[key])
        elif key in _OVERRIDE_LISTS:
            overrides.lists[_OVERRIDE_LISTS[key]] = _override_list(path, key, value)
        else:
            known = ", ".join(sorted([*_OVERRIDE_FIELDS, *_SAMPLING_TYPES, *_OVERRIDE_LISTS]))
            raise ConversionError(f"{path}: unknown key {key!r}; the keys llama.cpp's --metadata accepts are: {known}")
    return overrides


def apply_metadata_overrides(md: Metadata, overrides: MetadataOverrides, total_params: int) -> None:
    """--metadata on the keys of an existing model (quantize): each key the file gives replaces the
    model's, with the value and type `convert --metadata` writes; an empty list removes its keys."""
    key_of_field = {field_name: key for key, field_name in _OVERRIDE_FIELDS.items()}
    for field_name, value in overrides.fields.items():
        md.replace(key_of_field[field_name], value, GGUFValueType.STRING)
    for key, value in overrides.sampling.items():
        md.replace(key, value, _SAMPLING_TYPES[key])
    lists = overrides.lists
    for key, name in ((G.TAGS, "tags"), (G.LANGUAGES, "languages")):
        if name in lists:
            if key in md:
                md.remove(key)
            if lists[name]:
                md.add_array(key, lists[name], GGUFValueType.STRING)
    for name, count_key, templates in (("base_models", G.BASE_MODEL_COUNT, _BASE_MODEL_KEYS),
                                       ("datasets", G.DATASET_COUNT, _DATASET_KEYS)):
        if name in lists:
            prefix = count_key.removesuffix("count")  # general.base_model.: the count and every entry's keys
            for key in [k for k in md if k.startswith(prefix)]:
                md.remove(key)
            _add_references(md, lists[name], count_key, templates, total_params)


def _override_list(path: Path, key: str, value: Any) -> list:
    if not isinstance(value, list):
        raise ConversionError(f"{path}: {key} is {shown(value)}, expected a list")
    if key in (G.TAGS, G.LANGUAGES):
        if not all(isinstance(v, str) for v in value):
            raise ConversionError(f"{path}: {key} must be a list of strings")
        return value
    for entry in value:  # base models and data sets: objects of name, organization, repo_url, ...
        if not isinstance(entry, dict) or not all(k in _REFERENCE_FIELDS and isinstance(v, str) for k, v in entry.items()):
            raise ConversionError(f"{path}: each entry of {key} must be an object of strings with the keys "
                                  f"{', '.join(_REFERENCE_FIELDS)}; found {shown(entry)}")
    return value
