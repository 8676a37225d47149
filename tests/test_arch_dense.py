"""The current dense decoders (issue 12) converted by ggufsmith: llama.cpp gives transformers'
logits, and llama.cpp's own converter writes the same file.

One tiny random-weight model per variant (MODELS), built with transformers with each family's
distinctive features switched on, and a BPE tokenizer trained in the tests in the family's
pre-tokenizer style. Tolerances are in units of the standard deviation of transformers' logits:
  f32:  1e-3 (measured ~1e-5 where both sides compute in float32 in different orders); 1e-2 for
        GELU models, which llama.cpp computes through a float16 lookup table;
  f16:  4e-2, the rounding of the weights (relative 2^-11) through 4 layers of a random model with
        large weights (measured 0.5e-2 to 2.1e-2 across the families);
  q8_0: 0.6 (measured 0.25-0.36): llama.cpp also rounds the activations to 8 bits before each
        q8_0 matrix product, so the error is about twice the weights' alone. A layout error gives
        errors of several standard deviations.
"""

from __future__ import annotations

import json

import pytest

import ggufsmith
from tests.decoder_reference import reference_convert
from tests.family_models import build_model, hf_logits, llamacpp_logits, prompt_ids, relative_error
from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES, assert_same_file
from tests.tokenizer_helpers import train_bpe, train_sentencepiece

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

TOLERANCE = {"f32": 1e-3, "f16": 4e-2, "q8_0": 0.6}
GELU_F32_TOLERANCE = 1e-2
VOCAB = 600
COMMON = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
              vocab_size=VOCAB + 8, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def variant(config_class, model_class, arch, style, gelu=False, differences=None, **fields):
    """differences: keys where our file differs from convert_hf_to_gguf.py's for this variant, with
    the reason; None instead of a dict: the reference cannot convert the variant (the reason)."""
    return dict(config_class=config_class, model_class=model_class, arch=arch, style=style, gelu=gelu,
                differences={} if differences is None else differences, fields=dict(COMMON, **fields))


STABLELM_DIFFERENCES = {"stablelm.rope.freq_base": "the reference omits it, which is right only for rope_theta 10000"}


