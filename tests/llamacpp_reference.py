"""llama.cpp's own converter (convert_hf_to_gguf.py) as a reference to compare ggufsmith with, and
llama.cpp's vocabulary test files (models/ggml-vocab-*.gguf with their .inp/.out test vectors).

The script, its `conversion` package, its `gguf-py` and the vocabulary files come from the
llama-cpp-python sdist of the version the tests pin (the llama.cpp whose loader the tests also
run), fetched once with pip and cached. Locally the tests that need it are skipped when it cannot be fetched (no network); in CI
(environment variable CI set) that is a failure, so a broken fetch cannot silently disable them.

    from tests.llamacpp_reference import run_reference_converter, reference_conversions
    run_reference_converter(model_dir, out_path, "f16")
    reference_conversions(model_dir, out_dir, ("f32", "f16"))  # {"f32": path, "f16": path}, cached
    vocab_models_dir() / "ggml-vocab-llama-spm.gguf"
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import select
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_SDIST_PREFIX = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
# What the tests need from the sdist: the converter script, its model classes and its gguf package,
# and the vocabulary test files (75 MB).
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/ggml-vocab-")
# Present once the whole extraction is done (the folder is renamed into place only when complete).
_COMPLETE_MARKERS = ("convert_hf_to_gguf.py", "models/ggml-vocab-llama-spm.gguf.out")

# The outtypes ggufsmith's llama files are compared with the reference's at.
COMPARED_OUTTYPES = ("f32", "f16", "bf16", "q8_0")

# Keys of a llama with a SentencePiece tokenizer where ggufsmith's value differs from the reference's
# on purpose, with the reason: all are the tokenizer exporter's documented choices (docs/tokenizers.md,
# tests/test_tokenizer_vs_convert_hf.py). The llama.* and general.* keys and every tensor are the same.
TOKENIZER_KEY_DIFFERENCES: dict[str, str] = {
    "tokenizer.ggml.token_type": "SentencePiece user-defined symbols are typed USER_DEFINED; the reference "
                                 "leaves them NORMAL and llama.cpp then splits them into pieces",
    "tokenizer.ggml.eot_token_id": "written explicitly; llama.cpp finds the same id by its text at load time",
    "tokenizer.ggml.unknown_token_id": "the reference looks special tokens up in tokenizer.json only, absent here",
    "tokenizer.ggml.add_space_prefix": "from SentencePiece's normalizer spec, explicit instead of llama.cpp's default",
    "tokenizer.ggml.remove_extra_whitespaces": "from SentencePiece's normalizer spec, explicit instead of the default",
}

# BPE special-token ids ggufsmith writes and the reference leaves to llama.cpp's load-time search.
EXPLICIT_SPECIAL_IDS: dict[str, str] = {
    key: "written explicitly; llama.cpp finds the same id by its text at load time"
    for key in ("tokenizer.ggml.eot_token_id", *(f"tokenizer.ggml.fim_{kind}_token_id"
                                                 for kind in ("pre", "suf", "mid", "pad", "rep", "sep")))
}


def cache_root() -> Path:
    root = os.environ.get("GGUFSMITH_TEST_CACHE") or Path.home() / ".cache" / "ggufsmith-tests"
    return Path(root)


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"llama.cpp reference converter unavailable in CI: {reason}")
    pytest.skip(f"llama.cpp reference converter unavailable: {reason}")


def reference_dir() -> Path:
    """The folder holding convert_hf_to_gguf.py, conversion/, gguf-py/ and models/ggml-vocab-*
    (fetched on first use)."""
    # The name says what it holds: caches of an older layout (without models/) are not reused.
    target = cache_root() / f"llama.cpp-from-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-with-vocabs"
    return _extracted(target, _MEMBERS, _COMPLETE_MARKERS)


def legacy_converter() -> Path:
    """llama.cpp's examples/convert_legacy_llama.py, the converter of Meta-layout checkpoints
    (consolidated.*.pth + params.json); run it with reference_env() (its gguf-py)."""
    target = cache_root() / f"llama.cpp-legacy-converter-from-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"
    script = "examples/convert_legacy_llama.py"
    return _extracted(target, (script,), (script,)) / script


def _extracted(target: Path, members: tuple[str, ...], markers: tuple[str, ...]) -> Path:
    """`target` holding `members` of the sdist's llama.cpp tree, fetched with pip on first use."""
    if all((target / marker).is_file() for marker in markers):
        return target
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp],
            capture_output=True, text=True, timeout=900,
        )
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if download.returncode != 0 or not sdists:
            _unavailable(f"pip download failed: {download.stderr.strip().splitlines()[-1:]}")
        staging = Path(tmp) / "extracted"
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                if not member.name.startswith(_SDIST_PREFIX):
                    continue
                relative = member.name[len(_SDIST_PREFIX):]
                if relative.startswith(members) and (member.isfile() or member.isdir()):
                    member.name = relative
                    tar.extract(member, staging, filter="data")
        missing = [marker for marker in markers if not (staging / marker).is_file()]
        if missing:
            _unavailable(f"{sdists[0].name} has no {_SDIST_PREFIX}{missing[0]}")
        try:
            staging.rename(target)  # atomic: a concurrent test worker may have won the race
        except OSError:
            if not all((target / marker).is_file() for marker in markers):
                raise
    return target


