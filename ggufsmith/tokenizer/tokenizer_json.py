"""Reading a Hugging Face tokenizer.json from a stranger: every part the exporter uses is checked
for its JSON type once, here, so that the exporters can read it without guarding each access.

A part of the wrong type (a vocabulary that is a list, a merge that is a number, a pre-tokenizer
that is a string, JSON nested 100,000 levels deep) is one TokenizerError naming the file and the
key, e.g. "tokenizer.json: model.vocab['hello'] must be a token id". Parts the exporter never reads
are not checked: transformers' schema grows, and what we do not use cannot break us.

    from ggufsmith.tokenizer import load_tokenizer_json
    tokenizer_json = load_tokenizer_json(Path("model/tokenizer.json"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ggufsmith.errors import TokenizerError

from .hf_files import get_typed, read_json_object, token_id, tokenizer_json_added_tokens, typed

# The fields of normalizer / pre-tokenizer / decoder / post-processor steps that the exporter reads,
# with their JSON types. Unlisted fields are not read.
_STEP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "type": str,
    "add_prefix_space": bool,
    "use_regex": bool,
    "trim_offsets": bool,
    "individual_digits": bool,
    "behavior": str,
    "invert": bool,
    "pattern": dict,
    "replacement": str,
    "prepend_scheme": str,
    "split": bool,
    "prepend": str,
    "content": str,
    "single": list,
    "pair": list,
    "lowercase": bool,  # BertNormalizer
    "strip_accents": bool,
    "handle_chinese_chars": bool,
    "clean_text": bool,
}
_SEQUENCE_LISTS = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "decoder": "decoders",
                   "post_processor": "processors"}
_MODEL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "type": str,
    "byte_fallback": bool,
    "ignore_merges": bool,
    "fuse_unk": bool,
    "dropout": (int, float),
    "unk_token": str,
    "continuing_subword_prefix": str,
    "end_of_word_suffix": str,
    "merges": list,
    "max_input_chars_per_word": int,
}


def load_tokenizer_json(path: Path) -> dict[str, Any]:
    """tokenizer.json at `path`, parsed and checked ({} when the file does not exist)."""
    path = Path(path)
    data = read_json_object(path)
    check_tokenizer_json(data, path)
    return data


def check_tokenizer_json(data: dict[str, Any], path: Path) -> None:
    """Raise TokenizerError naming `path` and the key for any part of the wrong JSON type."""
    model = get_typed(data, "model", dict, path, default={})
    for key, expected in _MODEL_FIELDS.items():
        get_typed(model, key, expected, path, prefix="model.")
    if model.get("type", "BPE") in ("BPE", "WordPiece"):  # Unigram's vocab is a list of [piece, score]
        vocab = get_typed(model, "vocab", dict, path, default={}, prefix="model.")
        for text, value in vocab.items():
            token_id(value, path, f"model.vocab[{text!r:.40}]")
    tokenizer_json_added_tokens(data, path)
    for part in _SEQUENCE_LISTS:
        for step in component_steps(data.get(part), _SEQUENCE_LISTS[part], path, part):
            _check_step(step, path, part)


# Sequences inside Sequences are flattened up to this depth (real files nest one or two levels).
_MAX_SEQUENCE_DEPTH = 8


def component_steps(component: Any, list_name: str, path: Path, key: str, depth: int = 0) -> list[dict[str, Any]]:
    """The steps of a normalizer / pre-tokenizer / decoder / post-processor: one, or the flattened
    list of a Sequence; each a JSON object with a string "type". [] for none."""
    component = typed(component, dict, path, key)
    if not component:
        return []
    kind = get_typed(component, "type", str, path, prefix=f"{key}.")
    if kind is None:
        raise TokenizerError(f"{path}: {key} has no \"type\"")
    if kind != "Sequence":
        return [component]
    if depth >= _MAX_SEQUENCE_DEPTH:
        raise TokenizerError(f"{path}: {key} nests Sequences more than {_MAX_SEQUENCE_DEPTH} deep")
    steps = get_typed(component, list_name, list, path, default=[], prefix=f"{key}.")
    flat: list[dict[str, Any]] = []
    for i, step in enumerate(steps):
        where = f"{key}.{list_name}[{i}]"
        if step is None:
            raise TokenizerError(f"{path}: {where} must be a JSON object, found a JSON null")
        flat += component_steps(step, list_name, path, where, depth + 1)
    return flat


def _check_step(step: dict[str, Any], path: Path, part: str) -> None:
    where = f"{part} step {step['type']}"
    for field, expected in _STEP_FIELDS.items():
        get_typed(step, field, expected, path, prefix=f"{where}: ")
    for kind, value in (step.get("pattern") or {}).items():
        typed(value, str, path, f"{where}: pattern.{kind}")
    for template in ("single", "pair"):
        for i, piece in enumerate(step.get(template) or []):
            piece = typed(piece, dict, path, f"{where}: {template}[{i}]") or {}
            for kind in ("SpecialToken", "Sequence"):
                part = get_typed(piece, kind, dict, path, default={}, prefix=f"{where}: {template}[{i}].")
                get_typed(part, "id", str, path, prefix=f"{where}: {template}[{i}].{kind}.")
