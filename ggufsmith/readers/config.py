"""config.json and generation_config.json of a Hugging Face model folder, read with types.

Every value is checked for type and range where it is read: a config that says
`"num_hidden_layers": "four"` or `"num_attention_heads": 0` gets one error naming the file and the
key, never a TypeError or ZeroDivisionError further down. Integers read this way remember their
key (`ConfigInt.origin`), so that a later check of tensor shapes can say which key a dimension
came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ggufsmith.errors import ConversionError
from ggufsmith.readers.jsonfile import read_json

_REQUIRED = object()


def _json_float(value: Any) -> float | None:
    """A number of a config file, infinities included (None for anything else, NaN included)."""
    if isinstance(value, dict) and set(value) == {"__float__"} and isinstance(value["__float__"], str):
        value = value["__float__"]
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


class ConfigInt(int):
    """An int read from a config file, with the key it came from (arithmetic drops it)."""

    origin: str  # the key, "hidden_size" or "text_config.hidden_size"
    file: str  # the config file's path

    def __new__(cls, value: int, origin: str, file: str = "config.json") -> ConfigInt:
        number = super().__new__(cls, value)
        number.origin = origin
        number.file = file
        return number


class HFConfig:
    """config.json (and generation_config.json), with typed lookups that name the file when they fail."""

    def __init__(self, values: Mapping[str, Any], path: Path | str = "config.json",
                 generation: Mapping[str, Any] | None = None, section: str = "") -> None:
        if not isinstance(values, Mapping):
            raise ConversionError(f"{path}: expected a JSON object, found {type(values).__name__}")
        self.values = dict(values)
        self.path = Path(path)
        self.generation = dict(generation or {})
        # "" for config.json itself, "text_config" for a nested one: keys are named "text_config.hidden_size"
        self.section = section
        self.label = f"{self.path} {section}" if section else str(self.path)

    @classmethod
    def from_dir(cls, model_dir: Path) -> HFConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConversionError(f"{path} not found: a Hugging Face model folder needs its config.json")
        values = read_json(path)
        gen_path = Path(model_dir) / "generation_config.json"
        generation = read_json(gen_path) if gen_path.is_file() else None
        return cls(values, path, generation)

    def sub(self, name: str, values: Mapping[str, Any] | None = None) -> HFConfig:
        """A nested config (e.g. `text_config` of a multimodal checkpoint), read the same way;
        `values` to read a merged or adjusted copy under that name."""
        return HFConfig(self.get_dict(name) if values is None else values, self.path, self.generation,
                        section=self.key_name(name))

    def with_defaults(self, defaults: Mapping[str, Any]) -> HFConfig:
        """This config with `defaults` for the keys it leaves out: the values a transformers config
        class fills in, for families whose published config.json omit them. A key set to null
        stays null (transformers keeps None: "no soft-capping", not the default)."""
        values = dict(defaults) | self.values
        return HFConfig(values, self.path, self.generation, section=self.section)

    def key_name(self, name: str) -> str:
        """How messages name a key of this config: "hidden_size", "text_config.hidden_size"."""
        return f"{self.section}.{name}" if self.section else name

    # -- lookups -----------------------------------------------------------------------------------
    def get(self, *names: str, default: Any = _REQUIRED) -> Any:
        """The value of the first of `names` present (and not null), of any type."""
        name = self._first(names)
        if name is None:
            return self._missing(names, default)
        return self.values[name]

    def get_int(self, *names: str, default: Any = _REQUIRED, min: int | None = 0, max: int | None = None) -> Any:
        """An integer (a float with an integral value is accepted), within [min, max]."""
        name = self._first(names)
        if name is None:
            return self._missing(names, default)
        value = self.values[name]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, value, "an integer")
        self._check_range(name, value, min, max)
        return ConfigInt(value, self.key_name(name), str(self.path))

    def get_float(self, *names: str, default: Any = _REQUIRED, min: float | None = None, max: float | None = None) -> Any:
        """A finite number, within [min, max]."""
        name = self._first(names)
        if name is None:
            return self._missing(names, default)
        value = self.values[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(name, value, "a finite number")
        self._check_range(name, value, min, max)
        return float(value)

    def get_bool(self, *names: str, default: Any = _REQUIRED) -> Any:
        return self._typed(names, default, bool, "true or false")

    def get_str(self, *names: str, default: Any = _REQUIRED) -> Any:
        return self._typed(names, default, str, "a string")

    def get_dict(self, *names: str, default: Any = _REQUIRED) -> Any:
        return self._typed(names, default, dict, "a JSON object")

    def get_list(self, *names: str, default: Any = _REQUIRED) -> Any:
        return self._typed(names, default, list, "a JSON array")

    def get_bounds(self, *names: str, default: Any = _REQUIRED) -> Any:
        """A [low, high] pair of numbers, either of which may be infinite: written as a bare
        Infinity, or as transformers 5 saves non-finite floats, {"__float__": "Infinity"}."""
        name = self._first(names)
        if name is None:
            return self._missing(names, default)
        value = self.values[name]
        bounds = [_json_float(v) for v in value] if isinstance(value, list) and len(value) == 2 else None
        if bounds is None or None in bounds or bounds[0] > bounds[1]:
            raise self.error(name, value, "[low, high], two numbers with low <= high")
        return (bounds[0], bounds[1])

    def error(self, name: str, value: Any, expected: str) -> ConversionError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ConversionError(f"{self.label}: {name} is {shown}; expected {expected}")

    def __contains__(self, name: str) -> bool:
        return self.values.get(name) is not None

    @property
    def architectures(self) -> list[str]:
        value = self.values.get("architectures") or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error("architectures", value, "a list of class names")
        return list(value)

    @property
    def model_type(self) -> str | None:
        value = self.values.get("model_type")
        if value is not None and not isinstance(value, str):
            raise self.error("model_type", value, "a string")
        return value

    # -- helpers -----------------------------------------------------------------------------------
    def _first(self, names: tuple[str, ...]) -> str | None:
        return next((n for n in names if self.values.get(n) is not None), None)

    def _missing(self, names: tuple[str, ...], default: Any) -> Any:
        if default is _REQUIRED:
            which = names[0] if len(names) == 1 else "none of " + ", ".join(names)
            raise ConversionError(f"{self.label}: {which} is not set; converting this model needs it")
        return default

    def _typed(self, names: tuple[str, ...], default: Any, kind: type, expected: str) -> Any:
        name = self._first(names)
        if name is None:
            return self._missing(names, default)
        value = self.values[name]
        if not isinstance(value, kind):
            raise self.error(name, value, expected)
        return value

    def _check_range(self, name: str, value: float, low: float | None, high: float | None) -> None:
        if low is not None and value < low:
            raise self.error(name, value, f"a value of at least {low}")
        if high is not None and value > high:
            raise self.error(name, value, f"a value of at most {high}")