MODELS = {
    # Qwen2.5 style: GQA, q/k/v biases, the long-context releases' rope theta
    "qwen2": variant("Qwen2Config", "Qwen2ForCausalLM", "qwen2", "qwen2", rope_theta=1e6),
    "qwen2-tied": variant("Qwen2Config", "Qwen2ForCausalLM", "qwen2", "qwen2", tie_word_embeddings=True),
    # Qwen3: q/k norms, a head size that is not hidden/heads
    "qwen3": variant("Qwen3Config", "Qwen3ForCausalLM", "qwen3", "qwen2", head_dim=24),
    # StarCoder2: LayerNorms and biases, GELU MLP
    "starcoder2": variant("Starcoder2Config", "Starcoder2ForCausalLM", "starcoder2", "starcoder", gelu=True,
                          use_bias=True, norm_epsilon=1e-5),
    # OLMo 2: post-norms, whole-width q/k norms; OLMo 3: sliding window on 3 of every 4 layers
    "olmo2": variant("Olmo2Config", "Olmo2ForCausalLM", "olmo2", "gpt2"),
    "olmo3": variant("Olmo3Config", "Olmo3ForCausalLM", "olmo2", "gpt2", sliding_window=8),
    # Granite 3: the four multipliers
    "granite": variant("GraniteConfig", "GraniteForCausalLM", "granite", "starcoder", embedding_multiplier=3.0,
                       residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5),
    # SmolLM3: no rope in every fourth layer (layer 3 of 4 here)
    "smollm3": variant("SmolLM3Config", "SmolLM3ForCausalLM", "smollm3", "llama3"),
    # StableLM 2: partial rotary, qkv biases; 12B style: per-head q/k LayerNorms, parallel residual
    "stablelm": variant("StableLmConfig", "StableLmForCausalLM", "stablelm", "gpt2", use_qkv_bias=True,
                        differences=STABLELM_DIFFERENCES,
                        partial_rotary_factor=0.25, layer_norm_eps=1e-5),
    "stablelm-12b": variant("StableLmConfig", "StableLmForCausalLM", "stablelm", "gpt2", qk_layernorm=True,
                            differences="convert_hf_to_gguf.py (0.3.36) stops with 'Unprocessed norms' on the "
                                        "per-head q/k LayerNorms as transformers 5 saves them",
                            use_parallel_residual=True, partial_rotary_factor=0.5, layer_norm_eps=1e-5),
    # Seed-OSS: q/k/v biases
    "seed_oss": variant("SeedOssConfig", "SeedOssForCausalLM", "seed_oss", "qwen2", attention_bias=True),
    # ERNIE 4.5 (0.3B style): interleaved rope, SentencePiece
    "ernie4_5": variant("Ernie4_5Config", "Ernie4_5ForCausalLM", "ernie4_5", "sentencepiece", use_bias=False,
                        bos_token_id=1, eos_token_id=2,  # <s>, </s> of the SentencePiece model
                        differences=TOKENIZER_KEY_DIFFERENCES),
    # Command R: parallel attention and MLP, tied head, logit scale; Command R7B: sliding window 3 of 4
    "command-r": variant("CohereConfig", "CohereForCausalLM", "command-r", "starcoder", tie_word_embeddings=True,
                         logit_scale=0.25, layer_norm_eps=1e-5),
    "cohere2": variant("Cohere2Config", "Cohere2ForCausalLM", "cohere2", "starcoder", tie_word_embeddings=True,
                       logit_scale=0.25, sliding_window=8, layer_norm_eps=1e-5,
                       differences="convert_hf_to_gguf.py (0.3.36) fails on transformers 5 Cohere2 configs "
                                   "(KeyError: 'rotary_pct', now in rope_parameters)"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    out = {}
    for kind, spec in MODELS.items():
        model_dir = root / kind
        if spec["style"] == "sentencepiece":
            train_sentencepiece(model_dir, vocab_size=VOCAB)
            # as ERNIE 4.5's tokenizer_config.json says (and what transformers 5 does for this config)
            config = json.loads((model_dir / "tokenizer_config.json").read_text())
            (model_dir / "tokenizer_config.json").write_text(json.dumps(config | {"add_prefix_space": False}))
        else:
            train_bpe(model_dir, spec["style"], vocab_size=VOCAB)
        build_model(spec["config_class"], spec["model_class"], model_dir, **spec["fields"])
        ids = prompt_ids(model_dir)
        out[kind] = model_dir, ids, hf_logits(model_dir, spec["model_class"], ids)
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("dense-gguf")
    cache = {}

    def get(kind: str, outtype: str):
        if (kind, outtype) not in cache:
            cache[kind, outtype] = root / f"{kind}-{outtype}.gguf"
            ggufsmith.convert(models[kind][0], cache[kind, outtype], outtype=outtype)
        return cache[kind, outtype]

    return get


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("kind", list(MODELS))
def test_logits_match_transformers(models, converted, kind, outtype):
    _, ids, expected = models[kind]
    bound = GELU_F32_TOLERANCE if outtype == "f32" and MODELS[kind]["gelu"] else TOLERANCE[outtype]
    error = relative_error(llamacpp_logits(converted(kind, outtype), ids), expected)
    print(f"{kind} {outtype}: max error {error:.2e} std")
    assert error <= bound, f"{kind} {outtype}: max error {error:.2e} of the logits' std"


@pytest.mark.parametrize("kind", list(MODELS))
def test_architecture_and_tokenizer(models, converted, kind):
    from transformers import AutoTokenizer

    from tests.tokenizer_helpers import CHECK_TEXT

    path = converted(kind, "f32")
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == MODELS[kind]["arch"]
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        ours = llm.tokenize(CHECK_TEXT.encode("utf-8"), add_bos=False, special=False)
    finally:
        llm.close()
    assert ours == AutoTokenizer.from_pretrained(models[kind][0]).encode(CHECK_TEXT, add_special_tokens=False)


# Tokenizer keys ggufsmith writes where the reference leaves them out: llama.cpp finds the same ids
# by their text at load time.
KEY_DIFFERENCES = {
    key: "written explicitly; llama.cpp finds the same id by its text at load time"
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
                *(f"tokenizer.ggml.fim_{kind}_token_id" for kind in ("pre", "suf", "mid", "pad", "rep", "sep")))
} | {
    "tokenizer.ggml.add_eos_token": "written as false from a post-processor that adds no eos (llama.cpp's default)",
    "tokenizer.ggml.add_sep_token": "the reference writes false from the pair template, llama.cpp's default",
}


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("kind", [k for k, spec in MODELS.items() if isinstance(spec["differences"], dict)])
def test_same_file_as_convert_hf_to_gguf(models, converted, kind, outtype):
    from tests.tokenizer_helpers import BPE_STYLES  # noqa: F401  (the style names are llama.cpp's)

    model_dir = models[kind][0]
    pre = gguf.GGUFReader(converted(kind, "f32")).fields["tokenizer.ggml.pre"].contents()
    theirs = reference_convert(model_dir, model_dir.parent / f"{kind}-reference-{outtype}.gguf", outtype, pre=pre)
    assert_same_file(converted(kind, outtype), theirs, KEY_DIFFERENCES | MODELS[kind]["differences"])


# transformers' own GGUF loader undoes the layout changes independently of us, for the families it
# reads (transformers/integrations/ggml.py). Not qwen3: the loader ignores attention.key_length, so
# it cannot build a Qwen3 whose head size is not hidden/heads (our variant, and Qwen3-0.6B), whoever
# converted the file.
@pytest.mark.parametrize("kind", ["qwen2", "stablelm", "starcoder2"])
def test_transformers_gguf_loader_gives_the_original_logits(models, converted, kind, tmp_path):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    pytest.importorskip("accelerate")
    (tmp_path / "model.gguf").symlink_to(converted(kind, "f32"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32).eval()
    _, ids, expected = models[kind]
    with torch.no_grad():
        got = model(torch.tensor([ids])).logits[0].float().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))
