"""The writer's own checks: misuse raises GGUFError, and a failed or interrupted write leaves
neither the target file nor a temporary file behind."""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.constants import GGMLType, GGUFValueType
from ggufsmith.errors import GGUFError
from ggufsmith.gguf_writer import GGUFWriter, Metadata
from ggufsmith.gguf_writer.reader import GGUFReader


def _metadata() -> Metadata:
    md = Metadata()
    md.add_string("general.architecture", "llama")
    return md


def _assert_empty(directory) -> None:
    assert list(directory.iterdir()) == [], list(directory.iterdir())


def _two_tensor_writer(path) -> GGUFWriter:
    w = GGUFWriter(path, _metadata())
    w.add_tensor("a", (2, 4), GGMLType.F32)
    w.add_tensor("b", (32,), GGMLType.Q8_0)
    return w


A = np.zeros((2, 4), np.float32)
B = np.zeros(34, np.uint8)

MISUSE = {
    "data out of order": lambda w: w.write_tensor("b", B),
    "undeclared tensor": lambda w: w.write_tensor("c", A),
    "too few bytes": lambda w: w.write_tensor("a", A[:1]),
    "too many bytes": lambda w: w.write_tensor("a", np.zeros(9, np.float32)),
    "finish with data missing": lambda w: (w.write_tensor("a", A), w.finish()),
    "declare after writing": lambda w: (w.write_tensor("a", A), w.add_tensor("c", (4,), GGMLType.F32)),
    "data after the last tensor": lambda w: (w.write_tensor("a", A), w.write_tensor("b", B), w.write_tensor("b", B)),
}


@pytest.mark.parametrize("case", list(MISUSE))
def test_misuse_raises_and_leaves_no_file(tmp_path, case):
    w = _two_tensor_writer(tmp_path / "out.gguf")
    with pytest.raises(GGUFError):
        MISUSE[case](w)
    _assert_empty(tmp_path)


@pytest.mark.parametrize("case", list(MISUSE))
def test_misuse_inside_with_block_leaves_no_file(tmp_path, case):
    with pytest.raises(GGUFError):
        with _two_tensor_writer(tmp_path / "out.gguf") as w:
            MISUSE[case](w)
    _assert_empty(tmp_path)


@pytest.mark.parametrize(
    "declare",
    [
        lambda w: (w.add_tensor("a", (4,), GGMLType.F32), w.add_tensor("a", (4,), GGMLType.F32)),
        lambda w: w.add_tensor("x" * 64, (4,), GGMLType.F32),
        lambda w: w.add_tensor("", (4,), GGMLType.F32),
        lambda w: w.add_tensor("a", (), GGMLType.F32),
        lambda w: w.add_tensor("a", (1, 1, 1, 1, 4), GGMLType.F32),
        lambda w: w.add_tensor("a", (-1, 4), GGMLType.F32),
        lambda w: w.add_tensor("a", (2**62, 2**62), GGMLType.F32),
        lambda w: w.add_tensor("a", (4, 33), GGMLType.Q4_0),
        lambda w: w.add_tensor("a", (4,), 4),
        lambda w: w.add_tensor("a", (4,), 999),
    ],
)
def test_bad_tensor_declarations(tmp_path, declare):
    w = GGUFWriter(tmp_path / "out.gguf", _metadata())
    with pytest.raises(GGUFError):
        declare(w)
    _assert_empty(tmp_path)


def test_63_byte_name_is_the_longest(tmp_path):
    with GGUFWriter(tmp_path / "out.gguf") as w:
        w.add_tensor("x" * 63, (4,), GGMLType.F32)
        w.write_tensor("x" * 63, np.zeros(4, np.float32))
    assert GGUFReader(tmp_path / "out.gguf").tensors[0].name == "x" * 63


