"""The chat template(s): tokenizer.chat_template, and named ones as tokenizer.chat_template.<name>."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ggufsmith.constants import GGUFValueType, Keys
from ggufsmith.errors import TokenizerError
from ggufsmith.gguf_writer.metadata import Metadata

from .hf_files import CHAT_TEMPLATE_JINJA, CHAT_TEMPLATE_JSON, TOKENIZER_CONFIG, read_json_object

ADDITIONAL_TEMPLATES_DIR = "additional_chat_templates"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read chat template ({e})") from e


def find_chat_template(model_dir: Path, tokenizer_config: dict[str, Any]) -> tuple[Any, Path]:
    """The chat template and the file it came from. A chat_template.jinja file wins over
    tokenizer_config.json (as in transformers), which wins over chat_template.json. The template is
    a string, a list of {"name", "template"} dicts, or None; anything else is checked by the caller."""
    jinja = model_dir / CHAT_TEMPLATE_JINJA
    if jinja.is_file():
        template: str | list[dict[str, str]] = _read_text(jinja)
        extra = sorted((model_dir / ADDITIONAL_TEMPLATES_DIR).glob("*.jinja"))
        if extra:
            template = [{"name": "default", "template": template}]
            template += [{"name": p.stem, "template": _read_text(p)} for p in extra]
        return template, jinja
    if "chat_template" in tokenizer_config:
        return tokenizer_config["chat_template"], model_dir / TOKENIZER_CONFIG
    path = model_dir / CHAT_TEMPLATE_JSON
    return read_json_object(path).get("chat_template"), path


def template_key_name(name: str) -> str:
    """GGUF keys are lower_snake_case, so a template's name is folded to [a-z0-9_]."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def add_chat_template_metadata(metadata: Metadata, model_dir: Path, tokenizer_config: dict[str, Any]) -> None:
    template, source = find_chat_template(model_dir, tokenizer_config)
    if template is None:
        return
    if isinstance(template, str):
        metadata.add_string(Keys.Tokenizer.CHAT_TEMPLATE, template)
        return
    if not isinstance(template, list):
        raise TokenizerError(f"{source}: chat_template must be a string or a list of named templates")
    names: list[str] = []
    for item in template:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)):
            raise TokenizerError(f"{source}: chat_template entry {item!r:.80} is not {{\"name\": ..., \"template\": ...}}")
        name = template_key_name(item["name"])
        if name == "default":
            metadata.add_string(Keys.Tokenizer.CHAT_TEMPLATE, item["template"])
        elif name and name not in names:
            names.append(name)
            metadata.add_string(Keys.Tokenizer.CHAT_TEMPLATE_NAMED.format(name=name), item["template"])
    if names:
        metadata.add_array(Keys.Tokenizer.CHAT_TEMPLATES, names, GGUFValueType.STRING)
