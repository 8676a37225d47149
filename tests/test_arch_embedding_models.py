"""ModernBERT (`modern-bert`) and EmbeddingGemma (`gemma-embedding`), converted by ggufsmith, give in
llama.cpp (llama-cpp-python, embedding=True, the pooling from the file) the sentence embeddings
transformers' model gives, pooled as sentence-transformers pools them (and, for EmbeddingGemma,
projected by its two Dense modules, computed here with torch from their weights); the files equal
llama.cpp's convert_hf_to_gguf.py's.

Models: tests/embedding_models.py (sliding windows of 8 tokens over sentences of 6-36 tokens on
layer patterns that are not llama.cpp's defaults, different local and global rope bases;
EmbeddingGemma with norm offsets, GQA and Dense modules).
Tolerances: max |llama.cpp - reference| / std of the reference vector, and cosine similarity; the
measured values are in TOLERANCE's comments. Checked by hand: leaving out the sliding-window key,
giving local layers the global rope base, or leaving out the Dense tensors makes the pooled f32
test fail; without the layer pattern key llama.cpp aborts on the gemma-embedding model (all its
layers would be sliding ones).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.constants import PoolingType
from tests.bert_models import SENTENCES, assert_tokenizes_as_transformers, encoder_states, llama_embeddings
from tests.embedding_models import build_embeddinggemma, build_modernbert
from tests.ggml_activations import use_ggml_gelu
from tests.family_models import conversions
from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES, assert_same_file, gguf_contents, reference_conversions

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

# kind -> (llama.cpp architecture, builder)
MODELS = {
    "modern-bert": ("modern-bert", build_modernbert),
    "modern-bert-mlm": ("modern-bert", partial(build_modernbert, masked_lm=True)),
    "gemma-embedding": ("gemma-embedding", build_embeddinggemma),
}
OUTTYPES = ("f32", "f16", "q8_0")
TOLERANCE = {  # (max error / std, cosine)
    # measured 2.7e-4..1.3e-3 (1 - cosine <= 1.3e-7): ggml computes GELU through a float16 table (see
    # test_f32_matches_transformers_with_ggmls_gelu: 1.9e-6..2.3e-4 against that GELU)
    "f32": (2e-3, 0.99999),
    "f16": (6e-3, 0.99999),  # measured 2.0e-3..3.9e-3 (1 - cosine <= 1.2e-6): weights rounded to 11 bits
    # measured 3.9e-2..1.6e-1 (1 - cosine <= 1.4e-3): 8-bit weights through 4 layers redrawn large
    "q8_0": (0.25, 0.998),
}
GGML_GELU_TOLERANCE = 5e-4
TOKEN_TOLERANCE = 5e-3  # per token, f32: measured 8.2e-4..3.7e-3 (no averaging over the tokens)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embedding_models")
    return {kind: build(root / kind) for kind, (_, build) in MODELS.items()}


def dense_modules(model_dir: Path) -> list[np.ndarray]:
    """The weights of the folder's Dense modules, in order (2_Dense, 3_Dense)."""
    from safetensors.numpy import load_file

    return [load_file(folder / "model.safetensors")["linear.weight"].astype(np.float64)
            for folder in sorted(model_dir.glob("*_Dense"))]


def token_states(model_dir: Path, ggml_gelu: bool = False) -> list[tuple[list[int], np.ndarray]]:
    """Per sentence: transformers' token ids and last hidden state (with ggml_gelu, the MLPs'
    GELU computed as ggml computes it)."""
    def patch(model) -> None:
        assert use_ggml_gelu(model, "act" if "ModernBert" in type(model).__name__ else "act_fn") == len(model.layers)

    return encoder_states(model_dir, patch=patch if ggml_gelu else None)


def sentence_vectors(model_dir: Path, states: list[tuple[list[int], np.ndarray]]) -> list[np.ndarray]:
    """sentence-transformers' vectors: mean pooling, the Dense projections, L2 normalization."""
    vectors = []
    for _, hidden in states:
        vector = hidden.mean(0)
        for weight in dense_modules(model_dir):
            vector = weight @ vector
        vectors.append(vector / np.linalg.norm(vector))
    return vectors


