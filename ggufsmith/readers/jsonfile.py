"""Reading the JSON files of a model folder (config.json, tokenizer.json, shard indexes, ...):
every failure becomes one error that names the file, never a foreign exception."""

from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any

from ggufsmith.errors import ConversionError


def parse_json(text: str | bytes, where: str, error: type[Exception] = ConversionError,
               unique_keys: bool = False) -> Any:
    """`text` parsed as JSON; `where` names its origin in the error (a path, "safetensors header of X").

    With `unique_keys`, an object that names a key twice is an error: json keeps the last value,
    other readers of the same file may keep the first, so such a file means different things to
    different tools (a shard index mapping a tensor to two shards, a safetensors header with two
    entries for one tensor)."""

    def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise error(f"{where}: key {key[:300]!r} appears twice in one JSON object")
            seen.add(key)
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=refuse_duplicates if unique_keys else None)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not valid JSON (not UTF-8 text)") from None
    except ValueError:  # the only other ValueError: Python's guard against integers of over 4300 digits
        raise error(f"{where}: not valid JSON (a number thousands of digits long)") from None
    except RecursionError:
        # json's C scanner guards its recursion: a hostile file nested 100,000 levels deep ends here
        raise error(f"{where}: JSON nested too deeply to be a real model file") from None


def read_json(path: Path | str, error: type[Exception] = ConversionError, expect: type | None = dict,
              unique_keys: bool = False) -> Any:
    """The parsed content of the JSON file `path`; with `expect`, an error unless it is of that type."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    value = parse_json(data, str(path), error, unique_keys)
    if expect is not None and not isinstance(value, expect):
        raise error(f"{path}: expected a JSON {_json_name(expect)}, found a JSON {_json_name(type(value))}")
    return value


def _json_name(python_type: type) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(python_type, python_type.__name__)


# Values quoted in error messages are cut short: a hostile file can hold anything, of any size.
_short_repr = reprlib.Repr()
_short_repr.maxstring = _short_repr.maxother = _short_repr.maxlong = 40
_short_repr.maxlist, _short_repr.maxdict, _short_repr.maxlevel = 8, 4, 3


def shown(value: Any) -> str:
    """`value` for an error message: its repr, at most a few dozen characters."""
    return _short_repr.repr(value)
