"""`ggufsmith split` and `ggufsmith merge` against llama.cpp's llama-gguf-split (issue 19), compiled
from the pinned llama.cpp's source at test time (tests/gguf_split_tool.py).

- split: the same parts byte for byte (names, split.* keys and their order, tensor order, padding),
  by tensor count and by size, on the example model at F16 and Q4_K_M and on a file of 300 tensors
  of odd sizes (their padding matters);
- merge: ours is the single file; llama-gguf-split's differs from it by exactly three keys, measured here;
- parts written by llama-gguf-split are inspected, requantized and merged by ggufsmith, and parts
  written by ggufsmith are merged by llama-gguf-split into a model llama.cpp runs with the same logits;
- where llama-gguf-split and ggufsmith differ on purpose (README, "Split models"), the difference is asserted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from tests.damaged_inputs import assert_clean_failure, leftovers, run_cli
from tests.gguf_split_tool import llama_gguf_split, run_gguf_split  # noqa: F401  (llama_gguf_split: a fixture)
from tests.test_llama_convert import llamacpp_logits
from tests.test_split_files import assert_inspect_reports_the_whole_model

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "tiny-llama"
IDS = [1, 450, 1148, 1874, 1623, 278, 1817, 889, 1543, 386]
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def write_many_tensors(path: Path, *, alignment: int = 32, count: int = 300, seed: int = 0) -> Path:
    """A GGUF file (written by gguf-py) of `count` F32, F16 and Q8_0 tensors of random odd sizes,
    about 4 MB: many parts, and tensor sizes that are not multiples of the alignment."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    if alignment != 32:
        writer.add_custom_alignment(alignment)
    writer.add_name("many tensors")
    for i in range(count):
        n = int(rng.integers(1, 8000))
        if i % 3 == 0:
            writer.add_tensor(f"t{i}.f32", rng.standard_normal(n).astype(np.float32))
        elif i % 3 == 1:
            writer.add_tensor(f"t{i}.f16", rng.standard_normal((3, n)).astype(np.float16))
        else:
            rows = rng.standard_normal((2, 32 * (1 + n % 5))).astype(np.float32)
            writer.add_tensor(f"t{i}.q8_0", gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    f16 = folder / "tiny-f16.gguf"
    ggufsmith.convert(EXAMPLE, f16, "f16")
    q4 = folder / "tiny-q4_k_m.gguf"
    ggufsmith.quantize_gguf(f16, q4, "Q4_K_M")
    return {"f16": f16, "q4_k_m": q4, "many": write_many_tensors(folder / "many.gguf")}


def parts_of(folder: Path, prefix: str = "m") -> list[Path]:
    return sorted(folder.glob(f"{prefix}-*-of-*.gguf"))


def theirs_split(tool: Path, src: Path, folder: Path, *options: str) -> list[Path]:
    folder.mkdir()
    run_gguf_split(tool, "--split", *options, src, folder / "m")
    return parts_of(folder)


def ours_split(src: Path, folder: Path, *options: str) -> list[Path]:
    folder.mkdir()
    proc = run_cli("split", src, folder / "m", *options, "-q")
    assert proc.returncode == 0, proc.stderr
    return parts_of(folder)


def keys_and_tensors(path: Path) -> tuple[list[tuple[str, str, object]], list[tuple[str, tuple, int, bytes]]]:
    """[(key, type, value)] in file order, [(tensor, shape, type, bytes)] in file order, as gguf-py reads them."""
    import gguf

    reader = gguf.GGUFReader(path)
    keys = [(k, f.types[0].name, f.contents()) for k, f in reader.fields.items() if not k.startswith("GGUF.")]
    tensors = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), np.asarray(t.data).tobytes())
               for t in reader.tensors]
    return keys, tensors


@pytest.mark.parametrize("model, option", [
    ("f16", ("--split-max-tensors", "5")),
    ("f16", ("--split-max-size", "1M")),
    ("f16", ("--split-max-tensors", "1000")),  # one part: still named -00001-of-00001, with the keys
    ("q4_k_m", ("--split-max-tensors", "7")),
    ("q4_k_m", ("--split-max-tensors", "2")),  # (the Q4_K_M file is under 1M, llama-gguf-split's smallest size unit)
    ("many", ("--split-max-tensors", "7")),
    ("many", ("--split-max-size", "1M")),
    ("f16", ("--split-max-tensors", "5", "--no-tensor-first-split")),  # a first part of metadata, padded
    ("many", ("--split-max-size", "1M", "--no-tensor-first-split")),
])
def test_split_writes_llama_gguf_splits_parts(llama_gguf_split, models, tmp_path, model, option):
    theirs = theirs_split(llama_gguf_split, models[model], tmp_path / "theirs", *option)
    ours = ours_split(models[model], tmp_path / "ours", *option)
    assert [p.name for p in ours] == [p.name for p in theirs]
    for mine, other in zip(ours, theirs):
        assert mine.read_bytes() == other.read_bytes(), mine.name
    if option[1] != "1000":
        assert len(ours) > 2
    if "--no-tensor-first-split" in option:
        assert keys_and_tensors(ours[0])[1] == [] and all(keys_and_tensors(p)[1] for p in ours[1:])