@pytest.fixture(scope="session")
def reference(model_dirs) -> dict[str, list[tuple[list[int], np.ndarray]]]:
    """kind -> per sentence: transformers' token ids and last hidden state."""
    return {kind: token_states(model_dir) for kind, model_dir in model_dirs.items()}


@pytest.fixture(scope="session")
def converted(model_dirs, tmp_path_factory):
    return conversions({kind: (folder,) for kind, folder in model_dirs.items()}, tmp_path_factory.mktemp("embedding_gguf"))


def assert_close(kind: str, label: str, got: list[np.ndarray], expected: list[np.ndarray],
                 max_error: float, min_cosine: float) -> None:
    for text, g, e in zip(SENTENCES, got, expected):
        error = np.abs(g - e).max() / e.std()
        cosine = float(g @ e / np.linalg.norm(g) / np.linalg.norm(e))
        print(f"{kind} {label}: max error / std {error:.1e}, 1 - cosine {1 - cosine:.1e}  ({text[:20]!r})")
        assert error <= max_error and cosine >= min_cosine, (text, error, cosine)


# The masked-LM variant differs from modern-bert only by names: f32 is enough.
@pytest.mark.parametrize(("kind", "outtype"), [(kind, outtype) for kind in MODELS for outtype in OUTTYPES
                                               if kind != "modern-bert-mlm" or outtype == "f32"])
def test_pooled_embeddings_match_transformers(model_dirs, converted, reference, kind, outtype):
    """Pooling (and EmbeddingGemma's Dense projections) from the file."""
    path = converted(kind, outtype)
    expected = sentence_vectors(model_dirs[kind], reference[kind])
    assert_close(kind, outtype, llama_embeddings(path, SENTENCES), expected, *TOLERANCE[outtype])


@pytest.mark.parametrize("kind", ["modern-bert", "gemma-embedding"])
def test_f32_matches_transformers_with_ggmls_gelu(model_dirs, converted, kind):
    """What bounds the f32 agreement is ggml's float16 GELU table: with transformers' MLPs computing
    GELU that way too, the vectors agree to ~1e-4 of their std."""
    expected = sentence_vectors(model_dirs[kind], token_states(model_dirs[kind], ggml_gelu=True))
    assert_close(kind, "f32, ggml's GELU", llama_embeddings(converted(kind, "f32"), SENTENCES), expected,
                 GGML_GELU_TOLERANCE, 0.999999)


@pytest.mark.parametrize("kind", MODELS)
def test_token_states_match_transformers(model_dirs, converted, reference, kind):
    """Every token's state with pooling turned off, in f32: the sliding windows and positions of each
    token, not only their average. llama.cpp applies gemma-embedding's Dense projections to each
    token's state then."""
    got = llama_embeddings(converted(kind, "f32"), SENTENCES, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE)
    denses = dense_modules(model_dirs[kind])
    for text, states, (_, hidden) in zip(SENTENCES, got, reference[kind]):
        for weight in denses:
            hidden = hidden @ weight.T
        assert states.shape == hidden.shape, text
        error = np.abs(states - hidden).max() / hidden.std()
        print(f"{kind} per token f32: max error / std {error:.1e}")
        assert error <= TOKEN_TOLERANCE, (text, error)


@pytest.mark.parametrize("kind", MODELS)
def test_llama_cpp_tokenizes_as_transformers(converted, reference, kind):
    assert_tokenizes_as_transformers(converted(kind, "f32"), reference[kind])


@pytest.mark.parametrize("kind", MODELS)
def test_pooling_and_dense_keys(converted, kind):
    keys, tensors = gguf_contents(converted(kind, "f32"))
    arch = MODELS[kind][0]
    assert keys["general.architecture"] == arch
    assert keys[f"{arch}.pooling_type"] == int(PoolingType.MEAN)
    assert not any(name.startswith(("cls", "output.")) for name in tensors)  # no MLM head
    if arch == "gemma-embedding":
        assert [keys[f"{arch}.dense_{i}_feat_{side}"] for i in (2, 3) for side in ("in", "out")] == [64, 128, 128, 64]
        assert tensors["dense_2.weight"][0] == (64, 128) and tensors["dense_3.weight"][0] == (128, 64)


