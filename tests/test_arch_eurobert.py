"""EuroBERT encoders, converted by ggufsmith, give in llama.cpp (llama-cpp-python, embedding=True, the
pooling from the file) the embeddings transformers' model gives, pooled as sentence-transformers
pools them; the file equals llama.cpp's convert_hf_to_gguf.py's.

Models: 3 layers, hidden 64, 4 query and 2 key/value heads (GQA), every weight redrawn (norms around
1 with spread 0.2), a Llama-3-style byte-level BPE tokenizer (its post-processor puts
<|begin_of_text|> first), in sentence-transformers folders:
  - "model": EuroBertModel, mean pooling;
  - "mlm": EuroBertForMaskedLM (the encoder under "model.", an lm_head to leave out), CLS pooling.
Tolerances (max |llama.cpp - transformers| / std of the reference vector, and cosine similarity):
  - f32: 1e-3 and 0.99999 against plain transformers (SiLU: no float16 GELU table); measured
    1e-6..2.9e-6 (1 - cosine < 1e-12), per token 2.2e-6..5.9e-6.
  - f16: 1.5e-2 and 0.99999; measured 1.5e-3..3.5e-3 (mean), up to 8.9e-3 (1 - cosine 3.5e-6) for
    the CLS vector: one token's state through three layers of large random weights rounded to
    11 bits moves more than an average.
  - q8_0: 0.2 and 0.997; measured 4.4e-2..8.7e-2 (mean, 1 - cosine <= 4e-4), up to 0.11 (1 - cosine
    1.2e-3) for the CLS vector.
Storing q/k with llama's pair permutation (llama.cpp's eurobert rotates NEOX pairs, HF's halves, so
they are stored as they are) makes these tests fail (checked by hand).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.bert_models import (
    assert_pooled_match, assert_token_states_match, assert_tokenizes_as_transformers, build_eurobert, encoder_states,
)
from tests.damaged_inputs import edit_json
from tests.family_models import conversions
from tests.llamacpp_reference import assert_same_file, gguf_contents, reference_conversions

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

MODELS = {"model": dict(model_class="EuroBertModel", pooling="mean"),
          "mlm": dict(model_class="EuroBertForMaskedLM", pooling="cls")}
OUTTYPES = ("f32", "f16", "q8_0")
TOLERANCE = {"f32": (1e-3, 0.99999), "f16": (1.5e-2, 0.99999), "q8_0": (0.2, 0.997)}  # (max err / std, cosine)
TOKEN_TOLERANCE = 2e-3  # every component of every token's state, f32


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eurobert")
    return {kind: build_eurobert(root / kind, spec["model_class"], spec["pooling"]) for kind, spec in MODELS.items()}


@pytest.fixture(scope="session")
def reference(model_dirs) -> dict[str, list[tuple[list[int], np.ndarray]]]:
    """kind -> per sentence: transformers' token ids and the encoder's last hidden state."""
    return {kind: encoder_states(model_dir, "EuroBertModel") for kind, model_dir in model_dirs.items()}


@pytest.fixture(scope="session")
def converted(model_dirs, tmp_path_factory):
    return conversions({kind: (folder,) for kind, folder in model_dirs.items()}, tmp_path_factory.mktemp("eurobert_gguf"))


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("kind", MODELS)
def test_pooled_embeddings_match_transformers(converted, reference, kind, outtype):
    assert_pooled_match(converted(kind, outtype), reference[kind], MODELS[kind]["pooling"], *TOLERANCE[outtype],
                        f"{kind} {outtype}")


@pytest.mark.parametrize("kind", MODELS)
def test_token_embeddings_match_transformers(converted, reference, kind):
    assert_token_states_match(converted(kind, "f32"), reference[kind], TOKEN_TOLERANCE, f"{kind} f32")


@pytest.mark.parametrize("kind", MODELS)
def test_llama_cpp_tokenizes_as_transformers(converted, reference, kind):
    assert_tokenizes_as_transformers(converted(kind, "f32"), reference[kind])


def test_keys_and_masked_lm_head(converted):
    keys, tensors = gguf_contents(converted("mlm", "f32"))
    assert keys["general.architecture"] == "eurobert" and keys["eurobert.attention.causal"] is False
    assert keys["eurobert.pooling_type"] == 2  # CLS, from the folder
    assert "output.weight" not in tensors  # the MaskedLM head is left out


# Keys only ours have (or only the reference has), and why; every other key, value and tensor byte is the same.
KEY_DIFFERENCES = {
    "tokenizer.ggml.add_eos_token": "ours written false from the post-processor (no EOS appended); llama.cpp's default",
    "tokenizer.ggml.eot_token_id": "<|eot_id|> named explicitly; llama.cpp finds it by its text at load time",
    "tokenizer.ggml.eom_token_id": "<|eom_id|> named explicitly; llama.cpp finds it by its text at load time",
    "tokenizer.ggml.add_sep_token": "theirs false, llama.cpp's default when absent",
    "tokenizer.ggml.mask_token_id": "theirs copies config.json's mask_token_id (EuroBertConfig's default 128002, past "
                                    "this tokenizer's 700 tokens); ours takes special ids from the tokenizer, which "
                                    "names no mask token here",
    "eurobert.rope.scaling.type": "theirs 'none'; absent, llama.cpp applies no scaling either (ours refuses a "
                                  "scaled config rather than write 'none' over it)",
    "eurobert.classifier.pooling_type": "a sequence classifier's pooling, from the copy's classifier_pooling (see "
                                        "below); not used without a classification head",
}


def test_same_file_as_convert_hf_to_gguf(model_dirs, converted, tmp_path_factory):
    """On a copy with config.json's classifier_pooling "mean": transformers 5 saves EuroBertConfig's
    default "late" (a sequence classifier's setting, unused by EuroBertModel; AutoConfig fills it in
    when absent), and the reference refuses every value but "cls" and "mean" ("Unsupported
    classifier_pooling: late") on any EuroBERT folder transformers saves."""
    folder = tmp_path_factory.mktemp("eurobert_ref_model") / "model"
    shutil.copytree(model_dirs["model"], folder)
    edit_json(folder / "config.json", lambda config: config | {"classifier_pooling": "mean"})
    references = reference_conversions(folder, tmp_path_factory.mktemp("eurobert_ref"), OUTTYPES, pre="llama-bpe")
    for outtype in OUTTYPES:
        assert_same_file(converted("model", outtype), references[outtype], KEY_DIFFERENCES)
