"""The model card: the YAML front matter of a model folder's README.md (license, tags, base models...).

The card is optional prose metadata: nothing in it changes the model. So a damaged card never
stops a conversion. Each problem is one warning naming README.md and the key, and what it concerns
is left out of the GGUF (the rest of the card is still used):
  - front matter that is not YAML, or larger than MAX_FRONT_MATTER_BYTES: the card is skipped;
  - YAML aliases (`*name`): the card is skipped. An alias repeats a node without copying it, so a
    few hundred bytes of nested aliases describe a structure of billions of values that anything
    walking it (str(), a join, a GGUF array) expands: the "billion laughs" bomb. Cards written by
    the Hub's tools have no aliases; refusing them is simpler and safer than bounding expansion;
  - a value of the wrong type (`license: [1, 2]`, `name: {a: b}`, a base model given as a list):
    that key is skipped. A single value may be a number or a date (`version: 1.0`), written as
    text; the entries of a list of identifiers (licenses, tags, languages) must be strings.
"""

from __future__ import annotations

import datetime
import logging
import math
from pathlib import Path
from typing import Any

from ggufsmith.readers.jsonfile import shown

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
# Real front matter is a few kB (a few hundred with long evaluation tables); beyond this the card
# is skipped rather than parsed.
MAX_FRONT_MATTER_BYTES = 1 << 20
# Scalars that can stand for text in the GGUF: YAML reads `version: 1.0` as a float and
# `date: 2024-01-01` as a date; their text form is what the author wrote. (bool is refused: it
# is an int to Python, and `name: yes` is no name.)
_TEXT_TYPES = (str, int, float, datetime.date)


def is_text(value: Any) -> bool:
    """A card value usable as a GGUF string."""
    if isinstance(value, bool) or not isinstance(value, _TEXT_TYPES):
        return False
    return not (isinstance(value, float) and not math.isfinite(value))


class ModelCard:
    """The front matter of README.md, read through accessors that check each value's type."""

    def __init__(self, values: dict[str, Any], path: Path) -> None:
        self.values = values
        self.path = path

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelCard:
        path = Path(model_dir) / CARD_FILE
        return cls(_read_front_matter(path), path)

    def _skip(self, key: str, value: Any, expected: str) -> None:
        log.warning("%s: %s is %s, expected %s; %s left out of the GGUF", self.path, key, shown(value), expected, key)

    def text(self, *keys: str, allow_list: bool = False) -> str | list[str] | None:
        """The value of the first of `keys` that is set: text (or, with allow_list, a list of texts)."""
        for key in keys:
            value = self.values.get(key)
            if value is None:
                continue
            if is_text(value):
                return str(value)
            if allow_list and _is_string_list(value):
                if value:
                    return value
                continue
            self._skip(key, value, "text" + (" or a list of strings" if allow_list else ""))
        return None

    def texts(self, *keys: str) -> list[str]:
        """The values of all `keys` that are set, each text or a list of texts, joined in one list."""
        out: list[str] = []
        for key in keys:
            value = self.values.get(key)
            if value is None:
                continue
            if is_text(value):
                out.append(str(value))
            elif _is_string_list(value):
                out.extend(value)
            else:
                self._skip(key, value, "text or a list of strings")
        return out

    def references(self, *keys: str) -> list[str | dict[str, str]]:
        """Base models or data sets: the entries of the first of `keys` that is set and well formed.

        Each entry is a Hub id or URL (text), or a mapping of fields (name, organization, ...) to text."""
        for key in keys:
            value = self.values.get(key)
            if value is None:
                continue
            entries = value if isinstance(value, list) else [value]
            if not entries:
                continue
            if all(is_text(e) or _is_text_mapping(e) for e in entries):
                return [str(e) if is_text(e) else {str(k): str(v) for k, v in e.items()} for e in entries]
            self._skip(key, value, "a model id, a URL, a mapping of fields to text, or a list of them")
        return []


def _is_string_list(value: Any) -> bool:
    """A list of identifiers (licenses, tags, languages): a number among them means a broken card."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_text_mapping(value: Any) -> bool:
    return isinstance(value, dict) and all(is_text(k) and is_text(v) for k, v in value.items())


def _read_front_matter(path: Path) -> dict[str, Any]:
    """The YAML between the first two `---` lines of README.md; {} (with a warning) when unusable."""
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as f:
            head = f.read(MAX_FRONT_MATTER_BYTES + 8)
    except OSError as e:
        log.warning("%s: cannot be read (%s); model card metadata left out of the GGUF", path, e.strerror or e)
        return {}
    lines = head.decode("utf-8", errors="replace").splitlines()
    if not lines or lines[0].rstrip() != "---":
        return {}
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.rstrip() == "---")
    except StopIteration:
        if len(head) > MAX_FRONT_MATTER_BYTES:
            log.warning("%s: front matter larger than %d bytes; model card metadata left out of the GGUF",
                        path, MAX_FRONT_MATTER_BYTES)
        else:
            log.warning("%s: front matter has no closing '---' line; model card metadata left out of the GGUF", path)
        return {}
    text = "\n".join(lines[1:end]) + "\n"
    # YAML 1.1 reads the language code "no" (Norwegian) as false; tabs are not YAML indentation.
    text = text.replace("- no\n", '- "no"\n').replace("\t", "  ")
    problem = _yaml_problem(text)
    if problem is None:
        try:
            data = _yaml_load(text)
        except Exception as e:  # yaml's constructors raise ValueError (a date of month 13), RecursionError...
            problem = f"is not valid YAML ({_first_line(e)})"
        else:
            if isinstance(data, dict):
                return data
            if data is None:
                return {}
            problem = f"is a YAML {type(data).__name__}, not a mapping of keys to values"
    log.warning("%s: front matter %s; model card metadata left out of the GGUF", path, problem)
    return {}


def _yaml_loader():
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: fast, and bounds nesting depth itself


def _yaml_problem(text: str) -> str | None:
    """Why `text` must not be loaded (an alias), from a pass over its events: no node is built."""
    import yaml

    try:
        for event in yaml.parse(text, Loader=_yaml_loader()):
            if isinstance(event, yaml.AliasEvent):
                return f"uses a YAML alias (*{event.anchor}), which ggufsmith does not expand"
    except Exception as e:  # a syntax error, nesting deeper than the parser allows
        return f"is not valid YAML ({_first_line(e)})"
    return None


def _yaml_load(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=_yaml_loader())


def _first_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:160] or type(e).__name__