def test_split_sizes_are_powers_of_1000_as_llama_gguf_split_reads_them(llama_gguf_split, models, tmp_path):
    """1M is 1,000,000 bytes: with 1024*1024 the tensors of the 4 MB file would be cut elsewhere."""
    theirs = theirs_split(llama_gguf_split, models["many"], tmp_path / "theirs", "--split-max-size", "1M")
    ours = ours_split(models["many"], tmp_path / "ours", "--split-max-size", "1000000")
    in_mebibytes = ours_split(models["many"], tmp_path / "mib", "--split-max-size", str(1024 * 1024))
    assert [p.read_bytes() for p in ours] == [p.read_bytes() for p in theirs]
    assert [p.read_bytes() for p in in_mebibytes] != [p.read_bytes() for p in theirs]


def test_merge_differs_from_llama_gguf_splits_by_its_three_split_keys_only(llama_gguf_split, models, tmp_path):
    """ggufsmith merge writes the single file; llama-gguf-split --merge keeps the first part's
    split.no and split.tensors.count and sets split.count to 0 (moved last): the only difference."""
    single = models["q4_k_m"]
    parts = theirs_split(llama_gguf_split, single, tmp_path / "parts", "--split-max-tensors", "6")
    run_gguf_split(llama_gguf_split, "--merge", parts[0], tmp_path / "theirs.gguf")
    proc = run_cli("merge", parts[0], tmp_path / "ours.gguf", "-q")
    assert proc.returncode == 0, proc.stderr
    ours = tmp_path / "ours.gguf"
    assert ours.read_bytes() == single.read_bytes()

    our_keys, our_tensors = keys_and_tensors(ours)
    their_keys, their_tensors = keys_and_tensors(tmp_path / "theirs.gguf")
    n_tensors = len(our_tensors)
    assert their_keys == our_keys + [("split.no", "UINT16", 0), ("split.tensors.count", "INT32", n_tensors),
                                     ("split.count", "UINT16", 0)]
    assert their_tensors == our_tensors  # names, order, shapes, types, bytes
    # and the data sections (tensors and padding) are the same bytes: only the header is longer
    import gguf

    ours_data = ours.read_bytes()[gguf.GGUFReader(ours).data_offset:]
    theirs_data = (tmp_path / "theirs.gguf").read_bytes()[gguf.GGUFReader(tmp_path / "theirs.gguf").data_offset:]
    assert ours_data == theirs_data


