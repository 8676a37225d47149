"""One source of a batch: every output type it still needs, made in one pass over its tensors.

`run_source` is what a local worker process or a Ray task runs. It never raises for a bad source:
the error becomes each of its outputs' `failed` result, with the one-line message the CLI would
print, so that the other sources go on.
"""

from __future__ import annotations

import logging
import re
import time
from contextlib import contextmanager
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ggufsmith.batch.plan import SourceSpec, quantize_args
from ggufsmith.batch.state import BatchState, file_sha256
from ggufsmith.constants import Keys
from ggufsmith.converters.split import SplitRule, split_plan
from ggufsmith.errors import BatchError, GgufsmithError, one_line
from ggufsmith.logs import WarningLines

G = Keys.General


@dataclass
class OutputResult:
    """One row of the batch report."""

    source: str
    outtype: str
    file: str | None  # absolute path of the output (None when the source failed before naming it)
    status: str  # "done", "skipped" (finished by an earlier run) or "failed"
    size: int | None = None
    bits_per_weight: float | None = None
    seconds: float = 0.0
    sha256: str | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)  # the source's warnings (ggufsmith's logger), each once

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gguf_file_name(metadata, outtype: str, pattern: str | None = None, source: str = "") -> str:
    """The output's file name: the GGUF naming convention <BaseName>-<SizeLabel>-<FineTune>-<Version>-<Type>.gguf
    from the general.* keys (general.name when there is no basename), or `pattern` with those fields."""
    from ggufsmith.converters.output_names import default_file_name, naming_fields

    if pattern is None:
        return default_file_name(metadata, outtype)
    fields = naming_fields(metadata) | {"type": outtype.upper(), "source": _dashed(source)}
    name = pattern.format(**fields)
    name = re.sub(r"-{2,}", "-", name).strip("-").replace("-.", ".")  # fields left empty drop their dash
    return name if name.endswith(".gguf") else name + ".gguf"


def _dashed(value) -> str:
    return "" if value is None else str(value).strip().replace(" ", "-").replace("/", "-")


def resolve_source(spec: SourceSpec) -> Path:
    """The model folder of a source: its path, or its repo's snapshot in the local Hugging Face cache
    (downloaded only when the plan says `download: true`)."""
    if spec.path is not None:
        if not spec.path.is_dir():
            raise BatchError(f"{spec.path}: no such model folder")
        return spec.path
    from ggufsmith.readers.hub import snapshot_folder

    try:
        return snapshot_folder(spec.repo, spec.revision, download=spec.download)
    except GgufsmithError as e:
        raise BatchError(str(e).replace("add --download", "set `download: true` for this source")) from None


def run_source(spec: SourceSpec, *, force: bool = False, on_progress: Callable[[float], None] | None = None,
               threads: int | None = None) -> list[OutputResult]:
    """Make every output of `spec` not finished already (all, with `force`), on `threads` conversion
    workers (default: every core); one result per outtype. `on_progress(n)`: n more outputs' worth
    of bytes written (fractions of files, for a live bar). Warnings of the conversion are kept in
    the results (`warnings`), labelled by their source in the report, instead of reaching stderr
    unlabelled from whichever worker process made them."""
    with _collected_warnings() as warnings:
        results = _run_source(spec, force=force, on_progress=on_progress, threads=threads)
    for result in results:
        result.warnings = list(dict.fromkeys(warnings))
    return results