@pytest.mark.parametrize("alignment", [0, 1, 4, 12, 48, 100, -32, 32.0])
def test_bad_alignment(tmp_path, alignment):
    with pytest.raises(GGUFError, match="alignment"):
        GGUFWriter(tmp_path / "out.gguf", alignment=alignment)


def test_alignment_metadata_must_agree(tmp_path):
    md = _metadata()
    md.add_uint32("general.alignment", 64)
    with pytest.raises(GGUFError, match="alignment"):
        GGUFWriter(tmp_path / "out.gguf", md, alignment=32).finish()
    md = _metadata()
    md.add_uint64("general.alignment", 32)
    with pytest.raises(GGUFError, match="UINT32"):
        GGUFWriter(tmp_path / "out.gguf", md).finish()
    _assert_empty(tmp_path)


@pytest.mark.parametrize(
    "key", ["General.name", "general..name", "general.name.", "général.name", "", "a b", "-a.b", "a.-b", ".a", "a" * 65536]
)
def test_bad_keys(key):
    with pytest.raises(GGUFError):
        Metadata().add_string(key, "x")


def test_architecture_names_with_hyphens_make_keys():
    """llama.cpp names some architectures with a hyphen (command-r, gpt-oss) and reads their keys so."""
    metadata = Metadata()
    metadata.add_uint32("command-r.block_count", 40)
    assert "command-r.block_count" in metadata


def test_duplicate_key():
    md = _metadata()
    with pytest.raises(GGUFError, match="twice"):
        md.add_string("general.architecture", "gpt2")


@pytest.mark.parametrize(
    "value,vtype",
    [(256, GGUFValueType.UINT8), (-1, GGUFValueType.UINT64), (2**64, GGUFValueType.UINT64), (True, GGUFValueType.INT32),
     (1.5, GGUFValueType.INT32), (1e39, GGUFValueType.FLOAT32), ("1", GGUFValueType.FLOAT64), (1, GGUFValueType.BOOL),
     (3, GGUFValueType.STRING)],
)
def test_values_must_fit_their_type(value, vtype):
    with pytest.raises(GGUFError):
        Metadata().add("test.value", value, vtype)


def test_exception_mid_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with _two_tensor_writer(tmp_path / "out.gguf") as w:
            w.write_tensor("a", A)
            raise RuntimeError("the converter failed")
    _assert_empty(tmp_path)


class _InterruptedFile:
    """Stands in for the writer's open file: the disk write is interrupted by Ctrl-C."""

    def __init__(self, real) -> None:
        self._real = real

    def write(self, data):
        raise KeyboardInterrupt

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_keyboard_interrupt_mid_write_leaves_nothing(tmp_path):
    w = _two_tensor_writer(tmp_path / "out.gguf")
    w.write_tensor("a", A)
    w._out.file = _InterruptedFile(w._out.file)
    with pytest.raises(KeyboardInterrupt):
        w.write_tensor("b", B)
    _assert_empty(tmp_path)


def test_keyboard_interrupt_in_with_block_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with _two_tensor_writer(tmp_path / "out.gguf") as w:
            w.write_tensor("a", A)
            raise KeyboardInterrupt
    _assert_empty(tmp_path)


def test_a_dropped_writer_removes_its_temporary_file(tmp_path):
    w = _two_tensor_writer(tmp_path / "out.gguf")
    w.write_tensor("a", A)
    assert len(list(tmp_path.iterdir())) == 1  # the temporary file
    del w
    _assert_empty(tmp_path)


def test_failed_rewrite_keeps_the_previous_file(tmp_path):
    path = tmp_path / "out.gguf"
    with GGUFWriter(path, _metadata()):
        pass
    before = path.read_bytes()
    with pytest.raises(GGUFError):
        with _two_tensor_writer(path) as w:
            w.write_tensor("b", B)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]


def test_written_file_has_normal_permissions(tmp_path):
    path = tmp_path / "out.gguf"
    with GGUFWriter(path, _metadata()):
        pass
    assert path.stat().st_mode & 0o644 == 0o644
