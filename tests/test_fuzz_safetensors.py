"""Hypothesis-driven fuzzing of the safetensors reader, against the safetensors library itself.

For every generated file, `read_safetensors` must either raise ConversionError (one line naming
the file) or read it, and it must agree with the reference parser:
  - a file the safetensors library refuses is refused;
  - a file it accepts is read, tensor for tensor equal to what the library loads (through torch,
    for bf16), unless it falls under ggufsmith's documented extra refusals: a key given twice,
    a dtype ggufsmith does not convert (F8_*, U16...), a shape too large for numpy.
Each case must take well under a second. A few hundred cases per test keep this to seconds in CI;
scripts/fuzz.py runs the same reader for as long as one likes.
"""

from __future__ import annotations

import json
import struct
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufsmith.errors import ConversionError
from ggufsmith.readers.safetensors import MAX_ARRAY_BYTES, STORAGE_DTYPES, read_safetensors

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "U16": 2, "U32": 4}
FUZZ_SETTINGS = settings(max_examples=200, deadline=timedelta(seconds=5), derandomize=True,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "x.safetensors"


# -- what the reference says ---------------------------------------------------------------------

def reference_read(path: Path) -> dict[str, np.ndarray] | None:
    """The safetensors library's reading of the file (None: it refuses the file)."""
    from safetensors import SafetensorError, safe_open

    import torch

    try:
        with safe_open(path, framework="pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError:
        return None
    try:
        return {n: (t.float() if t.dtype == torch.bfloat16 else t).numpy() for n, t in tensors.items()}
    except (TypeError, RuntimeError):
        return {}  # accepted, but of a dtype numpy has no type for (F8 variants...): not comparable


def ggufsmith_extra_refusal(blob: bytes) -> bool:
    """Does a file the library accepts fall under ggufsmith's own, documented refusals?"""
    (n,) = struct.unpack("<Q", blob[:8])
    pairs_seen: list[int] = []

    def count(pairs):
        pairs_seen.append(len(pairs) - len({k for k, _ in pairs}))
        return dict(pairs)

    header = json.loads(blob[8:8 + n], object_pairs_hook=count)
    if any(pairs_seen):
        return True  # a duplicate key
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in STORAGE_DTYPES:
            return True
        nonzero = int(np.prod([d for d in entry["shape"] if d], dtype=object)) if entry["shape"] else 1
        if nonzero * ITEMSIZE[entry["dtype"]] > MAX_ARRAY_BYTES:
            return True
    return False


def check_against_reference(path: Path, blob: bytes) -> None:
    path.write_bytes(blob)
    try:
        ours = read_safetensors(path)
    except ConversionError as e:
        message = str(e)
        assert "\n" not in message and str(path) in message, message
        ours = None
    reference = reference_read(path)
    if reference is None:
        assert ours is None, "ggufsmith read a file that the safetensors library refuses"
        return
    if ours is None:
        assert ggufsmith_extra_refusal(blob), f"refused a file the safetensors library reads: {message}"
        return
    if reference:
        assert ours.keys() == reference.keys()
        for name, expected in reference.items():
            assert ours[name].shape == expected.shape, name
            np.testing.assert_array_equal(ours[name], expected, err_msg=name)


# -- generated headers: valid files with one to three defects ------------------------------------

def layout_header(tensors: list[tuple[str, str, list[int]]]) -> tuple[dict, int]:
    """A valid header for `tensors` (name, dtype, shape) laid out one after the other; data size."""
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        size = int(np.prod(shape, dtype=object)) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return header, offset


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64, 2**64 + 5]),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=4),
    st.lists(st.integers(-2, 5), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
)
tensor_specs = st.lists(
    st.tuples(st.sampled_from(["a", "b", "w.0", "w.1", "long.name.weight"]), st.sampled_from(list(ITEMSIZE)),
              st.lists(st.integers(0, 5), max_size=3)),
    min_size=0, max_size=4, unique_by=lambda t: t[0],
)


@st.composite
def damaged_files(draw) -> bytes:
    header, data_size = layout_header(draw(tensor_specs))
    names = list(header)
    data = draw(st.binary(min_size=data_size, max_size=data_size)) if data_size < 512 else bytes(data_size)
    raw_header: bytes | None = None
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["field", "dim", "offset", "swap", "data", "metadata", "duplicate", "drop"]))
        if kind == "field" and names:
            entry = header[draw(st.sampled_from(names))]
            entry[draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))] = draw(JUNK)
        elif kind == "dim" and names:
            shape = header[draw(st.sampled_from(names))]["shape"]
            if isinstance(shape, list) and shape:
                shape[draw(st.integers(0, len(shape) - 1))] = draw(JUNK)
        elif kind == "offset" and names:
            offsets = header[draw(st.sampled_from(names))]["data_offsets"]
            if isinstance(offsets, list) and offsets:
                offsets[draw(st.integers(0, len(offsets) - 1))] += draw(st.sampled_from([-8, -1, 1, 4, 2**64]))
        elif kind == "swap" and len(names) > 1:
            a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
            header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
        elif kind == "data":
            cut = draw(st.integers(-16, 16))
            data = data[:cut] if cut < 0 else data + bytes(cut)
        elif kind == "metadata":
            header["__metadata__"] = draw(st.one_of(JUNK, st.dictionaries(st.text(max_size=3), JUNK, max_size=2)))
        elif kind == "duplicate" and names:
            name = draw(st.sampled_from(names))
            text = json.dumps(header)
            raw_header = ("{" + json.dumps(name) + ": " + json.dumps(header[name]) + ", " + text[1:]).encode()
        elif kind == "drop" and names:
            del header[draw(st.sampled_from(names))]
            names = list(header)
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += b" " * draw(st.integers(0, 8))  # the format allows padding spaces after the JSON
    return struct.pack("<Q", len(text)) + text + data


@FUZZ_SETTINGS
@given(blob=damaged_files())
def test_generated_headers_agree_with_the_safetensors_library(scratch, blob):
    check_against_reference(scratch, blob)


# -- mutated bytes of a real file ----------------------------------------------------------------

def _valid_file() -> bytes:
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    return save({"embed": rng.standard_normal((6, 4)).astype(np.float32),
                 "norm": rng.standard_normal(4).astype(np.float16),
                 "ids": np.arange(5, dtype=np.int64), "mask": np.array([True, False])}, metadata={"format": "pt"})


VALID = _valid_file()


@FUZZ_SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(VALID))))
def test_mutated_bytes_agree_with_the_safetensors_library(scratch, flips, cut):
    blob = bytearray(VALID)
    for position, value in flips:
        blob[position] = value
    check_against_reference(scratch, bytes(blob[:cut] if cut is not None else blob))


def test_the_fuzz_targets_reach_every_outcome(tmp_path):
    """The generators above must produce files that are read and files refused by each layer:
    a fuzz test whose cases all fail at the first check would test nothing."""
    path = tmp_path / "x.safetensors"
    path.write_bytes(VALID)
    assert set(read_safetensors(path)) == {"embed", "norm", "ids", "mask"}
    outcomes = set()
    for blob in (VALID[:7], VALID[:40], VALID[:-3], VALID + b"\0"):
        path.write_bytes(blob)
        with pytest.raises(ConversionError) as info:
            read_safetensors(path)
        outcomes.add(str(info.value).split(": ", 1)[1][:20])
    assert len(outcomes) >= 3, outcomes
