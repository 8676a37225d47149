"""Shared helpers for the GGUF tests: random metadata and tensors, and gguf-py views of a file.

gguf-py (PyPI `gguf`) is the independent reader/writer the tests compare against; these helpers
only translate its view of a file into plain Python so that it can be compared with ours.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np

from ggufsmith.constants import GGML_TYPE_LAYOUT, GGMLType, GGUFValueType
from ggufsmith.gguf_writer import GGUFWriter, Metadata, MetadataValue
from ggufsmith.gguf_writer.metadata import make_value

DATA_DIR = Path(__file__).parent / "data"
VOCAB_FILES = sorted(DATA_DIR.glob("ggml-vocab-*.gguf"))

INT_LIMITS = {
    GGUFValueType.UINT8: (0, 2**8 - 1),
    GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1),
    GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1),
    GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1),
    GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
FLOAT_SPECIALS = [0.0, -0.0, 1.5, -2.25e-7, math.inf, -math.inf, math.nan, 3.4028234663852886e38, 1e-45]
STRINGS = ["", "a", "hello world", "ünïcödé ✓ 漢字 🦙", "tab\tnew\nline", "\u2581token", "x" * 300]
SCALAR_TYPES = [t for t in GGUFValueType if t not in (GGUFValueType.ARRAY,)]


def random_scalar(rng: random.Random, vtype: GGUFValueType):
    if vtype in INT_LIMITS:
        lo, hi = INT_LIMITS[vtype]
        return rng.choice([lo, hi, 0, rng.randint(lo, hi)])
    if vtype == GGUFValueType.FLOAT32:
        return float(np.float32(rng.choice(FLOAT_SPECIALS + [rng.uniform(-1e6, 1e6)])))
    if vtype == GGUFValueType.FLOAT64:
        return rng.choice(FLOAT_SPECIALS + [1.7976931348623157e308, 5e-324, rng.uniform(-1e300, 1e300)])
    if vtype == GGUFValueType.BOOL:
        return rng.random() < 0.5
    return rng.choice(STRINGS)


def random_array(rng: random.Random, key: str, depth: int = 0, allow_nested: bool = True) -> MetadataValue:
    choices = SCALAR_TYPES + ([GGUFValueType.ARRAY] if allow_nested and depth < 2 else [])
    etype = rng.choice(choices)
    n = rng.choice([0, 1, 2, 5, 40])
    if etype == GGUFValueType.ARRAY:
        items = [random_array(rng, key, depth + 1) for _ in range(n)]
        return make_value(key, items, GGUFValueType.ARRAY, etype)
    values = [random_scalar(rng, etype) for _ in range(n)]
    if etype not in (GGUFValueType.STRING, GGUFValueType.BOOL) and rng.random() < 0.5:
        from ggufsmith.gguf_writer.encoding import NUMPY_DTYPE_OF_VALUE

        values = np.array(values, dtype=NUMPY_DTYPE_OF_VALUE[etype])
    return make_value(key, values, GGUFValueType.ARRAY, etype)


def random_metadata(rng: random.Random, n_keys: int, allow_nested: bool = True) -> Metadata:
    md = Metadata()
    md.add_string("general.architecture", "llama")
    for i in range(n_keys):
        key = f"test.key_{i}.v"
        if rng.random() < 0.35:
            md.add_value(key, random_array(rng, key, allow_nested=allow_nested))
        else:
            vtype = rng.choice(SCALAR_TYPES)
            md.add(key, random_scalar(rng, vtype), vtype)
    return md


def every_value_type_metadata(allow_nested: bool = True) -> Metadata:
    """One key per value type at its extremes, plus arrays of each type (empty ones too)."""
    md = Metadata()
    for vtype, (lo, hi) in INT_LIMITS.items():
        md.add(f"int.{vtype.name.lower()}.min", lo, vtype)
        md.add(f"int.{vtype.name.lower()}.max", hi, vtype)
        md.add_array(f"array.{vtype.name.lower()}", [lo, 0, hi], vtype)
    for i, f in enumerate(FLOAT_SPECIALS):
        md.add(f"float.f32_{i}", f, GGUFValueType.FLOAT32)
        md.add(f"float.f64_{i}", f, GGUFValueType.FLOAT64)
    md.add(f"float.f64_max", 1.7976931348623157e308, GGUFValueType.FLOAT64)
    md.add_array("array.float32", FLOAT_SPECIALS, GGUFValueType.FLOAT32)
    md.add_array("array.float64", FLOAT_SPECIALS, GGUFValueType.FLOAT64)
    md.add_bool("bool.true", True)
    md.add_bool("bool.false", False)
    md.add_array("array.bool", [True, False, True], GGUFValueType.BOOL)
    for i, s in enumerate(STRINGS):
        md.add_string(f"string.s{i}", s)
    md.add_array("array.string", STRINGS, GGUFValueType.STRING)
    md.add_array("array.token_scores", np.linspace(-1, 1, 1000, dtype=np.float32), GGUFValueType.FLOAT32)
    for vtype in SCALAR_TYPES:
        md.add_array(f"array.empty_{vtype.name.lower()}", [], vtype)
    if allow_nested:
        inner = [
            make_value("n", [1, 2, 3], GGUFValueType.ARRAY, GGUFValueType.INT32),
            make_value("n", [], GGUFValueType.ARRAY, GGUFValueType.INT32),
            make_value("n", [7], GGUFValueType.ARRAY, GGUFValueType.INT32),
        ]
        md.add_array("array.nested_int", inner, GGUFValueType.ARRAY)
        strings = [make_value("n", ["a", "ü"], GGUFValueType.ARRAY, GGUFValueType.STRING)]
        md.add_array("array.nested_string", strings, GGUFValueType.ARRAY)
        deeper = [make_value("n", inner, GGUFValueType.ARRAY, GGUFValueType.ARRAY)]
        md.add_array("array.nested_twice", deeper, GGUFValueType.ARRAY)
        md.add_array("array.nested_empty", [], GGUFValueType.ARRAY)
    return md


TENSOR_TYPES = [t for t in GGMLType]


def random_tensor_specs(rng: random.Random, n: int, types=TENSOR_TYPES) -> list[tuple[str, tuple[int, ...], GGMLType]]:
    specs = []
    for i in range(n):
        ggml_type = rng.choice(types)
        block = GGML_TYPE_LAYOUT[ggml_type].block_size
        n_dims = rng.randint(1, 4)
        row = block * rng.randint(0 if rng.random() < 0.05 else 1, 3)
        outer = [rng.randint(1, 4) for _ in range(n_dims - 1)]
        specs.append((f"blk.{i}.weight_{ggml_type.name.lower()}", tuple(outer) + (row,), ggml_type))
    return specs


def tensor_bytes(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    return rng.integers(0, 256, size=nbytes, dtype=np.uint8)


def write_ours(path: Path, metadata: Metadata, specs, alignment: int = 32, byteorder: str = "little", seed: int = 0) -> dict[str, bytes]:
    """Write a file with our writer; returns each tensor's bytes as written in the file."""
    gen = np.random.default_rng(seed)
    written = {}
    with GGUFWriter(path, metadata, alignment=alignment, byteorder=byteorder) as w:
        infos = [w.add_tensor(name, shape, t) for name, shape, t in specs]
        for info in infos:
            data = tensor_bytes(gen, info.nbytes)
            w.write_tensor(info.name, data)
            if byteorder == "big":
                from ggufsmith.constants import GGML_ELEMENT_DTYPE

                e = GGML_ELEMENT_DTYPE[info.ggml_type]
                data = data.view("<" + e).astype(">" + e).view(np.uint8)
            written[info.name] = data.tobytes()
    return written


