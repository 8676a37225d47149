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

import numpy as np
import pytest

import ggufsmith
from tests.decoder_reference import reference_convert
from tests.family_models import build_model, conversions, hf_logits, llamacpp_logits, prompt_ids, relative_error
from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES, assert_same_file
from tests.tokenizer_helpers import train_bpe, train_bpe_for_table_entry, train_sentencepiece, write_tokenizer_config

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


def variant(config_class, model_class, arch, style, gelu=False, differences=None, tokenizer_config=None,
            specials=None, generation_eos=(), **fields):
    """style: a BPE_STYLES name, "sentencepiece", "phi3", or with `specials` (train_bpe_for_table_entry's
    specials and eos) an entry of our pre-tokenizer table. differences: keys where our file differs
    from convert_hf_to_gguf.py's for this variant, with the reason; None instead of a dict: the
    reference cannot convert the variant (the reason). tokenizer_config: entries written into
    tokenizer_config.json after training; generation_eos: the texts of generation_config.json's eos ids."""
    return dict(config_class=config_class, model_class=model_class, arch=arch, style=style, gelu=gelu,
                differences={} if differences is None else differences, tokenizer_config=tokenizer_config or {},
                specials=specials, generation_eos=generation_eos, fields=dict(COMMON, **fields))


PHI3_CHAT = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>", "<|system|>")  # added after the SentencePiece vocabulary
PHI3_END = VOCAB + PHI3_CHAT.index("<|end|>")
PHI3_DIFFERENCES = {"tokenizer.ggml.scores": "<unk>'s score is sentencepiece's (0); the reference's Phi-3 converter "
                                             "sets -1000 for every token listed in added_tokens_decoder, <unk> "
                                             "included (a score llama.cpp never uses for an unknown token)"}
GLM4_SPECIALS = ("<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>")
GLM4_GENERATION_EOS = ("<|endoftext|>", "<|user|>", "<|observation|>")  # as GLM-4-0414's generation_config.json
GLM4_DIFFERENCES = {"tokenizer.ggml.unknown_token_id": "the reference names <|endoftext|> as unk; a byte-level BPE "
                                                       "has no unknown token and we name none"}
TEKKEN_DIFFERENCES = {"tokenizer.ggml.seperator_token_id": "the reference names the <s> of the test tokenizer's pair "
                                                         "template a separator, which llama.cpp never adds "
                                                         "(add_sep_token false)"}
