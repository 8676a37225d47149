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

Task adapters: the published folder's five task LoRA adapters (rank 4, alpha 1, factors drawn 0.1 *
N(0, 1)) are written as lora-<task>-<file>.gguf; each, applied by llama.cpp (lora_path) on the f32
model, gives the embeddings of transformers' JinaEmbeddingsV3Model with that task's adapter merged
into its weights as jina's code applies it (tests/bert_models.py jina_v3_with_task), within the
tolerances above: measured f32 5.5e-4..7.7e-4 (1 - cosine <= 2.6e-8), against 0.15..0.23 without the
adapter; on the f16 model 1.5e-3..1.8e-3 (<= 1.7e-7), on the q8_0 model 2.9e-2..3.5e-2 (<= 1.0e-4)
(the adapters are F32 beside every type). llama.cpp's converter's own adapter files measure
3.9e-3..5.8e-3 (1 - cosine up to 3.2e-6): llama.cpp never applies their token_types adapter, whose
update ggufsmith carries in the token embeddings' adapter (converters/task_adapters.py), so they
fail the f32 tolerance; so do ggufsmith's with the fold taken out (checked by hand: the five f32
task tests fail).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggufsmith.constants import PoolingType
from tests.bert_models import (
    JINA_TASKS, SENTENCES, assert_token_states_match, assert_tokenizes_as_transformers, build_jina_v3, jina_v3_as_published, jina_v3_with_task, llama_embeddings, pooled,
    train_xlmr_unigram,
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
    assert_token_states_match(converted("native", "f32"), reference, TOKEN_TOLERANCE, "jina-bert-v3 f32")


def test_llama_cpp_tokenizes_as_transformers(converted, reference):
    assert_tokenizes_as_transformers(converted("native", "f32"), reference)


def test_keys(converted):
    keys, tensors = gguf_contents(converted("native", "f32"))
    assert keys["general.architecture"] == "jina-bert-v3"
    assert keys["jina-bert-v3.rope.freq_base"] == 20000.0
    assert keys["jina-bert-v3.pooling_type"] == int(PoolingType.MEAN)
    assert keys["jina-bert-v3.context_length"] == 96  # max_position_embeddings 98 less pad_token_id + 1
    assert "position_embd.weight" not in tensors and not any("pooler" in name or "lora" in name for name in tensors)


def test_published_form_gives_the_same_file(model_dirs, converted):
    """jina's published checkpoint: the base weights of its parametrizations make the model's file."""
    assert_same_file(converted("published", "f32"), converted("native", "f32"), {"general.name": "the folder's name"})


def adapter_file(model_file: Path, task: str) -> Path:
    return model_file.with_name(f"lora-{task}-{model_file.name}")


def test_a_folder_without_task_adapters_gets_no_adapter_file(converted):
    assert not list(converted("native", "f32").parent.glob("lora-native-*"))


@pytest.fixture(scope="session")
def task_references(model_dirs, tmp_path_factory) -> dict[str, list[tuple[list[int], np.ndarray]]]:
    """task -> transformers' token ids and last hidden states with that task's adapter merged."""
    root = tmp_path_factory.mktemp("jina_v3_tasks")
    return {task: token_states(jina_v3_with_task(model_dirs["native"], model_dirs["published"], task, root / task))
            for task in JINA_TASKS}


def worst_errors(model: Path, states, **options) -> tuple[float, float]:
    """(max error / std, 1 - min cosine) of llama.cpp's mean-pooled embeddings over SENTENCES."""
    errors, cosines = [], []
    for got, (_, hidden) in zip(llama_embeddings(model, SENTENCES, **options), states):
        expected = pooled(hidden, "mean")
        errors.append(np.abs(got - expected).max() / expected.std())
        cosines.append(float(got @ expected / np.linalg.norm(got)))
    return max(errors), 1 - min(cosines)


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("task", JINA_TASKS)
def test_task_adapter_in_llama_cpp_gives_the_task_embeddings(converted, task_references, task, outtype):
    max_error, min_cosine = TOLERANCE[outtype]
    model = converted("published", outtype)
    error, distance = worst_errors(model, task_references[task], lora_path=str(adapter_file(model, task)))
    print(f"jina-bert-v3 task {task} {outtype}: max error / std {error:.1e}, 1 - cosine {distance:.1e}")
    assert error <= max_error and 1 - distance >= min_cosine, (error, distance)
    if outtype == "f32":  # the adapter matters: without it the same model is far from the task's embeddings
        assert worst_errors(model, task_references[task])[0] > 20 * max_error


def test_task_adapters_are_f32_beside_every_outtype(converted):
    """As llama.cpp's converter: the adapters are F32 whatever the model's type, and named after its file."""
    for outtype in OUTTYPES:
        model = converted("published", outtype)
        for task in JINA_TASKS:
            _, tensors = gguf_contents(adapter_file(model, task))
            assert {ttype for _, ttype, _ in tensors.values()} == {0}, (outtype, task)  # GGML_TYPE_F32


# Keys only ours have or whose value differs, and why: XLM-R's tokenizer (tests/test_arch_bert.py).
def test_same_file_as_convert_hf_to_gguf(model_dirs, converted, reference_files):
    for outtype in OUTTYPES:
        assert_same_file(converted("published", outtype), reference_files[outtype], XLMR_KEY_DIFFERENCES)


@pytest.fixture(scope="session")
def reference_files(model_dirs, tmp_path_factory) -> dict[str, Path]:
    return reference_conversions(model_dirs["published"], tmp_path_factory.mktemp("jina_v3_ref"), OUTTYPES,
                                 pre="default")


RANK = 4


def as_array(tensor: tuple[tuple[int, ...], int, bytes]) -> np.ndarray:
    """An F32 tensor of gguf_contents in numpy order (its shape is ggml's, rows first)."""
    shape, _, data = tensor
    return np.frombuffer(data, np.float32).reshape(shape[::-1])


@pytest.mark.parametrize("task", JINA_TASKS)
def test_same_adapter_files_as_convert_hf_to_gguf(converted, reference_files, task):
    """The same keys and values, and the same tensors, bytes and order, but for the token embeddings
    and token types: the reference's token_types.weight.lora_a/b, which llama.cpp loads and never
    applies, are left out, their update carried by token_embd's adapter as one more rank (lora_a
    (vocab, r + 1): the reference's r columns and a column of ones; lora_b (dim, r + 1): the
    reference's columns times (r + 1) / r, then the token type row's update)."""
    for outtype in OUTTYPES:
        ours = adapter_file(converted("published", outtype), task)
        theirs = adapter_file(reference_files[outtype], task)
        ours_keys, ours_tensors = gguf_contents(ours)
        theirs_keys, theirs_tensors = gguf_contents(theirs)
        assert list(ours_keys.items()) == list(theirs_keys.items())  # same keys, values, order
        assert ours_keys["adapter.lora.task_name"] == task
        assert ours_keys["adapter.lora.prompt_prefix"] == f"Instruction for {task}: "
        folded = ("token_embd.weight.lora_a", "token_embd.weight.lora_b")
        assert list(ours_tensors) == [name for name in theirs_tensors if not name.startswith("token_types.")]
        for name in ours_tensors:
            if name not in folded:
                assert ours_tensors[name] == theirs_tensors[name], name
        lora_a, lora_b = (as_array(ours_tensors[name]) for name in folded)
        ref_a, ref_b = (as_array(theirs_tensors[name]) for name in folded)
        assert np.array_equal(lora_a[:, :RANK], ref_a) and (lora_a[:, RANK] == 1).all()
        np.testing.assert_allclose(lora_b[:, :RANK], ref_b * (RANK + 1) / RANK, rtol=1e-6)
