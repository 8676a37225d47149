"""llama.cpp's own quantizer (llama_model_quantize through llama-cpp-python) with llama-quantize's
options spelled as its C parameters, for comparing whole files with ggufsmith's."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import numpy as np

_KV_TAGS = {"int": 0, "float": 1, "bool": 2, "str": 3}  # llama_model_kv_override_type

# Presets llama-quantize refuses without an importance matrix (on a llama: some tensor gets a type
# that needs one), and Q1_0, which has no fallback for rows that are not multiples of 128 (the
# test models' ffn rows of 320 are not).
PRESETS_NEEDING_IMATRIX = ["Q2_K_S", "IQ3_XXS", "IQ3_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"]


def llama_quantize(src: Path, dst: Path, ftype: int, *, imatrix: dict[str, np.ndarray] | None = None,
                   kv_overrides: list[tuple[str, str, object]] = (), tensor_types: list[tuple[str, int]] = (),
                   **params) -> int:
    """Run llama_model_quantize; returns its status (0 = success). `imatrix` maps names to the
    float32 vectors llama-quantize passes (already divided by the counts); `kv_overrides` are
    (key, "int"|"float"|"bool"|"str", value) as --override-kv parses them."""
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = int(ftype)
    p.nthread = 2
    for key, value in params.items():
        setattr(p, key, value)
    keep = []
    if imatrix:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(imatrix.items()):
            values = np.ascontiguousarray(values, dtype=np.float32)
            keep.append(values)
            entries[i].name = name.encode()
            entries[i].data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = values.size
        entries[len(imatrix)].name = None
        p.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(entries)
    if kv_overrides:
        kvs = (llama_cpp.llama_model_kv_override * (len(kv_overrides) + 1))()
        for i, (key, kind, value) in enumerate(kv_overrides):
            kvs[i].key = key.encode()
            kvs[i].tag = _KV_TAGS[kind]
            if kind == "int":
                kvs[i].value.val_i64 = int(value)
            elif kind == "float":
                kvs[i].value.val_f64 = float(value)
            elif kind == "bool":
                kvs[i].value.val_bool = bool(value)
            else:
                kvs[i].value.val_str = str(value).encode()
        kvs[len(kv_overrides)].key = b""
        p.kv_overrides = ctypes.cast(kvs, ctypes.POINTER(llama_cpp.llama_model_kv_override))
        keep.append(kvs)
    if tensor_types:
        tts = (llama_cpp.llama_model_tensor_override * (len(tensor_types) + 1))()
        patterns = [pattern.encode() for pattern, _ in tensor_types]
        keep.append(patterns)
        for i, (pattern, ggml_type) in enumerate(tensor_types):
            tts[i].pattern = patterns[i]
            tts[i].type = int(ggml_type)
        tts[len(tensor_types)].pattern = None
        tts[len(tensor_types)].type = 43  # GGML_TYPE_COUNT (ggml.h of llama-cpp-python 0.3.36): the terminator
        p.tt_overrides = ctypes.cast(tts, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
        keep.append(tts)
    return llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), p)


_DRY_RUN_LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\w+), size =[^(\n]*(?:\((\w+)\))?",
                           re.M)


def llama_quantize_types(src: Path, ftype: int, **options) -> tuple[int, dict[str, str]]:
    """llama_model_quantize's choice of type for every tensor, without quantizing: its dry run
    (llama-quantize --dry-run) logs "[ i/ n] name - [shape], type = f32, size = ... (q4_K)" per
    tensor, from the same type selection the real run uses. Returns (status, name -> ggml type
    name as ggml spells it)."""
    import llama_cpp
    from llama_cpp._logger import llama_log_callback as default_callback

    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level, text, user_data):
        lines.append(text.decode("utf-8", errors="replace"))

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        status = llama_quantize(src, Path(os.devnull), ftype, dry_run=True, **options)
    finally:
        llama_cpp.llama_log_set(default_callback, ctypes.c_void_p(0))
    return status, {m[1]: (m[3] or m[2]) for m in _DRY_RUN_LINE.finditer("".join(lines))}


def random_imatrix(f32: Path, path: Path, seed: int = 0):
    """An importance matrix for the model in `f32`, written to `path` in llama.cpp's GGUF format:
    random sums and counts for every 2-D/3-D weight, one row per expert, one expert never used.
    Returns (path, the values llama-quantize hands llama_model_quantize, the kv overrides it adds)."""
    from ggufsmith.quantize.imatrix import write_imatrix

    entries = _random_imatrix_entries(f32, seed)
    write_imatrix(path, entries, ["calibration.txt"], chunk_count=7, chunk_size=512)
    overrides = [("quantize.imatrix.file", "str", str(path)), ("quantize.imatrix.dataset", "str", "calibration.txt"),
                 ("quantize.imatrix.entries_count", "int", len(entries)), ("quantize.imatrix.chunks_count", "int", 7)]
    return path, _llama_cpp_view(entries), overrides


def _random_imatrix_entries(f32: Path, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import gguf

    rng = np.random.default_rng(seed)
    entries = {}
    for t in gguf.GGUFReader(f32).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # numpy order
        if len(shape) < 2 or t.name == "token_embd.weight":
            continue
        nmat = shape[0] if len(shape) == 3 else 1
        counts = rng.integers(50, 500, size=nmat).astype(np.float32)
        if nmat > 1:
            counts[1] = 0
        sums = (rng.uniform(0.01, 3.0, size=(nmat, shape[-1])) * counts[:, None]).astype(np.float32)
        entries[t.name] = (sums.reshape(-1), counts)
    return entries


def _llama_cpp_view(entries) -> dict[str, np.ndarray]:
    """What llama-quantize hands llama_model_quantize: sums / count per matrix, 1 where count is 0."""
    out = {}
    for name, (sums, counts) in entries.items():
        rows = sums.reshape(len(counts), -1)
        values = np.ones_like(rows)
        for j, c in enumerate(counts):
            if c > 0:
                values[j] = rows[j] / np.float32(c)
        out[name] = values.reshape(-1)
    return out


def prune_param(layers: list[int]):
    """llama_model_quantize's prune_layers: the block numbers, terminated by -1 (keep it alive while used)."""
    ids = (ctypes.c_int32 * (len(layers) + 1))(*layers, -1)
    return ctypes.cast(ids, ctypes.POINTER(ctypes.c_int32)), ids


