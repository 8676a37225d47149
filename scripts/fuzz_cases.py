"""What scripts/fuzz.py feeds the readers: valid seed files built here (nothing from this machine),
the targets (a reader's public entry point and the file name and companions it is given), and the
mutations of a seed (bit flips, interesting integers, cuts, deleted/duplicated/spliced chunks; for
JSON-based formats also values of other types, huge numbers, deep nesting).

tests/test_reader_fuzz.py and tests/test_fuzz_script.py use the same seeds and targets.
"""

from __future__ import annotations

import io
import json
import random
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


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
