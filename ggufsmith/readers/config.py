"""config.json and generation_config.json of a Hugging Face model folder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ggufsmith.errors import ConversionError

_REQUIRED = object()


class HFConfig:
    """config.json (and generation_config.json), with lookups that name the file when they fail."""

    def __init__(self, values: Mapping[str, Any], path: Path | str = "config.json",
                 generation: Mapping[str, Any] | None = None) -> None:
        self.values = dict(values)
        self.path = Path(path)
        self.generation = dict(generation or {})

    @classmethod
    def from_dir(cls, model_dir: Path) -> HFConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConversionError(f"{path} not found: a Hugging Face model folder needs its config.json")
        values = _read_json(path)
        gen_path = Path(model_dir) / "generation_config.json"
        generation = _read_json(gen_path) if gen_path.is_file() else None
        return cls(values, path, generation)

    def get(self, *names: str, default: Any = _REQUIRED) -> Any:
        """The value of the first of `names` present (and not null) in config.json."""
        for name in names:
            if self.values.get(name) is not None:
                return self.values[name]
        if default is _REQUIRED:
            raise ConversionError(f"{self.path}: none of {', '.join(names)} is set; this architecture needs it")
        return default

    def __contains__(self, name: str) -> bool:
        return self.values.get(name) is not None

    @property
    def architectures(self) -> list[str]:
        return list(self.values.get("architectures") or [])

    @property
    def model_type(self) -> str | None:
        return self.values.get("model_type")


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
