"""Gemma 1-4, converted by ggufsmith, run in llama.cpp (llama-cpp-python) and give transformers'
logits; the files equal llama.cpp's convert_hf_to_gguf.py's; transformers' GGUF loader reads them
back. Models: tests/gemma_models.py (soft-capping that bites, sliding window shorter than the
prompt, randomized norm offsets, GQA, local/global rope with linear scaling; Gemma 4's per-layer
head sizes, k=v attention, proportional rope, per-layer embeddings, KV sharing, double-wide MLP,
layer scalars; Gemma 3 and 4 inside their ...ForConditionalGeneration with a vision tower).

Tolerances are relative to the standard deviation of transformers' logits (about 1.2-1.5 here):
- f32 1e-2: llama.cpp computes GELU through a float16 table (Gemma's MLP is GeGLU), which bounds
  the agreement at a few 1e-3; the tensors themselves are bit-identical to llama.cpp's converter's
  (test_same_file_as_convert_hf_to_gguf).
- f16 2e-2: f16 weights (relative rounding 2**-11) on top of the f32 error; measured 4e-3..8e-3.
- q8_0 0.35: q8_0 rounds each weight by up to 1/254 of its block's largest value, about 0.3% of a
  weight here (N(0, 0.15)); through 4 sandwich-normed layers, the scaled embeddings (x8) and the
  soft-capping this moves logits by 0.14-0.29 std (measured). The q8_0 bytes are those of llama.cpp's
  converter (same test), so the tolerance bounds our file's running, not our quantizer.
Every tolerance fails by orders of magnitude when a Gemma-specific change is removed (norm offset:
error ~3 std; soft-capping, sliding-window pattern, swa rope base: 0.3-4 std, see the report).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from ggufsmith.arch.gemma4 import Gemma4
from tests.gemma_models import DEFAULTS_VARIANTS, MULTIMODAL, MULTIMODAL_GEMMA4, VARIANTS, build_model, load_model
from tests.tokenizer_helpers import train_sentencepiece

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

KINDS = [*(k for k in VARIANTS if k not in DEFAULTS_VARIANTS), MULTIMODAL, MULTIMODAL_GEMMA4]
TOLERANCE = {"f32": 1e-2, "f16": 2e-2, "q8_0": 0.35}  # max |llama.cpp - transformers| / std(logits)
# bos, then 24 tokens: longer than the sliding window (5) several times over.
PROMPT = [1] + [(17 * i) % 1100 + 20 for i in range(24)]


class Gemma4WithSentencePiece(Gemma4):
    """Gemma 4 with the tests' SentencePiece tokenizer: the model is what these tests check; Gemma 4's
    own tokenizer kind ("gemma4") is tested in tests/test_tokenizer_gemma_phi3.py and
    tests/test_tokenizer_vocab_files_keys.py."""

    tokenizer_kind = "llama"


def is_gemma4(kind: str) -> bool:
    return kind.startswith("gemma4")


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma")
    dirs = {}
    for kind in [*KINDS, *DEFAULTS_VARIANTS]:
        model_dir = root / kind
        train_sentencepiece(model_dir)
        if is_gemma4(kind):  # llama.cpp's converter reads Gemma 4's vocabulary from tokenizer.json
            from transformers import LlamaTokenizerFast

            LlamaTokenizerFast.from_pretrained(model_dir).save_pretrained(model_dir)
        dirs[kind] = build_model(kind, model_dir)
    return dirs


@pytest.fixture(scope="session")
def reference_logits(model_dirs) -> dict[str, np.ndarray]:
    out = {}
    for kind, model_dir in model_dirs.items():
        with torch.no_grad():
            out[kind] = load_model(model_dir, kind)(torch.tensor([PROMPT])).logits[0].float().numpy()
    return out


@pytest.fixture(scope="session")
def converted(model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma_gguf")
    cache = {}

    def get(kind: str, outtype: str) -> Path:
        if (kind, outtype) not in cache:
            cache[kind, outtype] = root / f"{kind}-{outtype}.gguf"
            ggufsmith.convert(model_dirs[kind], cache[kind, outtype], outtype,
                              arch=Gemma4WithSentencePiece if is_gemma4(kind) else None)
        return cache[kind, outtype]

    return get


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=128, logits_all=True, verbose=False,
                          type_k=0, type_v=0)  # F32 KV cache: only the weights' type differs between rows
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


# The MoE model's router picks 2 of 4 experts per token: q8_0's small changes to the hidden states
# flip near-tied choices, and a flipped choice changes a token's logits entirely (measured 1.4 std),
# so its q8_0 logits say nothing; its q8_0 file is compared with llama.cpp's converter's instead.
LOGIT_CASES = [(kind, outtype) for kind in KINDS for outtype in TOLERANCE if (kind, outtype) != ("gemma4-moe", "q8_0")]


@pytest.mark.parametrize(("kind", "outtype"), LOGIT_CASES)
def test_logits_match_transformers(converted, reference_logits, kind, outtype):
    expected = reference_logits[kind]
    error = np.abs(llama_cpp_logits(converted(kind, outtype), PROMPT) - expected).max() / expected.std()
    print(f"{kind} {outtype}: max error / std {error:.2e}")
    assert error <= TOLERANCE[outtype], f"{kind} {outtype}: max error / std {error:.2e}"


def test_multimodal_checkpoint_converts_the_language_model_with_one_notice(model_dirs, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    plan = ggufsmith.convert(model_dirs[MULTIMODAL], tmp_path / "out.gguf", "f32", dry_run=True)
    notices = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(notices) == 1, notices
    assert "the vision tower" in notices[0] and "the multimodal projector" in notices[0], notices[0]
    assert not any(t.name.startswith(("v.", "mm.")) or "vision" in t.name for t in plan.tensors)
    assert {t.name for t in plan.tensors} == {t.name for t in ggufsmith.convert(
        model_dirs["gemma3"], tmp_path / "text.gguf", "f32", dry_run=True).tensors}


# -- against llama.cpp's own converter ------------------------------------------------------------

# Keys where ours differ from convert_hf_to_gguf.py's on purpose (beyond the SentencePiece exporter's
# documented choices, tests/llamacpp_reference.TOKENIZER_KEY_DIFFERENCES).
GEMMA_KEY_DIFFERENCES = {
    **{f"tokenizer.ggml.{role}_token_id": "the reference's Gemma 1 class writes CodeGemma's fill-in-the-middle "
       "ids (67-70) for every Gemma model; they are other tokens in any other vocabulary"
       for role in ("prefix", "suffix", "middle", "fsep")},
    **{f"{arch}.rope.freq_base": "the reference writes none, so llama.cpp uses 10000 whatever config.json says "
       "(this model's is 500; Google's Gemma 1/2 use 10000, where both files agree)" for arch in ("gemma", "gemma2")},
    "gemma3.attention.sliding_window_pattern": "this model's layer pattern is not llama.cpp's default of 6 and the "
                                               "reference does not write it: its file slides the window on other layers",
    "gemma3.final_logit_softcapping": "Gemma3ForConditionalGeneration does not soft-cap its logits in transformers; "
                                      "the reference writes text_config's cap, so llama.cpp caps where transformers does not",
}
COMPARED = ("f32", "f16", "q8_0")


@pytest.mark.parametrize("outtype", COMPARED)
@pytest.mark.parametrize("kind", KINDS)
def test_same_file_as_convert_hf_to_gguf(model_dirs, converted, kind, outtype):
    from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES, assert_same_file, gguf_contents, reference_conversions

    model_dir = model_dirs[kind]
    theirs = reference_conversions(model_dir, model_dir.parent / f"{kind}-reference", COMPARED)[outtype]
    ours = converted(kind, outtype)
    differences = TOKENIZER_KEY_DIFFERENCES | GEMMA_KEY_DIFFERENCES
    if is_gemma4(kind):  # our test plugin writes the SentencePiece vocabulary, the reference Gemma 4's
        keys = set(gguf_contents(ours)[0]) | set(gguf_contents(theirs)[0])
        differences |= {k: "tokenizer of another kind" for k in keys if k.startswith("tokenizer.")}
    assert_same_file(ours, theirs, differences)


# -- transformers' GGUF loader -------------------------------------------------------------------

# It undoes the norm offset itself (gemma2, gemma3); it has no Gemma 1 mapping.
@pytest.mark.parametrize("kind", DEFAULTS_VARIANTS)
def test_transformers_gguf_loader_gives_the_original_logits(converted, reference_logits, kind, tmp_path):
    from transformers import AutoModelForCausalLM

    pytest.importorskip("accelerate")
    (tmp_path / "model.gguf").symlink_to(converted(kind, "f32"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].numpy()
    np.testing.assert_allclose(logits, reference_logits[kind], rtol=0, atol=1e-4)
