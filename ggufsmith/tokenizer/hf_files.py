"""Reading the JSON files of a Hugging Face tokenizer directory, with errors that name the file.

These files come from strangers: every value is type-checked where it is read (`typed`), so a part
of the wrong JSON type is one error naming the file and the key, never a foreign exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ggufsmith.errors import TokenizerError
from ggufsmith.readers.jsonfile import read_json as _read_json_file

TOKENIZER_MODEL = "tokenizer.model"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
ADDED_TOKENS = "added_tokens.json"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
CHAT_TEMPLATE_JSON = "chat_template.json"

# No real vocabulary comes near this many tokens (the largest have ~262k, 8 times fewer): a larger
# id in a tokenizer file is damage, and would make the exporter pad its token list to that length.
MAX_TOKEN_ID = (1 << 21) - 1


def read_json(path: Path) -> Any:
    """The parsed content of `path`, or None if it does not exist."""
    if not path.is_file():
        return None
    return _read_json_file(path, TokenizerError, expect=None)


def read_json_object(path: Path) -> dict[str, Any]:
    """Like read_json, but {} for a missing file and an error for anything but an object."""
    if not path.is_file():
        return {}
    return _read_json_file(path, TokenizerError, expect=dict)


_JSON_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def _json_name(value_or_type: Any) -> str:
    kind = value_or_type if isinstance(value_or_type, type) else type(value_or_type)
    return "null" if value_or_type is None else _JSON_NAMES.get(kind, kind.__name__)


def typed(value: Any, expected: type | tuple[type, ...], where: Path | str, key: str) -> Any:
    """`value` if it is of the `expected` JSON type(s) (None, JSON null, always passes: absent);
    else one error naming the file `where` and the `key`. A boolean is never an integer here."""
    if value is None:
        return None
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds)
    if not ok:
        wanted = " or ".join(_json_name(kind) for kind in kinds)
        raise TokenizerError(f"{where}: {key} must be a JSON {wanted}, found a JSON {_json_name(value)}")
    return value


def get_typed(data: dict[str, Any], key: str, expected: type | tuple[type, ...], where: Path | str,
              default: Any = None, prefix: str = "") -> Any:
    """data[key] type-checked as by `typed`; `default` when absent or null. `prefix` names the
    enclosing part in the error ("model.")."""
    value = typed(data.get(key), expected, where, prefix + key)
    return default if value is None else value


def token_id(value: Any, where: Path | str, key: str) -> int:
    """A token id: an integer (or its decimal string, as in added_tokens_decoder's keys) in range."""
    if isinstance(value, str) and value.isascii() and value.isdecimal() and len(value) < 10:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKEN_ID:
        raise TokenizerError(f"{where}: {key} is {value!r:.40}, not a token id (0 to {MAX_TOKEN_ID})")
    return value


@dataclass(frozen=True)
class AddedToken:
    """An added token as tokenizer.json, tokenizer_config.json or added_tokens.json declares it."""

    id: int
    content: str
    special: bool | None  # None: the file does not say (added_tokens.json)
    strips_spaces: bool = False  # lstrip or rstrip: transformers removes the spaces beside it


def _added_token(item: Any, token_id_value: Any, where: Path, key: str) -> AddedToken:
    item = typed(item, dict, where, key)
    if item is None:
        raise TokenizerError(f"{where}: {key} must be a JSON object, found a JSON null")
    content = get_typed(item, "content", str, where, prefix=f"{key}.")
    if not content:
        raise TokenizerError(f"{where}: {key} has no content")
    flags = {name: get_typed(item, name, bool, where, prefix=f"{key}.") for name in ("special", "lstrip", "rstrip")}
    return AddedToken(token_id(token_id_value, where, f"{key}.id"), content, bool(flags["special"]),
                      bool(flags["lstrip"] or flags["rstrip"]))


def tokenizer_json_added_tokens(tokenizer_json: dict[str, Any], where: Path) -> list[AddedToken]:
    """tokenizer.json's "added_tokens": [{"id", "content", "special", "lstrip", "rstrip", ...}]."""
    items = get_typed(tokenizer_json, "added_tokens", list, where, default=[])
    return [_added_token(item, item.get("id") if isinstance(item, dict) else None, where, f"added_tokens[{i}]")
            for i, item in enumerate(items)]


def config_added_tokens(tokenizer_config: dict[str, Any], where: Path) -> list[AddedToken]:
    """tokenizer_config.json's "added_tokens_decoder": {"<id>": {"content", "special", ...}}."""
    decoder = get_typed(tokenizer_config, "added_tokens_decoder", dict, where, default={})
    return [_added_token(item, key, where, f"added_tokens_decoder[{key!r:.40}]") for key, item in decoder.items()]


def added_tokens_file(path: Path) -> list[AddedToken]:
    """added_tokens.json: {"<content>": id}; [] when absent."""
    if not path.is_file():
        return []
    data = read_json_object(path)
    if "" in data:
        raise TokenizerError(f"{path}: an added token has empty text (id {data['']!r:.20})")
    return [AddedToken(token_id(value, path, repr(content)[:40]), content, None) for content, value in data.items()]


@dataclass
class TokenizerFiles:
    """The small config files every tokenizer kind consults (tokenizer.json is read by who needs it)."""

    model_dir: Path
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    special_tokens_map: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, model_dir: Path) -> TokenizerFiles:
        return cls(
            model_dir=model_dir,
            tokenizer_config=read_json_object(model_dir / TOKENIZER_CONFIG),
            special_tokens_map=read_json_object(model_dir / SPECIAL_TOKENS_MAP),
            config=read_json_object(model_dir / CONFIG),
            generation_config=read_json_object(model_dir / GENERATION_CONFIG),
        )


    @property
    def model_type(self) -> str | None:
        """config.json's model_type (of its text model, for a multimodal checkpoint)."""
        text_config = self.config.get("text_config")
        value = self.config.get("model_type")
        if isinstance(text_config, dict) and isinstance(text_config.get("model_type"), str):
            value = text_config["model_type"]
        return value if isinstance(value, str) else None


def token_content(entry: Any, where: Path, key: str) -> str | None:
    """The text of a special-token entry: a plain string or an AddedToken dict {"content": ...}."""
    entry = typed(entry, (str, dict), where, key)
    if isinstance(entry, dict):
        return get_typed(entry, "content", str, where, prefix=f"{key}.")
    return entry
