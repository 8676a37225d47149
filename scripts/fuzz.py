"""Mutation fuzzer for every reader of untrusted files in ggufsmith, for long runs.

    python scripts/fuzz.py --cases 100000                       # every reader
    python scripts/fuzz.py --targets gguf,imatrix-dat --cases 2000 --seed 7

Each target builds its own valid seed files here (nothing from this machine), mutates them (bit
flips, interesting integers, cuts, deleted/duplicated/spliced chunks; for JSON-based formats also
values swapped for values of other types, huge numbers, deep nesting) and feeds each case to the
target's public reader, in a worker process so that a hang is caught by a per-case timeout, a crash
does not stop the run, and the memory of each case is measured (peak RSS above the worker's RSS
before the case: Linux's /proc/self/clear_refs resets the peak). The worker's address space is
limited (--memory-limit), so a runaway allocation shows as a MemoryError.

Outcomes: ok; ours (a GgufsmithError subclass: the one-line errors the CLI shows); foreign (any
other exception: each distinct one, by type and innermost ggufsmith frame, is printed and saved
with a reproducer under --findings); hang (per-case --timeout); crash (the worker died). The table
at the end has one row per target, with the largest peak memory of a case against its input size.

Targets call the readers' public entry points: GGUFReader (and `inspect`'s text and JSON output),
read_imatrix (GGUF and legacy .dat), SafetensorsFile (and each tensor's load), and
export_tokenizer for a folder holding a SentencePiece tokenizer.model or a tokenizer.json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import random
import resource
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from ggufsmith.errors import GgufsmithError  # noqa: E402


# -- seeds: valid files, built here ------------------------------------------------------------------
def gguf_seeds() -> list[bytes]:
    """Small GGUF files with every kind of metadata value and a few tensor types, in both byte orders."""
    from ggufsmith.constants import GGMLType, GGUFValueType
    from ggufsmith.gguf_writer import GGUFWriter, Metadata
    from ggufsmith.gguf_writer.metadata import make_value
    from ggufsmith.quantize import quantize

    seeds = []
    for byteorder, with_quantized, n_tokens in (("little", True, 5), ("big", False, 5), ("little", False, 4096)):
        md = Metadata()
        md.add_string("general.architecture", "llama")
        md.add_uint32("llama.block_count", 2)
        md.add("test.i8", -3, GGUFValueType.INT8)
        md.add("test.u64", 2**40, GGUFValueType.UINT64)
        md.add("test.f64", 0.25, GGUFValueType.FLOAT64)
        md.add_bool("test.flag", True)
        tokens = ["<s>", "ü", "", "a b", "\u2581x"] + [f"tok{i}" for i in range(n_tokens - 5)]
        md.add_array("tokenizer.ggml.tokens", tokens, GGUFValueType.STRING)
        md.add_array("tokenizer.ggml.scores", np.linspace(-1, 1, n_tokens, dtype=np.float32), GGUFValueType.FLOAT32)
        md.add_array("test.bools", [True, False], GGUFValueType.BOOL)
        inner = [make_value("x", [1, 2], GGUFValueType.ARRAY, GGUFValueType.INT32),
                 make_value("x", ["s"], GGUFValueType.ARRAY, GGUFValueType.STRING)]
        md.add_array("test.nested", inner, GGUFValueType.ARRAY)
        rng = np.random.default_rng(0)
        tensors = [("token_embd.weight", rng.standard_normal((4 if n_tokens == 5 else 256, 32)).astype(np.float32), GGMLType.F32),
                   ("output_norm.weight", rng.standard_normal(32).astype(np.float16), GGMLType.F16)]
        if with_quantized:
            tensors.append(("blk.0.attn_q.weight", quantize(rng.standard_normal((2, 256)).astype(np.float32), GGMLType.Q4_K),
                            GGMLType.Q4_K))
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "seed.gguf"
            with GGUFWriter(path, md, byteorder=byteorder) as writer:
                for name, data, ggml_type in tensors:
                    shape = data.shape if ggml_type != GGMLType.Q4_K else (2, 256)
                    writer.add_tensor(name, shape, ggml_type)
                for name, data, _ in tensors:
                    writer.write_tensor(name, data)
            seeds.append(path.read_bytes())
    return seeds


IMATRIX_ROWS = {"blk.0.attn_q.weight": 64, "blk.0.ffn_down.weight": 96, "blk.0.ffn_up_exps.weight": (3, 32),
                "blk.1.ffn_down.weight": 16384}  # 64 KiB: so that some cases are large enough to measure memory against


def imatrix_gguf_seeds() -> list[bytes]:
    from ggufsmith.quantize.imatrix import write_imatrix

    entries = {}
    for name, rows in IMATRIX_ROWS.items():
        n_mat, length = rows if isinstance(rows, tuple) else (1, rows)
        entries[name] = (np.arange(n_mat * length, dtype=np.float32), np.arange(1, n_mat + 1, dtype=np.float32))
    with tempfile.TemporaryDirectory() as folder:
        path = write_imatrix(Path(folder) / "imatrix.gguf", entries, ["calibration.txt"], 4, 512)
        return [path.read_bytes()]


def imatrix_dat_seeds() -> list[bytes]:
    """llama.cpp's legacy format: int32 entry count; per entry int32 name length, name, int32 ncall,
    int32 nval, nval float32; then int32 chunk count, int32 dataset name length, dataset name."""
    out = struct.pack("<i", len(IMATRIX_ROWS))
    for name, rows in IMATRIX_ROWS.items():
        n = rows[0] * rows[1] if isinstance(rows, tuple) else rows
        out += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 3, n) + np.arange(n, dtype="<f4").tobytes()
    return [out, out + struct.pack("<ii", 4, 15) + b"calibration.txt"]


def safetensors_seeds() -> list[bytes]:
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((8, 16)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(16).astype(np.float16),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((256, 64)).astype(np.float32),
        "position_ids": np.arange(6, dtype=np.int64),
    }
    bf16 = save({"w": rng.standard_normal((2, 8)).astype(np.float32)})  # stored as F32, relabelled BF16 below
    (length,) = struct.unpack_from("<Q", bf16)
    header = json.loads(bf16[8 : 8 + length])
    header["w"].update(dtype="BF16", shape=[4, 8])
    text = json.dumps(header).encode()
    return [save(tensors, metadata={"format": "pt"}), struct.pack("<Q", len(text)) + text + bf16[8 + length :]]


_SPM_TEXT = [
    "The quick brown fox jumps over the lazy dog.", "Numbers 3 33 333 3.14159 2024-01-31.",
    "Ünïcödé: café, naïve, Straße, 日本語のテキスト, Привет.", "def f(x):\n\treturn x ** 2  # square",
]


def sentencepiece_seeds() -> list[bytes]:
    import sentencepiece as spm

    seeds = []
    for byte_fallback in (True, False):  # BPE: the SentencePiece models llama.cpp's 'llama' tokenizer reproduces
        buffer = io.BytesIO()
        lines = [f"{_SPM_TEXT[i % len(_SPM_TEXT)]} {i}" for i in range(400)]
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buffer, model_type="bpe",
                                       vocab_size=600, byte_fallback=byte_fallback, normalization_rule_name="identity",
                                       hard_vocab_limit=False, minloglevel=3)
        seeds.append(buffer.getvalue())
    return seeds


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (a byte-level BPE's base vocabulary)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def tokenizer_json_seeds() -> list[bytes]:
    alphabet = _byte_alphabet()
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]
    vocab = {tok: i for i, tok in enumerate(alphabet + ["".join(m) for m in merges])}
    eos = "<|endoftext|>"
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": len(vocab), "content": eos, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }
    string_merges = json.loads(json.dumps(tokenizer))
    string_merges["model"]["merges"] = [" ".join(m) for m in merges]
    return [json.dumps(t, ensure_ascii=False).encode() for t in (tokenizer, string_merges)]


# -- targets: the public readers -----------------------------------------------------------------------
def read_gguf(path: Path) -> None:
    from ggufsmith.gguf_writer import inspect
    from ggufsmith.gguf_writer.reader import GGUFReader

    reader = GGUFReader(path)
    for _key, value in reader.metadata.items():
        value.plain()
    for tensor in reader.tensors:
        tensor.data
    for _ in inspect.text_lines(reader):
        pass
    for _ in inspect.json_pieces(reader):
        pass


def read_imatrix_file(path: Path) -> None:
    from ggufsmith.quantize.imatrix import read_imatrix

    read_imatrix(path)


def read_safetensors(path: Path) -> None:
    from ggufsmith.readers.safetensors import SafetensorsFile

    f = SafetensorsFile(path)
    try:
        for tensor in f.tensors.values():
            tensor.load()
    finally:
        f.close()


def export_tokenizer_folder(path: Path) -> None:
    from ggufsmith.tokenizer import export_tokenizer

    export_tokenizer(path.parent)


TOKENIZER_CONFIG = json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True})
GPT2_TOKENIZER_CONFIG = json.dumps({"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})


@dataclass
class Target:
    file_name: str  # the mutated file's name, in a folder of its own
    seeds: Callable[[], list[bytes]]
    read: Callable[[Path], None]
    is_json: bool = False  # mutate JSON values too (for safetensors: its JSON header)
    companions: dict[str, str] = field(default_factory=dict)  # other files of the folder, unchanged


TARGETS: dict[str, Target] = {
    "gguf": Target("model.gguf", gguf_seeds, read_gguf),
    "imatrix-gguf": Target("imatrix.gguf", imatrix_gguf_seeds, read_imatrix_file),
    "imatrix-dat": Target("imatrix.dat", imatrix_dat_seeds, read_imatrix_file),
    "safetensors": Target("model.safetensors", safetensors_seeds, read_safetensors, is_json=True),
    "tokenizer-model": Target("tokenizer.model", sentencepiece_seeds, export_tokenizer_folder,
                              companions={"tokenizer_config.json": TOKENIZER_CONFIG}),
    "tokenizer-json": Target("tokenizer.json", tokenizer_json_seeds, export_tokenizer_folder, is_json=True,
                             companions={"tokenizer_config.json": GPT2_TOKENIZER_CONFIG}),
}


# -- mutations --------------------------------------------------------------------------------------
LARGE_SEED = 32 * 1024
INTERESTING = [0, 1, 2, 7, 8, 31, 32, 63, 64, 127, 128, 255, 256, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def mutate_bytes(rng: random.Random, data: bytes, seeds: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
        kind = rng.randrange(9)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:  # flip bits
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:  # an interesting byte
            buf[min(pos, len(buf) - 1)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif kind in (2, 3):  # an interesting integer, at a random or aligned place
            width, fmt = rng.choice(((4, "I"), (8, "Q"), (2, "H")))
            value = rng.choice(INTERESTING) % (1 << (8 * width))
            pos = pos - pos % width if kind == 3 else pos
            buf[pos : pos + width] = struct.pack(rng.choice("<>") + fmt, value)
        elif kind == 4:  # cut
            del buf[pos:]
        elif kind == 5:  # delete a chunk
            del buf[pos : pos + rng.choice((1, 4, 8, rng.randrange(1, 64)))]
        elif kind == 6 and buf:  # duplicate a chunk
            start = rng.randrange(len(buf))
            chunk = buf[start : start + rng.randrange(1, 256)]
            buf[pos:pos] = chunk * rng.choice((1, 2, 16))
        elif kind == 7:  # splice in part of another seed
            other = rng.choice(seeds)
            start = rng.randrange(len(other))
            buf[pos : pos + rng.randrange(64)] = other[start : start + rng.randrange(1, 128)]
        else:  # random bytes
            buf[pos:pos] = rng.randbytes(rng.randrange(1, 16))
    return bytes(buf)


def _json_paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _json_paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _json_paths(value, path + (i,))


DEEP = "\u0000deep\u0000"  # replaced by deeply nested brackets once the document is text


def _strange_value(rng: random.Random):
    return rng.choice([DEEP, DEEP,
        None, True, False, 0, -1, 1.5, float(2**64), 2**64, -(2**63), 2**31, 10**30, "", "x" * 10_000, "\ud800",
        [], {}, [1, "a", None], {"type": 7}, "F32", "BF16", "I64", [2**63, 2], [-1], [True, 3],
    ])


def mutate_json(rng: random.Random, document, seeds: list[bytes]) -> bytes:
    """Replace, delete or duplicate a value somewhere in `document` (a parsed copy)."""
    for _ in range(rng.choice((1, 1, 2, 3))):
        paths = list(_json_paths(document))
        path = rng.choice(paths)
        if not path:
            document = _strange_value(rng) if rng.random() < 0.1 else document
            continue
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        action = rng.randrange(4)
        if action == 0:
            parent[last] = _strange_value(rng)
        elif action == 1:
            del parent[last]
        elif action == 2 and isinstance(parent, list):
            parent.insert(last, parent[last])
        elif isinstance(parent, dict):
            parent[rng.choice(list(parent))] = parent[last]  # another key's value
    text = json.dumps(document, ensure_ascii=rng.random() < 0.5)
    depth = rng.choice((2, 50, 100_000))
    text = text.replace(json.dumps(DEEP), "[" * depth + "]" * depth)
    return text.encode("utf-8", "surrogatepass")


def mutate(rng: random.Random, target: Target, seeds: list[bytes]) -> bytes:
    # Large seeds (there to measure memory against size) are slow to read: one case in ten.
    small = [s for s in seeds if len(s) < LARGE_SEED] or seeds
    seed = rng.choice(seeds if rng.random() < 0.1 else small)
    if not target.is_json or rng.random() < 0.4:
        return mutate_bytes(rng, seed, seeds)
    if target.file_name.endswith(".safetensors"):  # the JSON header after its uint64 length
        (length,) = struct.unpack_from("<Q", seed)
        header = mutate_json(rng, json.loads(seed[8 : 8 + length]), seeds)
        return struct.pack("<Q", len(header)) + header + seed[8 + length :]
    return mutate_json(rng, json.loads(seed), seeds)


# -- the worker: runs cases, measures memory ---------------------------------------------------------
def _status(field_name: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field_name))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _innermost_own_frame(tb) -> str:
    frames = [f for f in traceback.extract_tb(tb) if "ggufsmith" in f.filename]
    frame = (frames or traceback.extract_tb(tb))[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def worker_main(conn, target_name: str, folder: str, memory_limit: int) -> None:
    target = TARGETS[target_name]
    folder = Path(folder)
    for name, text in target.companions.items():
        (folder / name).write_text(text)
    path = folder / target.file_name
    vm_size = _status("VmSize:")
    resource.setrlimit(resource.RLIMIT_AS, (vm_size + memory_limit, resource.RLIM_INFINITY))
    sys.setrecursionlimit(10_000)
    can_reset = _reset_peak_rss()
    sink = open(os.devnull, "w")
    while True:
        data = conn.recv()
        if data is None:
            return
        path.write_bytes(data)
        _reset_peak_rss()
        before = _status("VmRSS:")
        outcome, detail = "ok", ""
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                target.read(path)
        except GgufsmithError as e:
            outcome, detail = "ours", str(e)
        except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001 - what the fuzzer looks for
            outcome = "foreign"
            detail = (f"{type(e).__name__} at {_innermost_own_frame(e.__traceback__)}",
                      "".join(traceback.format_exception(e))[-4000:])
        peak = _status("VmHWM:") - before if can_reset else 0
        conn.send((outcome, detail, max(0, peak)))


class Worker:
    """A worker process for one target; restarted after a hang or a crash."""

    def __init__(self, target_name: str, folder: Path, memory_limit: int) -> None:
        self.args = (target_name, str(folder), memory_limit)
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(child, *self.args), daemon=True)
        self.process.start()
        child.close()

    def run(self, data: bytes, timeout: float):
        self.conn.send(data)
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            self.restart()
            return "crash", "", 0
        self.restart()
        return "hang", "", 0

    def restart(self) -> None:
        self.process.kill()
        self.process.join()
        self._start()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()


# -- the driver -------------------------------------------------------------------------------------
@dataclass
class Tally:
    cases: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "ours": 0, "foreign": 0, "hang": 0, "crash": 0})
    distinct_foreign: dict[str, str] = field(default_factory=dict)  # what -> reproducer
    peak: int = 0  # the largest extra RSS of a case
    peak_size: int = 0  # that case's input size
    worst_ratio: float = 0.0  # the largest extra RSS / input size, over cases of at least 64 KiB
    worst_ratio_size: int = 0
    seconds: float = 0.0


def save_finding(findings: Path, target: str, what: str, data: bytes, report: str) -> Path:
    folder = findings / target
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{what.replace(' ', '-').replace(':', '_')}-{hashlib.sha1(data).hexdigest()[:10]}"
    (folder / f"{stem}.txt").write_text(report)
    path = folder / f"{stem}.bin"
    path.write_bytes(data)
    return path


def fuzz(target_name: str, cases: int, rng: random.Random, timeout: float, memory_limit: int, findings: Path) -> Tally:
    target = TARGETS[target_name]
    seeds = target.seeds()
    tally = Tally()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target_name}-") as folder:
        worker = Worker(target_name, Path(folder), memory_limit)
        for seed in seeds:  # the seeds themselves must read cleanly, or the run tells little
            outcome, detail, _ = worker.run(seed, timeout)
            if outcome != "ok":
                print(f"{target_name}: a seed does not read cleanly ({outcome}): {detail or ''}", file=sys.stderr)
        for i in range(cases):
            data = mutate(rng, target, seeds)
            outcome, detail, peak = worker.run(data, timeout)
            tally.cases += 1
            tally.counts[outcome] += 1
            if peak > tally.peak:
                tally.peak, tally.peak_size = peak, len(data)
            if len(data) >= 65536 and peak / len(data) > tally.worst_ratio:
                tally.worst_ratio, tally.worst_ratio_size = peak / len(data), len(data)
            what = detail[0] if outcome == "foreign" else outcome
            if outcome not in ("ok", "ours") and what not in tally.distinct_foreign:
                report = {"foreign": detail[1] if detail else "", "hang": f"no answer within {timeout} s",
                          "crash": "the worker process died"}[outcome]
                saved = save_finding(findings, target_name, what, data, report)
                tally.distinct_foreign[what] = str(saved)
                print(f"{target_name}: case {i}: {what} -> {saved}\n{report}", file=sys.stderr)
            if (i + 1) % 10_000 == 0:
                print(f"{target_name}: {i + 1} cases, {time.perf_counter() - started:.0f} s: {tally.counts}", file=sys.stderr)
        worker.close()
    tally.seconds = time.perf_counter() - started
    return tally


def print_table(results: dict[str, Tally]) -> None:
    header = f"{'target':<16} {'cases':>8} {'ok':>8} {'ours':>8} {'foreign':>8} {'distinct':>8} {'hangs':>6} {'crashes':>7} " \
             f"{'peak MB':>8} {'at input':>9} {'peak/size':>9} {'at input':>9} {'cases/s':>8}"
    print(header)
    print("-" * len(header))
    for name, t in results.items():
        c = t.counts
        print(f"{name:<16} {t.cases:>8} {c['ok']:>8} {c['ours']:>8} {c['foreign']:>8} {len(t.distinct_foreign):>8} "
              f"{c['hang']:>6} {c['crash']:>7} {t.peak / 2**20:>8.1f} {t.peak_size:>9} {t.worst_ratio:>9.2f} {t.worst_ratio_size:>9} "
              f"{t.cases / max(t.seconds, 1e-9):>8.0f}")
    print("peak MB: the largest peak RSS of one case above the worker's RSS before it; at input: that case's "
          "size in bytes; peak/size: the largest ratio over cases of at least 64 KiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of: {', '.join(TARGETS)}")
    parser.add_argument("--cases", type=int, default=1000, help="cases per target (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (a run is reproducible from it)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a case counts as a hang")
    parser.add_argument("--memory-limit", type=int, default=1024, help="MiB of address space a case may add")
    parser.add_argument("--findings", type=Path, default=Path("fuzz-findings"), help="folder for reproducers")
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    results = {}
    for name in names:
        results[name] = fuzz(name, args.cases, random.Random(f"{args.seed}:{name}"), args.timeout,
                             args.memory_limit * 2**20, args.findings)
        print(f"{name}: done in {results[name].seconds:.0f} s", file=sys.stderr)
    print_table(results)
    return 1 if any(t.counts["foreign"] or t.counts["hang"] or t.counts["crash"] for t in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
