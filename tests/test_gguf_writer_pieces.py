"""GGUFWriter.write_tensor_pieces (a tensor streamed in slices) and the fsync switch."""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.constants import GGMLType
from ggufsmith.errors import GGUFError
from ggufsmith.gguf_writer import GGUFWriter, Metadata

gguf = pytest.importorskip("gguf")


def _metadata() -> Metadata:
    md = Metadata()
    md.add_string("general.architecture", "llama")
    return md


def test_pieces_give_the_same_file_as_one_write(tmp_path):
    data = np.arange(7 * 33, dtype=np.float32).reshape(7, 33)
    with GGUFWriter(tmp_path / "whole.gguf", _metadata()) as w:
        w.add_tensor("a", data.shape, GGMLType.F32)
        w.add_tensor("b", (3,), GGMLType.F32)
        w.write_tensor("a", data)
        w.write_tensor("b", np.ones(3, np.float32))
    with GGUFWriter(tmp_path / "pieces.gguf", _metadata()) as w:
        w.add_tensor("a", data.shape, GGMLType.F32)
        w.add_tensor("b", (3,), GGMLType.F32)
        w.write_tensor_pieces("a", (data[i:i + 2] for i in range(0, 7, 2)))
        w.write_tensor_pieces("b", [np.ones(3, np.float32)])
    assert (tmp_path / "whole.gguf").read_bytes() == (tmp_path / "pieces.gguf").read_bytes()
    reader = gguf.GGUFReader(tmp_path / "pieces.gguf")
    np.testing.assert_array_equal(np.asarray(reader.tensors[0].data), data)


@pytest.mark.parametrize("pieces", [[np.zeros(5, np.float32)], [np.zeros(4, np.float32)] * 3])
def test_wrong_total_size_aborts_and_leaves_nothing(tmp_path, pieces):
    w = GGUFWriter(tmp_path / "x.gguf", _metadata())
    w.add_tensor("a", (8,), GGMLType.F32)
    with pytest.raises(GGUFError, match="tensor a: .*(expected 32 bytes|more than)"):
        w.write_tensor_pieces("a", iter(pieces))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_switch(tmp_path, monkeypatch, fsync):
    import ggufsmith.gguf_writer.writer as writer_module

    calls = []
    monkeypatch.setattr(writer_module.os, "fsync", lambda fd: calls.append(fd))
    with GGUFWriter(tmp_path / "x.gguf", _metadata(), fsync=fsync) as w:
        w.add_tensor("a", (2,), GGMLType.F32)
        w.write_tensor("a", np.zeros(2, np.float32))
    assert len(calls) == (1 if fsync else 0)
    assert gguf.GGUFReader(tmp_path / "x.gguf").tensors[0].name == "a"
