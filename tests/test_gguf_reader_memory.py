"""Memory of the GGUF reader and `inspect` against the size of the file, for hostile and real files.

A hostile file spends its bytes on what costs a reader the most per byte (tests/hostile_gguf.py);
a reader that builds one Python object per element took 9-21x the file, `inspect --json` up to
119x. The reader keeps positions and decodes on access, `inspect` streams its output: both must
stay within a small multiple of the file size. Peak Python allocations are measured with
tracemalloc (memory is deterministic, unlike time); the end-to-end test measures the peak RSS of
`ggufsmith inspect --json` in a subprocess against an interpreter that only imports ggufsmith.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from ggufsmith.gguf_writer import inspect
from ggufsmith.gguf_writer.reader import GGUFReader
from tests.gguf_helpers import VOCAB_FILES
from tests.hostile_gguf import HOSTILE_FILES, write_hostile

REPO = Path(__file__).resolve().parent.parent
SIZE = 300_000
MAX_RATIO = 3.0  # peak Python allocations / file size
SLACK = 256 * 1024  # fixed costs (a chunk of --json output, numpy temporaries of a small file)


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile")
    return {kind: write_hostile(folder, kind, SIZE) for kind in HOSTILE_FILES}


def read_everything(path: Path) -> None:
    """What a caller of the reader may do: look at every value and every tensor, keeping none."""
    reader = GGUFReader(path)
    for _key, value in reader.metadata.items():
        if hasattr(value.value, "__len__") and len(value.value):
            value.value[len(value.value) - 1]  # random access builds the element index
    for tensor in reader.tensors:
        tensor.data


def inspect_text(path: Path) -> None:
    for _line in inspect.text_lines(GGUFReader(path)):
        pass


def inspect_json(path: Path) -> None:
    for _piece in inspect.json_pieces(GGUFReader(path)):
        pass


USES = {"reader": read_everything, "inspect": inspect_text, "inspect --json": inspect_json}


def peak_allocations(use, path: Path) -> int:
    use(VOCAB_FILES[0])  # imports and caches warmed up: they are not the file's cost
    tracemalloc.start()
    try:
        use(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("use", list(USES))
@pytest.mark.parametrize("kind", list(HOSTILE_FILES))
def test_memory_on_hostile_files_is_a_small_multiple_of_the_file(hostile_files, kind, use):
    path = hostile_files[kind]
    size = path.stat().st_size
    peak = peak_allocations(USES[use], path)
    assert peak <= MAX_RATIO * size + SLACK, f"{use} of {kind}: {peak:,} bytes for a {size:,}-byte file ({peak / size:.1f}x)"


@pytest.mark.parametrize("use", list(USES))
@pytest.mark.parametrize("path", VOCAB_FILES, ids=lambda p: p.name)
def test_memory_on_real_vocab_files(path, use):
    size = path.stat().st_size
    peak = peak_allocations(USES[use], path)
    assert peak <= MAX_RATIO * size + SLACK, f"{use} of {path.name}: {peak:,} bytes ({peak / size:.1f}x)"


def test_the_lazy_values_are_the_values(hostile_files):
    # The memory is saved by decoding on access; what is decoded must still be the whole file.
    reader = GGUFReader(hostile_files["tiny_strings"])
    tokens = reader.metadata["tokenizer.ggml.tokens"].value
    assert len(tokens) == (SIZE // 10) and tokens[-1] == "ab" and tokens[:2] == ("ab", "ab")
    nested = GGUFReader(hostile_files["nested_string_arrays"]).metadata["test.nested"].value
    assert nested[-1].plain() == ["x"] and len(nested) == SIZE // 21
    table = GGUFReader(hostile_files["many_tensors"])
    assert len(table.tensors) == SIZE // 36 and table.tensors[-1].name == f"t{SIZE // 36 - 1:x}"
    assert table.tensor("t10").shape == (0,)
    keys = GGUFReader(hostile_files["many_keys"]).metadata
    assert len(keys) == SIZE // 18 and keys.get("k100") == 1 and "k100" in keys and "nope" not in keys


# In a fresh interpreter: reset the peak RSS once everything is imported (Linux: clear_refs 5), so
# that the peak measured is the inspection's, not an import's.
RSS_CHILD = """
import sys
from ggufsmith.gguf_writer import inspect

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

inspect_json = inspect.json_pieces(inspect.GGUFReader(sys.argv[2]))  # the small file: warms up
for piece in inspect_json:
    pass
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
with open("/dev/null", "w") as sink:
    for piece in inspect.json_pieces(inspect.GGUFReader(sys.argv[1])):
        sink.write(piece)
print(status("VmHWM:") - before)
"""


@pytest.mark.slow
def test_inspect_json_peak_rss_of_a_12_mb_nested_array_file(tmp_path):
    # The case: 12 MB of nested arrays took 1.43 GB. RSS also counts the mapped file (1x).
    path = write_hostile(tmp_path, "nested_string_arrays", 12_000_000)
    size = path.stat().st_size
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(path), str(VOCAB_FILES[0])], cwd=REPO,
                         capture_output=True, text=True, timeout=600, check=True)
    used = int(out.stdout)
    assert used <= (MAX_RATIO + 1) * size, f"{used:,} bytes of RSS for a {size:,}-byte file ({used / size:.1f}x)"