def _run_source(spec: SourceSpec, *, force: bool, on_progress: Callable[[float], None] | None,
                threads: int | None) -> list[OutputResult]:
    from ggufsmith.converters.fanout import write_plans
    from ggufsmith.gguf_writer.output import folder_files, remove_dead_temp_files
    from ggufsmith.readers.checkpoint import open_checkpoint

    started = time.monotonic()
    files: dict[str, Path] = {}
    try:
        model_dir = resolve_source(spec)
        with open_checkpoint(model_dir) as checkpoint:
            plans = {spec.outtypes[0]: _make_plan(checkpoint, spec, spec.outtypes[0])}
            with _warnings_said_once():  # the other types' plans read the same tokenizer and config again
                plans.update({outtype: _make_plan(checkpoint, spec, outtype) for outtype in spec.outtypes[1:]})
            for outtype, plan in plans.items():
                name = spec.outputs.get(outtype) or gguf_file_name(plan.metadata, plan.outtype, spec.name_pattern, model_dir.name)
                files[outtype] = spec.output_dir / name
            _check_distinct(spec, files)
            spec.output_dir.mkdir(parents=True, exist_ok=True)  # the plan's folders are made for it
            remove_dead_temp_files(spec.output_dir)  # a killed run's (a live writer's are locked, kept)
            state = BatchState(spec.output_dir)
            todo = [o for o in spec.outtypes if force or not state.is_done(files[o].name, spec.fingerprint(o))]
            for outtype in todo:
                state.forget(files[outtype].name)
            if todo:
                inputs = folder_files(model_dir) + checkpoint.files + [p for p in (spec.imatrix, spec.metadata) if p]
                total = max(1, sum(plans[o].total_bytes for o in todo))
                on_bytes = None if on_progress is None else (lambda n: on_progress(n * len(todo) / total))
                rule = SplitRule(spec.split_max_size, spec.split_max_tensors)
                parts = {o: split_plan(plans[o], files[o], rule) for o in todo}
                write_plans([(part, part_path) for o in todo for part_path, part in parts[o]], progress=False,
                            on_bytes=on_bytes, inputs=inputs, threads=threads)
        seconds = time.monotonic() - started
        results = []
        for outtype in spec.outtypes:
            name, plan = files[outtype].name, plans[outtype]
            record = None if outtype in todo else state.records().get(name)
            if record is None:
                written = [{"file": p.name, "size": p.stat().st_size, "sha256": file_sha256(p)} for p, _ in parts[outtype]]
                record = {"size": sum(w["size"] for w in written),
                          "sha256": written[0]["sha256"] if len(written) == 1 else None, "source": spec.label,
                          "outtype": outtype, "fingerprint": spec.fingerprint(outtype),
                          "bits_per_weight": round(plan.bits_per_weight, 4), "seconds": round(seconds, 3)}
                if len(written) > 1:  # a split output: its parts, the first one being the file llama.cpp is given
                    record["parts"] = written
                state.record(name, record)
            path = spec.output_dir / record["parts"][0]["file"] if "parts" in record else files[outtype]
            results.append(OutputResult(spec.label, outtype, str(path), "done" if outtype in todo else "skipped",
                                        record["size"], record["bits_per_weight"],
                                        seconds if outtype in todo else 0.0, record["sha256"]))
        return results
    except Exception as e:  # noqa: BLE001 - one source's failure is its outputs' result, never the batch's end
        seconds = time.monotonic() - started
        return [OutputResult(spec.label, o, str(files[o]) if o in files else None, "failed", seconds=seconds,
                             error=one_line(e)) for o in spec.outtypes]


@contextmanager
def _collected_warnings():
    """The ggufsmith logger's warnings while the block runs, taken from its other handlers (the CLI's,
    or none at all in a worker process, where they would go to stderr unlabelled)."""
    logger = logging.getLogger("ggufsmith")
    saved = logger.handlers[:], logger.propagate
    collector = WarningLines()
    logger.handlers, logger.propagate = [collector], False
    try:
        yield collector.lines
    finally:
        logger.handlers, logger.propagate = saved


@contextmanager
def _warnings_said_once():
    logger = logging.getLogger("ggufsmith")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _make_plan(checkpoint, spec: SourceSpec, outtype: str):
    from ggufsmith.cli.quantize import build_request
    from ggufsmith.converters.general_metadata import read_metadata_overrides
    from ggufsmith.converters.pipeline import make_plan
    from ggufsmith.converters.plan import is_preset_outtype

    request = None
    if is_preset_outtype(outtype):  # options and imatrix are the presets'; plain types ignore them
        args = quantize_args(spec.options)
        args.imatrix = str(spec.imatrix) if spec.imatrix is not None else None
        request = build_request(outtype, args)
    overrides = read_metadata_overrides(spec.metadata) if spec.metadata is not None else None
    return make_plan(checkpoint, outtype, spec.arch, model_name=spec.model_name, quantize_request=request,
                     metadata_overrides=overrides)


def _check_distinct(spec: SourceSpec, files: dict[str, Path]) -> None:
    seen: dict[Path, str] = {}
    for outtype, path in files.items():
        if path in seen:
            raise BatchError(f"{spec.label}: outputs {seen[path]} and {outtype} would both be {path.name}; "
                             "set a name_pattern with {type} or name them under `outputs`")
        seen[path] = outtype
