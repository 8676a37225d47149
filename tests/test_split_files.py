"""Split output and input (issue 19): --split-max-size / --split-max-tensors on convert and quantize,
`ggufsmith split` and `ggufsmith merge`, and models split by gguf-py's split writer read back.

Oracles: llama.cpp (llama-cpp-python) loads a split model from its first part and must give the
single file's logits; gguf-py's GGUFWriter(split_max_tensors=/split_max_size=), the writer of
llama.cpp's converter, must write the same parts byte for byte as `convert --split-max-*`; merging
our parts must give back the single file. `ggufsmith split` and `merge` against llama-gguf-split
itself: tests/test_llama_gguf_split.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.converters.split import SplitRule, parse_split_size
from ggufsmith.gguf_writer.reader import GGUFReader
from tests.damaged_inputs import run_cli
from tests.test_llama_convert import llamacpp_logits

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "tiny-llama"
IDS = [1, 450, 1148, 1874, 1623, 278, 1817, 889, 1543, 386]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single") / "tiny-f16.gguf"
    ggufsmith.convert(EXAMPLE, out, "f16")
    return out


@pytest.fixture(scope="module")
def single_logits(single) -> np.ndarray:
    return llamacpp_logits(single, IDS)


def parts_of(folder: Path, prefix: str) -> list[Path]:
    return sorted(folder.glob(f"{prefix}-*-of-*.gguf"))


def split_keys(path: Path) -> dict:
    import gguf

    fields = gguf.GGUFReader(path).fields
    return {key: (fields[key].types[0].name, int(fields[key].contents())) for key in
            ("split.no", "split.count", "split.tensors.count") if key in fields}


def tensor_counts(paths: list[Path]) -> list[int]:
    return [len(GGUFReader(p).tensors) for p in paths]


def test_split_sizes_are_read_as_llamacpp_reads_them():
    assert [parse_split_size(s) for s in ("300", "2K", "5M", "4G", "4g")] == [300, 2000, 5 * 10**6, 4 * 10**9, 4 * 10**9]
    for bad in ("", "0", "-1M", "1.5G", "4T", "G"):
        with pytest.raises(ggufsmith.errors.ConversionError, match="--split-max-size"):
            parse_split_size(bad)


def test_convert_split_by_tensor_count_loads_with_the_same_logits(single, single_logits, tmp_path):
    proc = run_cli("convert", EXAMPLE, tmp_path / "tiny.gguf", "--split-max-tensors", "5", "-q")
    assert proc.returncode == 0, proc.stderr
    parts = parts_of(tmp_path, "tiny")
    n_tensors = len(GGUFReader(single).tensors)
    count = -(-n_tensors // 5)
    assert [p.name for p in parts] == [f"tiny-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in parts]  # no single file, no temp file
    assert tensor_counts(parts) == [5] * (count - 1) + [n_tensors - 5 * (count - 1)]
    for index, part in enumerate(parts):
        assert split_keys(part) == {"split.no": ("UINT16", index), "split.count": ("UINT16", count),
                                    "split.tensors.count": ("INT32", n_tensors)}
    # the model's metadata is in the first part only
    assert "general.architecture" in GGUFReader(parts[0]).metadata
    assert all(list(GGUFReader(p).metadata) == ["split.no", "split.count", "split.tensors.count"] for p in parts[1:])
    np.testing.assert_array_equal(llamacpp_logits(parts[0], IDS), single_logits)
    # merged back, it is the single file byte for byte
    merged = tmp_path / "merged.gguf"
    proc = run_cli("merge", parts[0], merged, "-q")
    assert proc.returncode == 0, proc.stderr
    assert merged.read_bytes() == single.read_bytes()


def test_convert_split_by_size_loads_with_the_same_logits(single, single_logits, tmp_path):
    max_size = 400_000
    proc = run_cli("convert", EXAMPLE, tmp_path / "tiny.gguf", "--split-max-size", "400K", "-q")
    assert proc.returncode == 0, proc.stderr
    parts = parts_of(tmp_path, "tiny")
    assert len(parts) > 2
    for part in parts:
        reader = GGUFReader(part)
        data = sum(-(-t.nbytes // 32) * 32 for t in reader.tensors)
        assert data <= max_size or len(reader.tensors) == 1, part.name
    # cut as late as the limit allows: each part's data plus the next part's first tensor is over it
    readers = [GGUFReader(p) for p in parts]
    for this, following in zip(readers, readers[1:]):
        padded = [-(-t.nbytes // 32) * 32 for t in this.tensors]
        assert sum(padded) + -(-following.tensors[0].nbytes // 32) * 32 > max_size
    np.testing.assert_array_equal(llamacpp_logits(parts[0], IDS), single_logits)
    ggufsmith.merge_gguf(parts[0], tmp_path / "merged.gguf")
    assert (tmp_path / "merged.gguf").read_bytes() == single.read_bytes()


def test_a_model_that_fits_one_part_is_one_file(tmp_path):
    proc = run_cli("convert", EXAMPLE, tmp_path / "tiny.gguf", "--split-max-size", "1G", "-q")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]
    assert split_keys(tmp_path / "tiny.gguf") == {}


def gguf_py_split(single: Path, dst: Path, **limits) -> list[Path]:
    """The parts gguf-py's writer (llama.cpp's converter's) makes of `single`, from its keys and tensors."""
    import gguf

    theirs = gguf.GGUFReader(single)
    ours = GGUFReader(single)
    writer = gguf.GGUFWriter(dst, str(ours.metadata["general.architecture"].value), **limits)
    for key, item in ours.metadata.items():
        if key not in ("general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"):
            value = list(item.value) if isinstance(item.value, (list, tuple, np.ndarray)) else item.value
            writer.add_key_value(key, value, gguf.GGUFValueType(int(item.type)),
                                 gguf.GGUFValueType(int(item.element_type)) if item.element_type is not None else None)
    for t in theirs.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(dst.parent.glob(f"{dst.stem}-*-of-*.gguf"))