def differences(a: Path, b: Path) -> list[str]:
    """Where two GGUF files differ, read by gguf-py (an independent reader): keys, then tensors."""
    import gguf

    ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
    out = []
    ka = [(k, f.contents()) for k, f in ra.fields.items()]
    kb = [(k, f.contents()) for k, f in rb.fields.items()]
    if ka != kb:
        out.append(f"metadata differs: {[k for k, _ in ka]} vs {[k for k, _ in kb]}; "
                   f"values {[x for x in ka if x not in kb]} vs {[x for x in kb if x not in ka]}")
    ta = [(t.name, t.tensor_type.name) for t in ra.tensors]
    tb = [(t.name, t.tensor_type.name) for t in rb.tensors]
    if ta != tb:
        out.append(f"tensor names/types differ: {[x for x in ta if x not in tb]} vs {[x for x in tb if x not in ta]}")
    for x, y in zip(ra.tensors, rb.tensors):
        if x.name == y.name and bytes(np.asarray(x.data).view(np.uint8)) != bytes(np.asarray(y.data).view(np.uint8)):
            out.append(f"tensor {x.name} ({x.tensor_type.name}) bytes differ")
    return out


def assert_same_file(ours: Path, theirs: Path) -> None:
    if Path(ours).read_bytes() != Path(theirs).read_bytes():
        raise AssertionError("files differ: " + "; ".join(differences(ours, theirs) or ["(only in padding/offsets)"]))


def assert_same_tensors(ours: Path, theirs: Path) -> None:
    """Same tensors (name, type, shape, bytes), whatever their order and the metadata's."""
    import gguf

    def tensors(path):
        return {t.name: (t.tensor_type.name, t.shape.tolist(), bytes(np.asarray(t.data).view(np.uint8)))
                for t in gguf.GGUFReader(path).tensors}

    a, b = tensors(ours), tensors(theirs)
    assert sorted(a) == sorted(b)
    bad = [n for n in a if a[n] != b[n]]
    assert not bad, f"tensors differ: {[(n, a[n][0], b[n][0]) for n in bad]}"


def imatrix_as_llama_quantize_reads_it(path: Path) -> tuple[dict[str, np.ndarray], list[tuple[str, str, object]]]:
    """What llama-quantize --imatrix PATH hands llama_model_quantize for a GGUF imatrix, read with
    gguf-py: per weight, the sums divided by the (rounded) count of their matrix, 1 for a matrix
    with no count (an expert never routed to); and the keys it adds (--override-kv as it spells them)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arrays = {t.name: np.asarray(t.data, dtype=np.float32).reshape(-1) for t in reader.tensors}
    values = {}
    for name in sorted(n[: -len(".in_sum2")] for n in arrays if n.endswith(".in_sum2")):
        counts = np.rint(arrays[name + ".counts"]).astype(np.float32)
        sums = arrays[name + ".in_sum2"].reshape(counts.size, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            values[name] = np.where(counts[:, None] > 0, sums / counts[:, None], np.float32(1)).astype(np.float32).reshape(-1)
    datasets = reader.fields["imatrix.datasets"].contents()
    chunks = reader.fields["imatrix.chunk_count"].contents()
    overrides = [("quantize.imatrix.file", "str", str(path)), ("quantize.imatrix.dataset", "str", datasets[0]),
                 ("quantize.imatrix.entries_count", "int", len(values)), ("quantize.imatrix.chunks_count", "int", chunks)]
    return values, overrides
