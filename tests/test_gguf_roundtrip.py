"""Round trips between our writer/reader and two independent implementations:
gguf-py (PyPI `gguf`, llama.cpp's Python package) and ggml's C parser (through llama-cpp-python).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ggufsmith.constants import GGML_ELEMENT_DTYPE, GGML_TYPE_LAYOUT, GGMLType, GGUFValueType  # noqa: E402
from ggufsmith.gguf_writer import GGUFWriter, Metadata  # noqa: E402
from ggufsmith.gguf_writer.reader import GGUFReader  # noqa: E402
from tests.ggml_oracle import ggml_parse_gguf  # noqa: E402
from tests.gguf_helpers import (  # noqa: E402
    every_value_type_metadata,
    expected_triple,
    ggufpy_metadata,
    our_metadata,
    random_metadata,
    random_tensor_specs,
    same_metadata,
    write_ours,
)

ALIGNMENTS = [8, 16, 32, 64, 128, 256]
# gguf-py's table says Q8_1 blocks are 40 bytes (ggml: 36), and it may not know the newest types;
# compare with gguf-py only over the types where it agrees with ggml.
GGUFPY_TYPES = [
    t for t in GGMLType
    if int(t) in {int(q) for q in gguf.GGMLQuantizationType}
    and tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(t))]) == tuple(GGML_TYPE_LAYOUT[t])
]


def rounded_to_file(md: Metadata) -> dict[str, tuple]:
    """What a reader must see for `md`: FLOAT32 values rounded to float32, the rest as given."""
    def f32(plain, vtype, etype):
        if vtype == GGUFValueType.FLOAT32:
            return float(np.float32(plain))
        if vtype == GGUFValueType.ARRAY and etype == GGUFValueType.FLOAT32:
            return [float(np.float32(v)) for v in plain]
        return plain

    out = {}
    for key, v in md.items():
        t, e, plain = expected_triple(v)
        if v.element_type == GGUFValueType.ARRAY:
            plain = [_round_nested(inner) for inner in v.value]
        out[key] = (t, e, f32(plain, v.type, v.element_type))
    return out


def _round_nested(v):
    if v.element_type == GGUFValueType.ARRAY:
        return [_round_nested(inner) for inner in v.value]
    plain = v.plain()
    return [float(np.float32(x)) for x in plain] if v.element_type == GGUFValueType.FLOAT32 else plain


def ggufpy_tensors(reader) -> list[tuple]:
    return [
        (t.name, tuple(reversed(t.shape.tolist())), int(t.tensor_type), int(t.data_offset), int(t.n_bytes), t.data.tobytes())
        for t in reader.tensors
    ]


def our_tensors(reader: GGUFReader) -> list[tuple]:
    return [(t.name, t.shape, int(t.ggml_type), t.offset, t.nbytes, t.data.tobytes()) for t in reader.tensors]


# -- our writer -> gguf-py and our reader ----------------------------------------------------------
@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_every_value_type_reads_back_identically(tmp_path, byteorder):
    md = every_value_type_metadata()
    path = tmp_path / "values.gguf"
    specs = [("a.weight", (3, 8), GGMLType.F32), ("b.weight", (2, 2, 4), GGMLType.F16)]
    written = write_ours(path, md, specs, byteorder=byteorder)

    theirs = gguf.GGUFReader(path)
    expected = rounded_to_file(md)
    same_metadata(ggufpy_metadata(theirs), expected)
    ours = GGUFReader(path)
    same_metadata(our_metadata(ours), expected)
    assert ours.byteorder == byteorder
    assert ggufpy_tensors(theirs) == our_tensors(ours)
    assert {t.name: t.data.tobytes() for t in ours.tensors} == written


@pytest.mark.parametrize("seed", range(40))
def test_random_files_read_identically_by_gguf_py(tmp_path, seed):
    rng = random.Random(seed)
    byteorder = "big" if seed % 4 == 3 else "little"
    alignment = ALIGNMENTS[seed % len(ALIGNMENTS)]
    types = GGUFPY_TYPES if byteorder == "little" else list(GGML_ELEMENT_DTYPE)
    md = random_metadata(rng, rng.randint(0, 12))
    specs = random_tensor_specs(rng, rng.randint(0, 8), types)
    path = tmp_path / "random.gguf"
    written = write_ours(path, md, specs, alignment=alignment, byteorder=byteorder, seed=seed)

    theirs = gguf.GGUFReader(path)
    ours = GGUFReader(path)
    expected = rounded_to_file(md)
    if alignment != 32:
        expected["general.alignment"] = (int(GGUFValueType.UINT32), None, alignment)
    same_metadata(ggufpy_metadata(theirs), expected)
    same_metadata(our_metadata(ours), expected)
    assert theirs.alignment == ours.alignment == alignment
    assert theirs.data_offset == ours.data_offset
    assert ggufpy_tensors(theirs) == our_tensors(ours)
    assert [(t.name, t.shape, t.ggml_type) for t in ours.tensors] == [(n, s, t) for n, s, t in specs]
    assert {t.name: t.data.tobytes() for t in ours.tensors} == written


# -- our writer -> ggml's C parser ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(30))
def test_random_files_accepted_by_ggml(tmp_path, seed):
    rng = random.Random(1000 + seed)
    alignment = ALIGNMENTS[seed % len(ALIGNMENTS)]
    md = random_metadata(rng, rng.randint(0, 12), allow_nested=False)  # ggml rejects nested arrays
    specs = random_tensor_specs(rng, rng.randint(0, 10))
    path = tmp_path / "random.gguf"
    write_ours(path, md, specs, alignment=alignment, seed=seed)

    seen = ggml_parse_gguf(path)
    assert seen is not None, "ggml rejected a file we wrote"
    ours = GGUFReader(path)
    assert seen["version"] == 3
    assert seen["alignment"] == alignment
    assert seen["keys"] == list(ours.metadata)
    assert seen["key_types"] == [int(ours.metadata[k].type) for k in ours.metadata]
    assert seen["tensors"] == [
        {"name": t.name, "offset": t.relative_offset, "type": int(t.ggml_type), "size": t.nbytes} for t in ours.tensors
    ]
    if ours.tensors:
        assert seen["data_offset"] == ours.data_offset


def test_every_value_type_accepted_by_ggml(tmp_path):
    path = tmp_path / "values.gguf"
    write_ours(path, every_value_type_metadata(allow_nested=False), [("t", (4,), GGMLType.I32)], alignment=64)
    seen = ggml_parse_gguf(path)
    assert seen is not None
    ours = GGUFReader(path)
    assert seen["keys"] == list(ours.metadata)
    assert seen["key_types"] == [int(ours.metadata[k].type) for k in ours.metadata]
    assert seen["data_offset"] == ours.data_offset


def test_ggml_rejects_nested_arrays_we_write(tmp_path):
    # Documents why nested arrays are excluded above: the spec allows them, ggml does not.
    path = tmp_path / "nested.gguf"
    write_ours(path, every_value_type_metadata(allow_nested=True), [])
    assert ggml_parse_gguf(path) is None
    assert GGUFReader(path).metadata["array.nested_int"].plain() == [[1, 2, 3], [], [7]]


# -- gguf-py's writer -> our reader ---------------------------------------------------------------
def _ggufpy_write(path, byteorder, alignment, seed):
    rng = random.Random(seed)
    endian = gguf.GGUFEndian.BIG if byteorder == "big" else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    if alignment != 32:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -128)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 2**32 - 1)
    w.add_int32("t.i32", -(2**31))
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", float("inf"))
    w.add_float64("t.f64", -1.5e300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "ünïcödé 🦙")
    w.add_array("t.strs", ["a", "bc", "漢字"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_key_value("t.u16s", [1, 2, 65535], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT16)
    tensors = {}
    gen = np.random.default_rng(seed)
    for i in range(rng.randint(1, 6)):
        dtype = rng.choice([np.float32, np.float16, np.int8, np.int16, np.int32, np.int64, np.float64])
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 4)))
        arr = (gen.standard_normal(shape) * 100).astype(dtype)
        tensors[f"t{i}.weight"] = arr
        w.add_tensor(f"t{i}.weight", arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.mark.parametrize("byteorder", ["little", "big"])
@pytest.mark.parametrize("alignment", [1, 4, 8, 16, 32, 64, 256])
def test_gguf_py_files_read_identically(tmp_path, byteorder, alignment):
    path = tmp_path / "theirs.gguf"
    arrays = _ggufpy_write(path, byteorder, alignment, seed=alignment)
    theirs = gguf.GGUFReader(path)
    ours = GGUFReader(path)
    assert ours.byteorder == byteorder
    assert ours.alignment == alignment
    same_metadata(our_metadata(ours), ggufpy_metadata(theirs))
    assert our_tensors(ours) == ggufpy_tensors(theirs)
    for t in ours.tensors:
        want = arrays[t.name]
        assert t.shape == want.shape
        assert np.array_equal(t.values(), want)  # the file's byte order is carried in the dtype
        if t.ggml_type in (GGMLType.F32, GGMLType.F16):
            got = t.to_float32()
            assert got.dtype == np.float32 and got.dtype.isnative
            np.testing.assert_array_equal(got, want.astype(np.float32))


def test_bf16_big_endian_dequantizes_in_native_order(tmp_path):
    values = np.array([[1.0, -2.5, 2.0**100, -0.0]], dtype=np.float32)  # exact in bfloat16
    bits = (values.view(np.uint32) >> 16).astype("<u2")
    path = tmp_path / "bf16.gguf"
    for byteorder in ("little", "big"):
        with GGUFWriter(path, Metadata(), byteorder=byteorder) as w:
            w.add_tensor("x", values.shape, GGMLType.BF16)
            w.write_tensor("x", bits)
        np.testing.assert_array_equal(GGUFReader(path).tensor("x").to_float32(), values)


def test_tensor_data_is_a_view_of_the_file(tmp_path):
    path = tmp_path / "view.gguf"
    write_ours(path, Metadata(), [("w", (4, 32), GGMLType.Q8_0)])
    t = GGUFReader(path).tensor("w")
    assert t.data.dtype == np.uint8 and not t.data.flags.owndata and not t.data.flags.writeable
    assert t.data.tobytes() == path.read_bytes()[t.offset : t.offset + t.nbytes]