@pytest.mark.parametrize("option, limits", [
    (("--split-max-tensors", "7"), dict(split_max_tensors=7)),
    (("--split-max-size", "300K"), dict(split_max_size=300_000)),
])
def test_convert_writes_the_parts_gguf_py_writes(single, tmp_path, option, limits):
    (tmp_path / "theirs").mkdir()
    theirs = gguf_py_split(single, tmp_path / "theirs" / "m.gguf", **limits)
    assert len(theirs) > 2
    proc = run_cli("convert", EXAMPLE, tmp_path / "m.gguf", "--outtype", "f16", *option, "-q")
    assert proc.returncode == 0, proc.stderr
    ours = parts_of(tmp_path, "m")
    assert [p.name for p in ours] == [p.name for p in theirs]
    for mine, other in zip(ours, theirs):
        assert mine.read_bytes() == other.read_bytes(), mine.name


def test_files_split_by_gguf_py_are_read_inspected_and_requantized(single, tmp_path):
    (tmp_path / "theirs").mkdir()
    parts = gguf_py_split(single, tmp_path / "theirs" / "m.gguf", split_max_tensors=6)
    # inspect, given the first part, reports the whole model: the single file's totals
    assert_inspect_reports_the_whole_model(parts, single)
    ggufsmith.quantize_gguf(single, tmp_path / "from-single.gguf", "Q8_0")
    proc = run_cli("quantize", parts[0], tmp_path / "from-parts.gguf", "Q8_0", "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "from-parts.gguf").read_bytes() == (tmp_path / "from-single.gguf").read_bytes()
    # and merged, or re-split by ours, they are the model
    ggufsmith.merge_gguf(parts[0], tmp_path / "merged.gguf")
    assert (tmp_path / "merged.gguf").read_bytes() == single.read_bytes()


def test_quantize_split_output_loads_with_the_same_logits(single, tmp_path):
    ggufsmith.quantize_gguf(single, tmp_path / "q8.gguf", "Q8_0")
    proc = run_cli("quantize", single, tmp_path / "q8s.gguf", "Q8_0", "--split-max-tensors", "9", "-q")
    assert proc.returncode == 0, proc.stderr
    parts = parts_of(tmp_path, "q8s")
    assert len(parts) > 2 and max(tensor_counts(parts)) == 9
    np.testing.assert_array_equal(llamacpp_logits(parts[0], IDS), llamacpp_logits(tmp_path / "q8.gguf", IDS))
    ggufsmith.merge_gguf(parts[0], tmp_path / "merged.gguf")
    assert (tmp_path / "merged.gguf").read_bytes() == (tmp_path / "q8.gguf").read_bytes()
    # the size limit on quantize too
    proc = run_cli("quantize", single, tmp_path / "q8z.gguf", "Q8_0", "--split-max-size", "200K", "-q")
    assert proc.returncode == 0, proc.stderr
    sized = parts_of(tmp_path, "q8z")
    assert len(sized) > 2
    assert all(sum(-(-t.nbytes // 32) * 32 for t in GGUFReader(p).tensors) <= 200_000 or len(GGUFReader(p).tensors) == 1
               for p in sized)


def test_split_of_a_split_model_resplits_it(single, tmp_path):
    run_cli("split", single, tmp_path / "a", "--split-max-tensors", "4", "-q")
    first = parts_of(tmp_path, "a")[0]
    proc = run_cli("split", first, tmp_path / "b", "--split-max-tensors", "10", "-q")
    assert proc.returncode == 0, proc.stderr
    assert max(tensor_counts(parts_of(tmp_path, "b"))) == 10
    ggufsmith.merge_gguf(parts_of(tmp_path, "b")[0], tmp_path / "merged.gguf")
    assert (tmp_path / "merged.gguf").read_bytes() == single.read_bytes()


def test_inspect_warns_of_a_missing_part(single, tmp_path):
    ggufsmith.split_gguf(single, tmp_path / "m", SplitRule(max_tensors=10))
    parts = parts_of(tmp_path, "m")
    parts[2].unlink()
    proc = run_cli("inspect", parts[0])
    assert proc.returncode == 0, proc.stderr
    assert f"part {parts[2].name} cannot be read" in proc.stdout
    assert f"split model: part 1 of {len(parts)}" in proc.stdout


def test_split_dry_run_names_the_parts_and_writes_nothing(single, tmp_path):
    proc = run_cli("split", single, tmp_path / "m", "--split-max-tensors", "10", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would write 4 parts" in proc.stderr and "m-00004-of-00004.gguf (9 tensors" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def assert_inspect_reports_the_whole_model(parts: list[Path], single: Path) -> None:
    """`ggufsmith inspect --json` of a split's first part reports every part and the single file's totals."""
    proc = run_cli("inspect", parts[0], "--json")
    assert proc.returncode == 0, proc.stderr
    report, whole = json.loads(proc.stdout), json.loads(run_cli("inspect", single, "--json").stdout)
    assert report["split"]["count"] == len(parts) and report["split"]["warnings"] == []
    assert report["split"]["totals"] == {"tensors": len(whole["tensors"]), "parameters": whole["totals"]["parameters"],
                                         "tensor_bytes": whole["totals"]["tensor_bytes"]}
    assert [p["file"] for p in report["split"]["parts"]] == [p.name for p in parts]