def lora_converter() -> Path:
    """llama.cpp's convert_lora_to_gguf.py, the converter of PEFT LoRA adapters; it imports the model
    classes of reference_dir()'s conversion/ package (see reference_lora_conversions)."""
    target = cache_root() / f"llama.cpp-lora-converter-from-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"
    script = "convert_lora_to_gguf.py"
    return _extracted(target, (script,), (script,)) / script


def reference_lora_conversions(adapter_dir: Path, base_dir: Path, out_dir: Path,
                               outtypes: tuple[str, ...]) -> dict[str, Path]:
    """outtype -> convert_lora_to_gguf.py's GGUF of the PEFT adapter `adapter_dir` on `base_dir`
    (out_dir/reference-lora-<outtype>.gguf), each run as run_reference_script runs it."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    files = {outtype: Path(out_dir) / f"reference-lora-{outtype}.gguf" for outtype in outtypes}
    for outtype, outfile in files.items():
        _run_or_fail([str(adapter_dir), "--base", str(base_dir), "--outfile", str(outfile), "--outtype", outtype],
                     adapter_dir, script=lora_converter())
    return files


def reference_lora_default_outputs(adapter_dir: Path, base_dir: Path, outtype: str) -> list[Path]:
    """The files convert_lora_to_gguf.py writes into the adapter's folder when given no --outfile."""
    before = set(Path(adapter_dir).iterdir())
    _run_or_fail([str(adapter_dir), "--base", str(base_dir), "--outtype", outtype], adapter_dir, script=lora_converter())
    return sorted(set(Path(adapter_dir).iterdir()) - before)


def vocab_models_dir() -> Path:
    """llama.cpp's models/ folder with the ggml-vocab-*.gguf files and their .inp/.out test vectors."""
    return reference_dir() / "models"


def reference_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(reference_dir() / "gguf-py")
    env.pop("NO_LOCAL_GGUF", None)
    return env


def run_reference_converter(model_dir: Path, outfile: Path, outtype: str, *extra: str, timeout: float = 1800,
                            pre: str | None = None) -> Path:
    """Run convert_hf_to_gguf.py on `model_dir`; returns `outfile`. Fails the test with its stderr tail.
    `pre`: the tokenizer.ggml.pre name the script is told (see reference_conversions)."""
    _run_or_fail([str(model_dir), "--outfile", str(outfile), "--outtype", outtype, *extra], model_dir, pre=pre,
                 timeout=timeout)
    return Path(outfile)


def _run_or_fail(args: list[str], model_dir: Path, *, script: Path | None = None, pre: str | None = None,
                 timeout: float = 1800) -> None:
    status, output = run_reference_script(args, script=script, pre=pre, timeout=timeout)
    if status != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        name = Path(script).name if script else "convert_hf_to_gguf.py"
        raise AssertionError(f"{name} failed ({status}) on {model_dir}:\n{tail}")


