"""llama.cpp's llama-gguf-split, built for the tests: the oracle of `ggufsmith split` and `ggufsmith merge`.

llama-cpp-python ships llama.cpp's shared libraries but not its tools. Its sdist (the one
tests/llamacpp_reference.py fetches, of the pinned version) has the tool's source,
tools/gguf-split/gguf-split.cpp, which needs nothing but those libraries and llama.cpp's headers:
it is compiled with g++ once per test session into a temporary folder and linked against the
libraries of the installed llama_cpp package. Nothing of llama.cpp is kept in this repository.

A machine without g++ fails the tests that use it (with a message saying so): they must not be
skipped silently in CI.

    def test_x(llama_gguf_split):
        run_gguf_split(llama_gguf_split, "--split", "--split-max-tensors", "5", "in.gguf", "out")
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.llamacpp_reference import LLAMA_CPP_PYTHON_VERSION, _extracted, cache_root

_SOURCE = "tools/gguf-split/gguf-split.cpp"
_BUILD_INFO_TEMPLATE = "common/build-info.cpp.in"
# What the tool's source includes: llama.h, ggml's headers and common/ (common.h, build-info.h).
_MEMBERS = ("tools/gguf-split/", "include/", "ggml/include/", "common/")
_BUILD_INFO_VALUES = {"@LLAMA_BUILD_NUMBER@": "0", "@LLAMA_BUILD_COMMIT@": f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-sdist",
                      "@BUILD_COMPILER@": "g++", "@BUILD_TARGET@": "host"}


def gguf_split_sources() -> Path:
    """The sdist's llama.cpp tree with what llama-gguf-split is compiled from (fetched on first use)."""
    target = cache_root() / f"llama.cpp-gguf-split-from-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"
    return _extracted(target, _MEMBERS, (_SOURCE, _BUILD_INFO_TEMPLATE, "include/llama.h", "common/common.h"))


def llama_cpp_library_dir() -> Path:
    """The folder of libllama.so and libggml*.so in the installed llama_cpp package (without loading them)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        pytest.fail("llama-cpp-python is not installed: llama-gguf-split is linked against its libraries")
    lib = Path(spec.origin).parent / "lib"
    if not (lib / "libllama.so").exists():
        pytest.fail(f"{lib} has no libllama.so: llama-gguf-split cannot be linked")
    return lib


def build_llama_gguf_split(build_dir: Path) -> Path:
    """Compile llama-gguf-split into `build_dir`; returns the executable. Fails the test if it cannot."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.fail("g++ not found: the llama-gguf-split oracle is compiled from llama.cpp's source at test time; "
                    "install g++ (e.g. apt-get install g++)")
    src = gguf_split_sources()
    build_info = (src / _BUILD_INFO_TEMPLATE).read_text()
    for placeholder, value in _BUILD_INFO_VALUES.items():
        build_info = build_info.replace(placeholder, value)
    (build_dir / "build-info.cpp").write_text(build_info)
    lib = llama_cpp_library_dir()
    exe = build_dir / "llama-gguf-split"
    cmd = [compiler, "-O1", "-std=c++17", *(f"-I{src / d}" for d in ("include", "ggml/include", "common")),
           str(src / _SOURCE), str(build_dir / "build-info.cpp"), f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
           f"-Wl,-rpath,{lib}", "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail("compiling llama-gguf-split failed:\n" + "\n".join(proc.stderr.strip().splitlines()[-20:]))
    return exe


def run_gguf_split(exe: Path, *args, check: bool = True) -> subprocess.CompletedProcess:
    """Run llama-gguf-split with `args`; with `check`, fail the test with its output if it fails."""
    proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"llama-gguf-split {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


@pytest.fixture(scope="session")
def llama_gguf_split(tmp_path_factory) -> Path:
    """llama.cpp's llama-gguf-split, compiled once per test session."""
    return build_llama_gguf_split(tmp_path_factory.mktemp("llama-gguf-split"))
