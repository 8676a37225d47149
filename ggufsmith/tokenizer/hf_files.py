"""Reading the JSON files of a Hugging Face tokenizer directory, with errors that name the file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ggufsmith.errors import TokenizerError

TOKENIZER_MODEL = "tokenizer.model"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
ADDED_TOKENS = "added_tokens.json"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
CHAT_TEMPLATE_JSON = "chat_template.json"


def read_json(path: Path) -> Any:
    """The parsed content of `path`, or None if it does not exist."""
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read JSON ({e})") from e


def read_json_object(path: Path) -> dict[str, Any]:
    """Like read_json, but {} for a missing file and an error for anything but an object."""
    data = read_json(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


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


def token_content(entry: Any) -> str | None:
    """The text of a special-token entry: a plain string or an AddedToken dict {"content": ...}."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None