# The reference scripts' runs (convert_hf_to_gguf.py, convert_lora_to_gguf.py), each in a process
# of its own that starts with torch, transformers and the script's modules already imported: this
# server imports them once (~10 s, nearly all of a run on the tests' tiny models, which then takes
# ~0.5 s) and forks a child per run, which runs the script as `python SCRIPT ARGS` would (as
# __main__, with the caller's environment and working directory, its output to a log). Nothing a
# run does reaches the next: each starts from the server's state, which has run no conversion.
# FORCE_PRE (environment): the tokenizer.ggml.pre name convert_hf_to_gguf.py is told instead of
# the one it finds by hashing a test text (which knows only published vocabularies).
_CONVERTER_SERVER = r"""
import json, os, runpy, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what the imports print stays out of the answers
llama = sys.argv[1]
sys.path[:0] = [llama, llama + "/gguf-py"]
script = llama + "/convert_hf_to_gguf.py"
runpy.run_path(script, run_name="__reference_imports__")
# and what its runs import on first use (a tiny model's run: ~4 s of these, ~0.3 s of converting)
import importlib
for module in ("transformers.modeling_utils", "transformers.models.auto.modeling_auto",
               "transformers.models.auto.tokenization_auto", "accelerate", "sympy"):
    try:
        importlib.import_module(module)
    except ImportError:
        pass
import conversion.base as base
_hashed_pre = base.TextModel.get_vocab_base_pre
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: os.environ.get("FORCE_PRE") or _hashed_pre(self, tokenizer)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            answers.close()
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            sys.argv = [job["script"], *job["args"]]
            try:
                runpy.run_path(job["script"], run_name="__main__")
                status = 0
            except SystemExit as exit:
                if isinstance(exit.code, str):
                    print(exit.code, file=sys.stderr)
                status = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(wait_status), file=answers, flush=True)
"""

_server: list = []  # [subprocess.Popen, its stderr's file] while one runs
_server_lock = threading.Lock()


@atexit.register
def _stop_server() -> None:
    """End of the session: the server ends at the end of its input; waited for, so that its time
    is counted in the session's."""
    if _server:
        server, server_log = _server
        server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        server_log.unlink(missing_ok=True)


def run_reference_script(args: list[str], *, script: Path | None = None, pre: str | None = None,
                         env: dict[str, str] | None = None, timeout: float = 1800) -> tuple[int, str]:
    """`python SCRIPT ARGS` in a process of its own (see _CONVERTER_SERVER), with this process's
    environment (and `env`) and working directory. SCRIPT: convert_hf_to_gguf.py unless given (a
    script that imports the same modules: convert_lora_to_gguf.py); `pre`: the tokenizer.ggml.pre
    name convert_hf_to_gguf.py is told. Returns (exit status, its stdout and stderr)."""
    job_env = reference_env() | (env or {}) | {"FORCE_PRE": pre or ""}
    script = str(script or reference_dir() / "convert_hf_to_gguf.py")
    with _server_lock, tempfile.TemporaryDirectory() as tmp:
        if not _server or _server[0].poll() is not None:
            server_log = Path(tempfile.mkstemp(prefix="reference-server-", suffix=".log")[1])
            with open(server_log, "w") as stderr:
                _server[:] = [subprocess.Popen([sys.executable, "-c", _CONVERTER_SERVER, str(reference_dir())],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                               env=reference_env(), text=True, start_new_session=True), server_log]
        server, server_log = _server
        log = Path(tmp) / "convert.log"
        server.stdin.write(json.dumps({"script": script, "args": list(map(str, args)), "env": job_env, "cwd": os.getcwd(),
                                       "log": str(log)}) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], timeout)
        answer = server.stdout.readline() if ready else ""
        output = log.read_text(errors="replace") if log.exists() else ""
        if not answer:  # timed out, or the server died
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            _server.clear()
            why = f"no answer in {timeout} s" if not ready else f"the server died: {server_log.read_text()[-2000:]}"
            raise AssertionError(f"{Path(script).name} {' '.join(map(str, args))}: {why}\n{output[-3000:]}")
        return int(answer), output


_conversions: dict[tuple[Path, tuple[str, ...]], dict[str, Path]] = {}


def reference_conversions(model_dir: Path, out_dir: Path, outtypes: tuple[str, ...],
                          pre: str | None = None, extra: tuple[str, ...] = ()) -> dict[str, Path]:
    """outtype -> convert_hf_to_gguf.py's GGUF of `model_dir` (out_dir/reference-<outtype>.gguf).

    Made once per test session for a given folder and outtypes (run_reference_script). `pre`:
    the tokenizer.ggml.pre name the script is told, for a tokenizer it cannot name (it names them
    by hashing the tokens of a test text, which knows only published vocabularies). `extra`: more
    options for the script (--bigendian, ...); give each set of options its own out_dir."""
    key = (Path(model_dir).resolve(), tuple(outtypes), tuple(extra))
    if key not in _conversions:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        files = {outtype: Path(out_dir) / f"reference-{outtype}.gguf" for outtype in outtypes}
        for outtype, outfile in files.items():
            run_reference_converter(model_dir, outfile, outtype, *extra, pre=pre)
        _conversions[key] = files
    return _conversions[key]


