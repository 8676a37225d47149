"""Session fixtures of the llama tests: tokenizers, model folders, our and llama.cpp's conversions.

Both test modules import these fixtures; the built folders and files are cached in this module, so
each model and each conversion is made once per test session however many modules use it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.llama_models import build_model, tokenizer_vocab_size, with_tokenizer
from tests.llamacpp_reference import COMPARED_OUTTYPES, reference_conversions
from tests.tokenizer_helpers import train_bpe, train_sentencepiece

# Llama 3 style: a byte-level BPE tokenizer.json; the others a SentencePiece tokenizer.model (llama 2).
# llama.cpp's converter rejects BPE tokenizers it does not know by hash, so the variants it is
# compared on use SentencePiece.
BPE_VARIANTS = ("llama_head_dim",)

_cache: dict[tuple, Path] = {}


def _once(key: tuple, make) -> Path:
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    return {
        "sp": _once(("tokenizer", "sp"), lambda: train_sentencepiece(tmp_path_factory.mktemp("tokenizer-sp"))),
        "bpe": _once(("tokenizer", "bpe"), lambda: train_bpe(tmp_path_factory.mktemp("tokenizer-bpe"), "llama3")),
    }


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer_dirs):
    """variant -> folder with config.json, model.safetensors and the tokenizer files."""

    def make(variant: str) -> Path:
        source = tokenizer_dirs["bpe" if variant in BPE_VARIANTS else "sp"]
        model_dir = with_tokenizer(tmp_path_factory.mktemp(variant), source)
        build_model(model_dir, variant, tokenizer_vocab_size(model_dir))
        return model_dir

    return lambda variant: _once(("model", variant), lambda: make(variant))


@pytest.fixture(scope="session")
def ours(model_dirs):
    """(variant, outtype) -> our GGUF, converted through the public Python API."""

    def make(variant: str, outtype: str) -> Path:
        import ggufsmith

        out = model_dirs(variant) / f"ours-{outtype}.gguf"
        ggufsmith.convert(model_dirs(variant), out, outtype=outtype)
        return out

    return lambda variant, outtype: _once(("ours", variant, outtype), lambda: make(variant, outtype))


@pytest.fixture(scope="session")
def reference(model_dirs, tokenizer_dirs, tmp_path_factory):
    """(variant, outtype) -> convert_hf_to_gguf.py's GGUF of the same folder; the first request for a
    variant converts it to all COMPARED_OUTTYPES at once. For a BPE variant it converts the same
    config and weights with the SentencePiece tokenizer (see BPE_VARIANTS), so its tensors and
    llama.* keys are comparable and its tokenizer.* keys are not."""

    def make(variant: str, outtype: str) -> Path:
        model_dir = model_dirs(variant)
        if variant in BPE_VARIANTS:
            model_dir = _once(("sp-copy", variant), lambda: _with_weights(
                with_tokenizer(tmp_path_factory.mktemp(f"{variant}-sp"), tokenizer_dirs["sp"]), model_dirs(variant)))
        return reference_conversions(model_dir, model_dir, COMPARED_OUTTYPES)[outtype]

    return make


def _with_weights(model_dir: Path, source: Path) -> Path:
    import shutil

    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (source / name).is_file():
            shutil.copy(source / name, model_dir / name)
    return model_dir