def test_parts_of_llama_gguf_split_are_inspected_requantized_and_merged(llama_gguf_split, models, tmp_path):
    single = models["f16"]
    parts = theirs_split(llama_gguf_split, single, tmp_path / "theirs", "--split-max-size", "1M")
    assert len(parts) > 2
    assert_inspect_reports_the_whole_model(parts, single)

    ggufsmith.quantize_gguf(single, tmp_path / "from-single.gguf", "Q4_K_M")
    proc = run_cli("quantize", parts[0], tmp_path / "from-parts.gguf", "Q4_K_M", "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "from-parts.gguf").read_bytes() == (tmp_path / "from-single.gguf").read_bytes()

    proc = run_cli("merge", parts[0], tmp_path / "merged.gguf", "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "merged.gguf").read_bytes() == single.read_bytes()


@pytest.mark.parametrize("how", ["ggufsmith split", "ggufsmith split --no-tensor-first-split",
                                 "convert --split-max-tensors"])
def test_our_parts_merged_by_llama_gguf_split_run_as_the_single_file(llama_gguf_split, models, tmp_path, how):
    """Parts of `ggufsmith split` (llama-gguf-split's key order) and of `convert` (gguf-py's order)
    run in llama.cpp as the single file, and llama-gguf-split merges them into the model, with the
    single file's tensors and logits."""
    single = models["f16"]
    if how.startswith("ggufsmith split"):
        parts = ours_split(single, tmp_path / "ours", "--split-max-tensors", "6", *how.split()[2:])
    else:
        (tmp_path / "ours").mkdir()
        proc = run_cli("convert", EXAMPLE, tmp_path / "ours" / "m.gguf", "--outtype", "f16",
                       "--split-max-tensors", "6", "-q")
        assert proc.returncode == 0, proc.stderr
        parts = parts_of(tmp_path / "ours")
    assert len(parts) > 2
    single_logits = llamacpp_logits(single, IDS)
    np.testing.assert_array_equal(llamacpp_logits(parts[0], IDS), single_logits)
    merged = tmp_path / "merged.gguf"
    run_gguf_split(llama_gguf_split, "--merge", parts[0], merged)
    merged_keys, merged_tensors = keys_and_tensors(merged)
    single_keys, single_tensors = keys_and_tensors(single)
    assert merged_tensors == single_tensors
    assert [k for k in merged_keys if k[0] not in SPLIT_KEYS] == single_keys
    np.testing.assert_array_equal(llamacpp_logits(merged, IDS), single_logits)


def test_dry_run_names_the_parts_llama_gguf_split_plans(llama_gguf_split, models, tmp_path):
    theirs = run_gguf_split(llama_gguf_split, "--split", "--dry-run", "--split-max-size", "1M", models["many"],
                            tmp_path / "m")
    their_counts = [int(line.split("n_tensors = ")[1].split(",")[0]) for line in theirs.stdout.splitlines()
                    if line.startswith("split ")]
    proc = run_cli("split", models["many"], tmp_path / "m", "--split-max-size", "1M", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []
    names = [f"m-{i:05d}-of-{len(their_counts):05d}.gguf" for i in range(1, len(their_counts) + 1)]
    assert f"would write {len(their_counts)} parts" in proc.stderr
    for name, count in zip(names, their_counts):
        assert f"{name} ({count} tensors" in proc.stderr, name


# Where ggufsmith differs from llama-gguf-split on purpose (README, "Split models"): asserted, so the
# documented behaviour is measured.

def test_a_first_tensor_over_the_size_limit_gets_a_part_where_llama_gguf_split_gives_up(llama_gguf_split, tmp_path):
    import gguf

    src = tmp_path / "big-first.gguf"
    writer = gguf.GGUFWriter(src, "llama")
    for i, n in enumerate([400_000, 10, 10]):  # 1.6 MB, then two small tensors
        writer.add_tensor(f"x{i}", np.full(n, i, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    proc = run_gguf_split(llama_gguf_split, "--split", "--split-max-size", "1M", src, tmp_path / "theirs", check=False)
    assert proc.returncode != 0 and "0 tensors" in proc.stderr
    ours = ours_split(src, tmp_path / "ours", "--split-max-size", "1M")
    assert [[t[0] for t in keys_and_tensors(p)[1]] for p in ours] == [["x0"], ["x1", "x2"]]


def test_a_custom_alignment_is_kept_where_llama_gguf_split_writes_an_unreadable_first_part(
        llama_gguf_split, tmp_path):
    """general.alignment = 64: llama-gguf-split pads the first part's tensors to 32 bytes and keeps
    the key (readers then refuse it); ggufsmith pads to 64 there. The other parts have no
    alignment key and are the same bytes."""
    import gguf

    src = write_many_tensors(tmp_path / "aligned64.gguf", alignment=64, count=60)
    theirs = theirs_split(llama_gguf_split, src, tmp_path / "theirs", "--split-max-tensors", "10")
    ours = ours_split(src, tmp_path / "ours", "--split-max-tensors", "10")
    assert [p.name for p in ours] == [p.name for p in theirs]
    assert [p.read_bytes() for p in ours[1:]] == [p.read_bytes() for p in theirs[1:]]
    with pytest.raises(ValueError):
        gguf.GGUFReader(theirs[0])
    assert gguf.GGUFReader(ours[0]).alignment == 64
    proc = run_cli("merge", ours[0], tmp_path / "merged.gguf", "-q")
    assert proc.returncode == 0, proc.stderr
    assert keys_and_tensors(tmp_path / "merged.gguf") == keys_and_tensors(src)


# Damaged splits made by llama-gguf-split: one line naming the culprit (tests/damaged_inputs.py).

def a_missing_part(parts: list[Path], other: list[Path]) -> str:
    parts[2].unlink()
    return parts[2].name


def a_part_of_another_split(parts: list[Path], other: list[Path]) -> str:
    shutil.copy(other[2], parts[2])
    return parts[2].name


def a_part_in_the_wrong_place(parts: list[Path], other: list[Path]) -> str:
    data2, data3 = parts[2].read_bytes(), parts[3].read_bytes()
    parts[2].write_bytes(data3)
    parts[3].write_bytes(data2)
    return parts[2].name


@pytest.mark.parametrize("damage", [a_missing_part, a_part_of_another_split, a_part_in_the_wrong_place],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("command", ["merge", "quantize", "split"])
def test_damaged_split_of_llama_gguf_split(llama_gguf_split, models, tmp_path, damage, command):
    parts = theirs_split(llama_gguf_split, models["f16"], tmp_path / "parts", "--split-max-tensors", "5")
    other = theirs_split(llama_gguf_split, models["many"], tmp_path / "other", "--split-max-tensors", "40")
    assert len(other) == len(parts)
    culprit = damage(parts, other)
    out = tmp_path / "out"
    out.mkdir()
    args = {"merge": ["merge", parts[0], out / "x.gguf"], "quantize": ["quantize", parts[0], out / "x.gguf", "Q8_0"],
            "split": ["split", parts[0], out / "x", "--split-max-tensors", "9"]}[command]
    assert_clean_failure(run_cli(*args), culprit, None)
    assert list(out.iterdir()) == [] and leftovers(tmp_path / "parts") == []