# -- against llama.cpp's own converter ------------------------------------------------------------

# Keys only ours have (or with other values), and why; every other key, value and tensor byte is the same.
BERT_TOKENIZER_KEYS = {
    "tokenizer.ggml.cls_token_id": "the spec's key, written when the tokenizer names a CLS token",
    "tokenizer.ggml.fim_pad_token_id": "written explicitly; llama.cpp finds the same id by the text [PAD] at load time",
}
KEY_DIFFERENCES = {
    "modern-bert": {
        **BERT_TOKENIZER_KEYS,
        "modern-bert.attention.layer_norm_epsilon": "the key llama.cpp's modern-bert requires; the reference writes "
                                                    "norm_eps as layer_norm_rms_epsilon, and llama.cpp refuses its file "
                                                    "(key not found: modern-bert.attention.layer_norm_epsilon)",
        "modern-bert.attention.layer_norm_rms_epsilon": "see layer_norm_epsilon",
        "modern-bert.classifier.pooling_type": "the pooling of a classification head (classifier_pooling); the "
                                               "reference writes it for ModernBertModel too, which has no head",
        "tokenizer.ggml.add_sep_token": "ours not written (false): ModernBERT's pair template is [CLS] A [SEP] B [SEP], "
                                        "one separator; the reference's true makes llama-server's reranking put two",
        "modern-bert.attention.sliding_window_pattern": "written when layer_types is not llama.cpp's default (global "
                                                        "every third layer from the first); the reference writes "
                                                        "global_attn_every_n_layers only, which transformers 5 saves "
                                                        "as layer_types, so its file runs layer 2 with the window",
    },
    "gemma-embedding": {
        **TOKENIZER_KEY_DIFFERENCES,
        "gemma-embedding.attention.sliding_window_pattern": "written when layer_types is not llama.cpp's default "
                                                            "(every sixth layer global); the reference never writes "
                                                            "it, and without it llama.cpp takes all 4 layers of this "
                                                            "model for sliding ones and aborts (GGML_ASSERT(buffer) "
                                                            "in process_ubatch; checked with our file less the key)",
    },
}
# The reference's options: it writes EmbeddingGemma's Dense modules only when asked.
REFERENCE_ARGS = {"gemma-embedding": ("--sentence-transformers-dense-modules",)}
REFERENCE_PRE = {"modern-bert": "gpt-2"}


# Not the masked-LM variant: the reference cannot convert ModernBertForMaskedLM ("Can not map tensor
# 'decoder.bias'", the prediction head's bias).
@pytest.mark.parametrize("kind", ["modern-bert", "gemma-embedding"])
def test_same_file_as_convert_hf_to_gguf(model_dirs, converted, tmp_path_factory, kind):
    references = reference_conversions(model_dirs[kind], tmp_path_factory.mktemp(f"ref_{kind}"), OUTTYPES,
                                       pre=REFERENCE_PRE.get(kind), extra=REFERENCE_ARGS.get(kind, ()))
    for outtype in OUTTYPES:
        assert_same_file(converted(kind, outtype), references[outtype], KEY_DIFFERENCES[kind])


def test_modernbert_hub_config_gives_the_same_file(model_dirs, converted, tmp_path):
    """answerdotai/ModernBERT's config.json (transformers 4.x) names the rope bases global_rope_theta /
    local_rope_theta and the pattern global_attn_every_n_layers, where transformers 5 saves
    rope_parameters and layer_types: the same model either way."""
    import json
    import shutil

    model_dir = tmp_path / "modern-bert"
    shutil.copytree(model_dirs["modern-bert"], model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    rope = config.pop("rope_parameters")
    del config["layer_types"]
    config |= {"global_rope_theta": rope["full_attention"]["rope_theta"],
               "local_rope_theta": rope["sliding_attention"]["rope_theta"], "global_attn_every_n_layers": 2}
    (model_dir / "config.json").write_text(json.dumps(config))
    ggufsmith.convert(model_dir, tmp_path / "hub.gguf", "f32")
    assert gguf_contents(tmp_path / "hub.gguf") == gguf_contents(converted("modern-bert", "f32"))
