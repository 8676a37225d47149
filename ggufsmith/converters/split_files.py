"""`ggufsmith split` and `ggufsmith merge`: an existing GGUF model cut into parts, or its parts
joined into one file, the tensors' bytes copied as they are (llama-gguf-split --split / --merge).

split: the parts llama-gguf-split writes (converters/split.py), always named PREFIX-0000i-of-0000n.gguf,
even when the model fits one part. merge: the file the model would have been unsplit: the first
part's metadata without the split.* keys, then every part's tensors in order (llama-gguf-split's
merge keeps split.no and split.tensors.count and sets split.count to 0; llama.cpp ignores them).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from ggufsmith.converters.fanout import write_plans
from ggufsmith.converters.requantize import stored_plan
from ggufsmith.converters.split import SplitRule, split_plan, without_split_keys
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.output import check_target
from ggufsmith.readers.gguf_source import open_gguf_model, split_paths


def _inputs(src: Path, n_splits: int) -> list[Path]:
    return split_paths(src, n_splits) if n_splits > 1 else [src]


class SplitPart(NamedTuple):
    """One file `split_gguf` writes (or would write, with dry_run)."""

    path: Path
    tensors: int
    tensor_bytes: int  # the tensors' data, without padding or metadata


def split_gguf(src: str | Path, prefix: str | Path, rule: SplitRule, *, metadata_only_first_part: bool = False,
               dry_run: bool = False, progress: bool = False, force: bool = False) -> list[SplitPart]:
    """Cut the model `src` (one file, or the first part of a split one) into parts PREFIX-0000i-of-0000n.gguf
    by `rule`; returns what each holds. They appear together once all are complete.
    `metadata_only_first_part`: the first part has the metadata and no tensor (--no-tensor-first-split)."""
    if not rule.active:
        raise ConversionError("give --split-max-size N[K|M|G] or --split-max-tensors N")
    src = Path(src)
    with open_gguf_model(src) as model:
        inputs = _inputs(src, model.n_splits)
        parts = split_plan(stored_plan(model), prefix, rule, like_llama_gguf_split=True,
                           metadata_only_first_part=metadata_only_first_part)
        for path, _ in parts:
            check_target(path, inputs, force=force)
        if not dry_run:
            write_plans([(part, path) for path, part in parts], progress=progress, inputs=inputs, force=force)
    return [SplitPart(path, len(part.tensors), part.total_bytes) for path, part in parts]


def merge_gguf(first: str | Path, dst: str | Path, *, progress: bool = False, force: bool = False) -> Path:
    """Join the parts of the split model whose first part is `first` into the single file `dst`."""
    first, dst = Path(first), Path(dst)
    check_target(dst, [first], force=force)
    with open_gguf_model(first) as model:
        if model.n_splits <= 1:
            raise ConversionError(f"{first} is not the first part of a split model (no split.count above 1); "
                                  "there is nothing to merge")
        inputs = _inputs(first, model.n_splits)
        plan = stored_plan(model)
        plan.metadata = without_split_keys(plan.metadata)
        write_plans([(plan, dst)], progress=progress, inputs=inputs, force=force)
    return dst