MINISTRAL3_ROPE = dict(rope_type="yarn", rope_theta=1e6, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                       original_max_position_embeddings=16, mscale=1.0, mscale_all_dim=0.7, llama_4_scaling_beta=0.1)
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
    # Phi-3 mini: fused qkv and gate/up, a Llama 2 SentencePiece with Phi-3's chat tokens, sliding_window
    "phi3": variant("Phi3Config", "Phi3ForCausalLM", "phi3", "phi3", bos_token_id=1, eos_token_id=PHI3_END,
                    sliding_window=2047, differences=TOKENIZER_KEY_DIFFERENCES | PHI3_DIFFERENCES),
    # Phi-4-mini: LongRoPE (short factors within original_max_position_embeddings, checked against
    # transformers' rope for the long ones too), partial rotary, tied embeddings, a GPT-2-class BPE
    "phi4-mini": variant("Phi3Config", "Phi3ForCausalLM", "phi3", "gpt-4o", tokenizer_config={"tokenizer_class": "GPT2Tokenizer"},
                         tie_word_embeddings=True, max_position_embeddings=1024, original_max_position_embeddings=256,
                         rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                                              long_factor=[5.1, 8.6, 2.2, 8.6, 3.5, 4.4],
                                              short_factor=[1.41, 1.2, 1.28, 1.01, 1.38, 1.27])),
    # GLM-4-0414: q/k/v biases, fused gate/up, post-attention and post-MLP norms, half-rotated heads
    # (Glm4Config's default), its eos/eot from generation_config.json
    "glm4": variant("Glm4Config", "Glm4ForCausalLM", "glm4", "glm4", attention_bias=True, head_dim=16,
                    specials=dict(specials=GLM4_SPECIALS, eos="<|endoftext|>"), generation_eos=GLM4_GENERATION_EOS,
                    differences=GLM4_DIFFERENCES),
    # EXAONE 4.0 32B style: post-norms only, q/k norms, 64 blocks (the depth at which llama.cpp runs
    # its sliding window: 3 of 4 layers, the others without rope), llama3 rope scaling
    "exaone4": variant("Exaone4Config", "Exaone4ForCausalLM", "exaone4", "exaone4", num_hidden_layers=64,
                       specials=dict(specials=("[PAD]", "[BOS]", "[|endofturn|]"), eos="[|endofturn|]"),
                       bos_token_id=1, eos_token_id=2, sliding_window=8, sliding_window_pattern=4,
                       rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                                            high_freq_factor=4.0, original_max_position_embeddings=64)),
    # Ministral 3: yarn (mscale_all_dim as llama.cpp's yarn_log_multiplier) and Llama 4's attention
    # temperature, both at work within the prompt (original context 16)
    "ministral3": variant("Ministral3Config", "Ministral3ForCausalLM", "mistral3", "tekken", head_dim=16,
                          bos_token_id=1, eos_token_id=2,
                          rope_parameters=MINISTRAL3_ROPE, differences=TEKKEN_DIFFERENCES),
    # Ministral 3 with vision (Mistral3ForConditionalGeneration): its language model, the Pixtral
    # tower and projector left out
    "mistral3-vision": variant("Mistral3Config", "Mistral3ForConditionalGeneration", "mistral3", "tekken",
                               differences=TEKKEN_DIFFERENCES) | {"fields": dict(
        text_config=dict(COMMON, model_type="ministral3", head_dim=16, bos_token_id=1, eos_token_id=2,
                         rope_parameters=MINISTRAL3_ROPE),
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=16, image_size=32, patch_size=16),
        image_token_index=10)},
    # transformers' Ministral (sliding window on every layer, wider than the prompt): llama's layout
    "ministral": variant("MinistralConfig", "MinistralForCausalLM", "llama", "tekken", head_dim=16, bos_token_id=1, eos_token_id=2,
                         sliding_window=4096,
                         differences="convert_hf_to_gguf.py (0.3.36) has no MinistralForCausalLM "
                                     "(Ministral-8B is published as MistralForCausalLM, which it converts as llama)"),
    # Apertus: xIELU MLP (per-block parameters as array keys), q/k norms, llama3 rope
    "apertus": variant("ApertusConfig", "ApertusForCausalLM", "apertus", "tekken", bos_token_id=1, eos_token_id=2,
                       rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                                            high_freq_factor=4.0, original_max_position_embeddings=64),
                       differences=TEKKEN_DIFFERENCES),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("dense")
    out = {}
    for kind, spec in MODELS.items():
        model_dir = root / kind
        if spec["style"] == "sentencepiece":
            train_sentencepiece(model_dir, vocab_size=VOCAB)
            # as ERNIE 4.5's tokenizer_config.json says (and what transformers 5 does for this config)
            config = json.loads((model_dir / "tokenizer_config.json").read_text())
            (model_dir / "tokenizer_config.json").write_text(json.dumps(config | {"add_prefix_space": False}))
        elif spec["style"] == "phi3":
            train_phi3_tokenizer(model_dir)
        elif spec["specials"]:
            train_bpe_for_table_entry(model_dir, spec["style"], vocab_size=VOCAB, **spec["specials"])
        else:
            train_bpe(model_dir, spec["style"], vocab_size=VOCAB)
        write_tokenizer_config(model_dir, **spec["tokenizer_config"])
        build_model(spec["config_class"], spec["model_class"], model_dir, **spec["fields"])
        if spec["generation_eos"]:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            eos_ids = [tokenizer.convert_tokens_to_ids(text) for text in spec["generation_eos"]]
            (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
        ids = prompt_ids(model_dir)
        out[kind] = model_dir, ids, hf_logits(model_dir, spec["model_class"], ids)
    return out


def train_phi3_tokenizer(model_dir):
    """Phi-3's: Llama 2's SentencePiece (<unk> <s> </s> first) and its chat tokens added after it,
    <|end|> the eos. (llama.cpp's vocabulary loader looks <|endoftext|> up in any model named Phi-3.)"""
    from transformers import AutoTokenizer

    train_sentencepiece(model_dir, vocab_size=VOCAB, control_symbols=[], user_defined_symbols=[])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": list(PHI3_CHAT)})
    tokenizer.eos_token = "<|end|>"
    tokenizer.save_pretrained(model_dir)
    write_tokenizer_config(model_dir, legacy=True)
    assert tokenizer.convert_tokens_to_ids("<|end|>") == PHI3_END


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("dense-gguf"))


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
    # transformers' tokenizer converted from Phi-3's legacy SentencePiece splits a leading space
    # differently from sentencepiece itself (see tests/test_tokenizer_gemma_phi3.py)
    text = CHECK_TEXT.lstrip() if MODELS[kind]["style"] == "phi3" else CHECK_TEXT
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        ours = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    finally:
        llm.close()
    assert ours == AutoTokenizer.from_pretrained(models[kind][0]).encode(text, add_special_tokens=False)


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
@pytest.mark.parametrize("kind", ["qwen2", "stablelm", "starcoder2", "phi3"])
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