# -- comparing -----------------------------------------------------------------------------------
def same_value(a, b) -> bool:
    """Equality that treats NaN as equal to NaN and -0.0 as distinct from 0.0 (bit identity)."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool) != isinstance(b, bool):
            return False
        a, b = float(a), float(b)
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def ggufpy_field(field) -> tuple[int, object]:
    """(value type id, plain value) of a gguf-py ReaderField, with nested arrays rebuilt from its parts.

    gguf-py flattens nested arrays into `parts` (a type, a length, then each element's parts);
    this walks them again in the file's own order.
    """
    from gguf import GGUFValueType as PyType

    parts = field.parts[3:]  # after key length, key bytes, value type
    vtype = int(field.types[0])
    pos = 0

    def read(t):
        nonlocal pos
        if t == PyType.STRING:
            raw = bytes(parts[pos + 1])
            pos += 2
            return raw.decode("utf-8")
        if t == PyType.ARRAY:
            etype = int(parts[pos][0])
            n = int(parts[pos + 1][0])
            pos += 2
            return [read(etype) for _ in range(n)]
        v = parts[pos].tolist()[0]
        pos += 1
        if t in (PyType.FLOAT32, PyType.FLOAT64):
            return float(v)
        return bool(v) if t == PyType.BOOL else int(v)

    etype = int(parts[0][0]) if vtype == PyType.ARRAY else None
    value = read(vtype)
    return vtype, etype, value


def ggufpy_metadata(reader) -> dict[str, tuple]:
    return {name: ggufpy_field(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}


def our_metadata(reader) -> dict[str, tuple]:
    return {key: expected_triple(v) for key, v in reader.metadata.items()}


def expected_triple(v: MetadataValue) -> tuple:
    """(type id, element type id or None, plain value) of one of our values."""
    etype = int(v.element_type) if v.element_type is not None else None
    return int(v.type), etype, v.plain()


def same_metadata(a: dict[str, tuple], b: dict[str, tuple]) -> None:
    """Assert two {key: (type, element type, value)} maps are identical, keys in the same order."""
    assert list(a) == list(b)
    for key in a:
        assert a[key][:2] == b[key][:2], (key, a[key][:2], b[key][:2])
        assert same_value(a[key][2], b[key][2]), (key, a[key][2], b[key][2])
