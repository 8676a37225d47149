"""Convert a decoder test model to GGUF with ggufsmith's public API (the CLI's code path)."""

from __future__ import annotations

from pathlib import Path

import ggufsmith


def convert(model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    ggufsmith.convert(model_dir, out, outtype=outtype)
    return Path(out)
