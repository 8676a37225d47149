"""Layout operations that must keep an expert stack streaming (row slices, never the whole stack):
interleaved splits (gpt-oss' alternating gate/up rows), transposed stacks (experts stored (in, out)),
and the pieces of an EncodedTensor keeping their stored bytes. Checked against numpy's slicing of
the whole array, with the rows each read asks the file for recorded."""

from __future__ import annotations

import numpy as np
import pytest

from ggufsmith.constants import GGMLType
from ggufsmith.readers.lazy_tensor import EncodedTensor, RowSlicedTensor


def sliced(array: np.ndarray, reads: list | None = None) -> RowSlicedTensor:
    rows = array.reshape(-1, array.shape[-1])

    def load_rows(start: int, stop: int) -> np.ndarray:
        if reads is not None:
            reads.append(stop - start)
        return rows[start:stop].copy()

    return RowSlicedTensor(array.shape, "F32", lambda: array.copy(), "test", load_rows)


def all_row_ranges(n_rows: int):
    return [(a, b) for a in range(n_rows) for b in range(a, n_rows + 1)]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape,axis", [((3, 8, 5), -2), ((2, 6, 3, 4), 1)])
def test_split_pieces_stream_the_right_rows(shape, axis, interleaved):
    array = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    pieces = sliced(array).split(2, axis, interleaved=interleaved)
    a = axis % len(shape)
    for index, piece in enumerate(pieces):
        cut = (slice(None),) * a + ((slice(index, None, 2),) if interleaved else (slice(index * shape[a] // 2, (index + 1) * shape[a] // 2),))
        expected = array[cut].reshape(-1, shape[-1])
        assert isinstance(piece, RowSlicedTensor)
        assert np.array_equal(piece.load(), array[cut])
        for start, stop in all_row_ranges(len(expected)):
            assert np.array_equal(piece.load_rows(start, stop).reshape(-1, shape[-1]), expected[start:stop])


def test_encoded_pieces_keep_their_stored_bytes():
    values = np.arange(4 * 6 * 32, dtype=np.float32).reshape(4, 6, 32)
    raw = np.arange(4 * 6 * 17, dtype=np.uint8).reshape(4 * 6, 17)  # one 17-byte "block" per row
    source = sliced(values)
    tensor = EncodedTensor(values.shape, "MXFP4", source.loader, "test", source.rows_loader,
                           stored_type=GGMLType.MXFP4, raw_loader=lambda start, stop: raw[start:stop])
    gate, up = tensor.split(2, -2, interleaved=True)
    assert isinstance(up, EncodedTensor) and up.stored_type == GGMLType.MXFP4
    expected = raw.reshape(4, 6, 17)[:, 1::2].reshape(-1, 17)
    for start, stop in all_row_ranges(len(expected)):
        assert np.array_equal(up.raw_rows(start, stop).reshape(-1, 17), expected[start:stop])


def test_transposed_stack_reads_one_matrix_at_a_time():
    array = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    reads: list[int] = []
    tensor = sliced(array, reads).swap_last_axes()
    expected = np.swapaxes(array, -1, -2)
    assert tensor.shape == (3, 7, 5)
    for start, stop in all_row_ranges(21):
        assert np.array_equal(tensor.load_rows(start, stop), expected.reshape(-1, 5)[start:stop])
    assert max(reads) == 5  # never more than one stored matrix per read


def test_interleaved_rows_of_a_transposed_stack_read_each_matrix_once():
    """gpt-oss' float gate_up: transposed, then every other row. A range of rows reads each matrix it
    touches once (reading it once per row made a 1 GB stack take minutes)."""
    array = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    reads: list[int] = []
    gate, up = sliced(array, reads).swap_last_axes().split(2, -2, interleaved=True)
    expected = np.swapaxes(array, -1, -2)[:, 1::2].reshape(-1, 5)
    reads.clear()
    assert np.array_equal(up.load_rows(0, 12), expected)
    assert reads == [5, 5, 5]