@pytest.mark.parametrize("kind", [k for k, spec in MODELS.items() if spec["fields"].get("rope_parameters", {}).get("rope_type") == "longrope"])
def test_longrope_factors_match_transformers(models, converted, kind):
    """Both LongRoPE factor sets and the attention factor in our file give transformers' own rope
    (its longrope init for a prompt within and one beyond original_max_position_embeddings): the
    logits test sees only the short set."""
    import torch
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fields = {f.name: f.contents() for f in gguf.GGUFReader(converted(kind, "f32")).fields.values()}
    tensors = {t.name: np.array(t.data) for t in gguf.GGUFReader(converted(kind, "f32")).tensors}
    arch = MODELS[kind]["arch"]
    n_rot, base = fields[f"{arch}.rope.dimension_count"], fields[f"{arch}.rope.freq_base"]
    original = fields[f"{arch}.rope.scaling.original_context_length"]
    config = AutoConfig.from_pretrained(models[kind][0])
    for name, seq_len in (("rope_factors_short.weight", original), ("rope_factors_long.weight", original + 1)):
        expected, attention_scaling = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len=seq_len)
        ours = 1.0 / (tensors[name] * base ** (np.arange(0, n_rot, 2) / n_rot))
        np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6, err_msg=name)
        assert fields[f"{arch}.rope.scaling.attn_factor"] == pytest.approx(attention_scaling, rel=1e-6)
    assert not np.allclose(tensors["rope_factors_short.weight"], tensors["rope_factors_long.weight"])


def test_exaone4_multi_token_prediction_left_out_with_a_notice(models, converted, tmp_path, caplog):
    """EXAONE checkpoints with MTP layers (mtp.*): converted without them, one warning naming them."""
    import shutil

    from safetensors.numpy import load_file, save_file

    folder = shutil.copytree(models["exaone4"][0], tmp_path / "exaone4-mtp")
    weights = load_file(folder / "model.safetensors")
    hidden = COMMON["hidden_size"]
    weights |= {"mtp.fc.weight": np.ones((hidden, 2 * hidden), np.float32),
                "mtp.layers.0.input_layernorm.weight": np.ones(hidden, np.float32)}
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level("WARNING"):
        ggufsmith.convert(folder, tmp_path / "mtp.gguf", outtype="f32")
    assert [r.getMessage() for r in caplog.records if "mtp." in r.getMessage()] != []
    ours = [t.name for t in gguf.GGUFReader(tmp_path / "mtp.gguf").tensors]
    assert ours == [t.name for t in gguf.GGUFReader(converted("exaone4", "f32")).tensors]


def test_glm4_config_without_head_dim_and_rotary_fraction_gets_glm4configs_defaults():
    """GLM-4 configs that leave out head_dim and partial_rotary_factor: transformers' Glm4Config fills
    in its own values (not hidden/heads, not a whole head), and so must the keys."""
    from transformers import Glm4Config

    from ggufsmith.arch.glm4 import Glm4
    from ggufsmith.readers.config import HFConfig

    fields = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2,
                  intermediate_size=1024, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0)
    reference = Glm4Config(**fields)
    keys = {k: v.plain() for k, v in Glm4(HFConfig(fields)).metadata().items()}
    assert keys["glm4.attention.key_length"] == reference.head_dim != fields["hidden_size"] // fields["num_attention_heads"]
    rotated = int(reference.head_dim * reference.rope_parameters["partial_rotary_factor"])
    assert keys["glm4.rope.dimension_count"] == rotated < reference.head_dim
