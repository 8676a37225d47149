"""Reading the JSON files of a model folder (config.json, tokenizer.json, shard indexes, ...):
every failure becomes one error that names the file, never a foreign exception."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ggufsmith.errors import ConversionError


def parse_json(text: str | bytes, where: str, error: type[Exception] = ConversionError) -> Any:
    """`text` parsed as JSON; `where` names its origin in the error (a path, "safetensors header of X")."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not valid JSON (not UTF-8 text)") from None
    except RecursionError:
        # json's C scanner guards its recursion: a hostile file nested 100,000 levels deep ends here
        raise error(f"{where}: JSON nested too deeply to be a real model file") from None


def read_json(path: Path | str, error: type[Exception] = ConversionError, expect: type | None = dict) -> Any:
    """The parsed content of the JSON file `path`; with `expect`, an error unless it is of that type."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    value = parse_json(data, str(path), error)
    if expect is not None and not isinstance(value, expect):
        raise error(f"{path}: expected a JSON {_json_name(expect)}, found a JSON {_json_name(type(value))}")
    return value


def _json_name(python_type: type) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(python_type, python_type.__name__)