def gguf_contents(path: Path) -> tuple[dict, dict]:
    """(keys -> values, tensor name -> (shape, type, bytes)) of a GGUF file, read by gguf-py.

    gguf-py parses every array element in Python: ~9 s for a file with a SentencePiece
    tokenizer, whose precompiled_charsmap is an array of ~240K bytes. The session's converted
    files are read by several tests, so each file is parsed once, and again only if it changed (a
    rewrite renames a new file into place: a new inode). The dicts are copies; their values are
    shared with the cache and must not be modified. 64 files: test_arch_bert.py alone compares ~40
    (with 16 its models' f32 files were parsed twice, ~6 s each)."""
    stat = Path(path).stat()
    fields, tensors = _parsed_contents(str(Path(path).resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return dict(fields), dict(tensors)


@functools.lru_cache(maxsize=64)
def _parsed_contents(path: str, inode: int, size: int, mtime_ns: int) -> tuple[dict, dict]:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (tuple(int(d) for d in t.shape), int(t.tensor_type), np.asarray(t.data).tobytes())
               for t in reader.tensors}
    return fields, tensors


def assert_same_file(ours: Path, theirs: Path, key_differences: dict[str, str], *, same_order: bool = True,
                     ulps_apart: dict[str, int] | None = None, extra_tensors: tuple[str, ...] = ()) -> None:
    """Same keys and values (floats to 1e-6), same tensors in the same order with the same shapes,
    types and bytes — apart from the keys in `key_differences` (key -> the reason it differs).
    same_order=False: the same tensors in any order (where the reference's order is its own choice).
    ulps_apart: F32 tensors (name regex -> n) whose values may be n units in the last place apart
    (a function ours rounds once from float64 and the reference computes in float32).
    extra_tensors: tensors only ours has (the caller checks them and says why).
    Q8_0 data may differ by one quant on an exact .5 tie: gguf-py rounds halves to even where ggml
    (and ggufsmith) round them away from zero."""
    import gguf
    import numpy as np

    ours_k, ours_t = gguf_contents(ours)
    ours_t = {name: value for name, value in ours_t.items() if name not in extra_tensors}
    theirs_k, theirs_t = gguf_contents(theirs)
    only_one = sorted(set(ours_k) ^ set(theirs_k))
    assert only_one == sorted(k for k in key_differences if (k in ours_k) != (k in theirs_k)), \
        f"keys in one file only: ours {sorted(set(ours_k) - set(theirs_k))}, theirs {sorted(set(theirs_k) - set(ours_k))}"
    for key in theirs_k:
        if key in ours_k and key not in key_differences:
            a, b = ours_k[key], theirs_k[key]
            if isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-6), key
            else:
                assert a == b, key
    if same_order:
        assert list(ours_t) == list(theirs_t)  # same names, same order
    assert sorted(ours_t) == sorted(theirs_t)
    for name, (shape, ttype, data) in theirs_t.items():
        o_shape, o_type, o_data = ours_t[name]
        assert (o_shape, o_type, len(o_data)) == (shape, ttype, len(data)), name
        ulps = next((n for pattern, n in (ulps_apart or {}).items() if re.fullmatch(pattern, name)), None)
        if ulps is not None and ttype == int(gguf.GGMLQuantizationType.F32):
            a, b = (np.frombuffer(x, np.int32).astype(np.int64) for x in (o_data, data))
            assert np.abs(a - b).max() <= ulps, name
        elif ttype == int(gguf.GGMLQuantizationType.Q8_0):
            a = np.frombuffer(o_data, np.uint8).reshape(-1, 34)
            b = np.frombuffer(data, np.uint8).reshape(-1, 34)
            assert (a[:, :2] == b[:, :2]).all(), name  # same scales
            diff = np.abs(a[:, 2:].view(np.int8).astype(int) - b[:, 2:].view(np.int8).astype(int))
            assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, name
        else:
            assert o_data == data, name
