"""jina-embeddings-v3 converted by ggufsmith (llama.cpp's jina-bert-v3) gives in llama.cpp
(llama-cpp-python, embedding=True, mean pooling from the sentence-transformers folder) the
embeddings of transformers' JinaEmbeddingsV3Model; jina's published form of the same weights (an
XLMRobertaModel config, parametrized weights with five task LoRA adapters) gives the same file but
the name, and equals llama.cpp's convert_hf_to_gguf.py's main file.

Model (tests/bert_models.py): 3 layers, hidden 64, 4 heads, rotary base 20000, every weight redrawn
large, a SentencePiece Unigram tokenizer saved as XLM-R's tokenizer.json.
Tolerances (max |llama.cpp - transformers| / std of the reference vector, and cosine similarity),
the bert family's (tests/test_arch_bert.py: ggml's float16 GELU table bounds f32 near 1e-3):
  - f32: 2e-3 and 0.99999; measured 5e-4..7e-4 (1 - cosine <= 3e-8); per token 1.3e-3..1.4e-3;
  - f16: 6e-3 and 0.99999; measured 1.2e-3..1.6e-3 (1 - cosine <= 1.3e-7);
  - q8_0: 0.15 and 0.999; measured 2.4e-2..3.2e-2 (1 - cosine <= 8.3e-5).
Leaving out the rotary base frequency (llama.cpp then rotates with base 10000: f32 error 1e-2 of
the std) makes these tests fail (checked by hand).
llama.cpp's converter does not know transformers' JinaEmbeddingsV3Model (it reads jina's published
form only), so the file comparison is of the published folder.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.constants import PoolingType
from tests.bert_models import (
    JINA_TASKS, SENTENCES, build_jina_v3, jina_v3_as_published, llama_embeddings, pooled, train_xlmr_unigram,
)
from tests.family_models import conversions
from tests.llamacpp_reference import assert_same_file, gguf_contents, reference_conversions
from tests.test_arch_bert import TOKEN_TOLERANCE, XLMR_KEY_DIFFERENCES
from tests.test_arch_embedding_models import token_states

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

OUTTYPES = ("f32", "f16", "q8_0")
TOLERANCE = {"f32": (2e-3, 0.99999), "f16": (6e-3, 0.99999), "q8_0": (0.15, 0.999)}  # (max err / std, cosine)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jina_v3")
    train_xlmr_unigram(root / "native")
    build_jina_v3(root / "native")
    return {"native": root / "native", "published": jina_v3_as_published(root / "native", root / "published")}


@pytest.fixture(scope="session")
def reference(model_dirs) -> list[tuple[list[int], np.ndarray]]:
    """Per sentence: transformers' token ids and JinaEmbeddingsV3Model's last hidden state."""
    assert transformers.AutoConfig.from_pretrained(model_dirs["native"]).architectures == ["JinaEmbeddingsV3Model"]
    return token_states(model_dirs["native"])


@pytest.fixture(scope="session")
def converted(model_dirs, tmp_path_factory):
    return conversions({kind: (folder,) for kind, folder in model_dirs.items()}, tmp_path_factory.mktemp("jina_v3_gguf"))


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_pooled_embeddings_match_transformers(converted, reference, outtype):
    max_error, min_cosine = TOLERANCE[outtype]
    for text, got, (_, hidden) in zip(SENTENCES, llama_embeddings(converted("native", outtype), SENTENCES), reference):
        expected = pooled(hidden, "mean")
        error = np.abs(got - expected).max() / expected.std()
        cosine = float(got @ expected / np.linalg.norm(got))
        print(f"jina-bert-v3 {outtype}: max error / std {error:.1e}, 1 - cosine {1 - cosine:.1e}  ({text[:20]!r})")
        assert error <= max_error and cosine >= min_cosine, (text, error, cosine)


def test_token_embeddings_match_transformers(converted, reference):
    """Every token's state (pooling off), f32: the rotary positions of each token, not only the mean."""
    per_text = llama_embeddings(converted("native", "f32"), SENTENCES, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE)
    for text, got, (_, hidden) in zip(SENTENCES, per_text, reference):
        assert got.shape == hidden.shape, text
        error = np.abs(got - hidden).max() / hidden.std()
        print(f"jina-bert-v3 per token f32: max error / std {error:.1e}")
        assert error <= TOKEN_TOLERANCE, (text, error)


def test_llama_cpp_tokenizes_as_transformers(converted, reference):
    llm = llama_cpp.Llama(model_path=str(converted("native", "f32")), vocab_only=True, verbose=False)
    try:
        for text, (ids, _) in zip(SENTENCES, reference):
            assert llm.tokenize(text.encode(), add_bos=True, special=False) == ids, text
    finally:
        llm.close()


def test_keys(converted):
    keys, tensors = gguf_contents(converted("native", "f32"))
    assert keys["general.architecture"] == "jina-bert-v3"
    assert keys["jina-bert-v3.rope.freq_base"] == 20000.0
    assert keys["jina-bert-v3.pooling_type"] == int(PoolingType.MEAN)
    assert keys["jina-bert-v3.context_length"] == 96  # max_position_embeddings 98 less pad_token_id + 1
    assert "position_embd.weight" not in tensors and not any("pooler" in name or "lora" in name for name in tensors)


def test_published_form_gives_the_same_file_and_tells_of_the_adapters(model_dirs, converted, tmp_path, caplog):
    """jina's published checkpoint: the base weights of its parametrizations, the adapters left out
    with one notice naming them."""
    out = tmp_path / "published.gguf"
    with caplog.at_level(logging.WARNING):
        ggufsmith.convert(model_dirs["published"], out, "f32")
    notices = [r.getMessage() for r in caplog.records if "LoRA" in r.getMessage()]
    assert len(notices) == 1 and all(task in notices[0] for task in JINA_TASKS), notices
    assert_same_file(out, converted("native", "f32"), {"general.name": "the folder's name"})


# Keys only ours have or whose value differs, and why: XLM-R's tokenizer (tests/test_arch_bert.py).
def test_same_file_as_convert_hf_to_gguf(model_dirs, converted, tmp_path_factory):
    """The reference also writes five adapter files (lora-<task>-reference-<outtype>.gguf), which
    ggufsmith leaves out; its main file is compared."""
    references = reference_conversions(model_dirs["published"], tmp_path_factory.mktemp("jina_v3_ref"), OUTTYPES,
                                       pre="default")
    for outtype in OUTTYPES:
        assert_same_file(converted("published", outtype), references[outtype], XLMR_KEY_DIFFERENCES)
