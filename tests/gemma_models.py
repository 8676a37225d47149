"""Tiny random-weight Gemma checkpoints built with transformers, with the family's features switched
on so that getting them wrong changes the logits:
- norm weights drawn around 0 with a wide spread (Gemma applies 1 + w: writing w alone, or 1 + w
  twice, changes every layer's output),
- GQA (4 query heads, 2 key/value heads) and head_dim different from hidden / heads,
- Gemma 2: soft-capping small enough to bite (attention 2.0, final 3.0 against raw values of ~10),
- Gemma 2/3: a sliding window of 5 tokens over prompts of 20+, on a per-layer pattern,
- Gemma 3: q/k norms, different rope bases for local and global layers, linear rope scaling on the
  global ones, and a layer pattern that is not llama.cpp's default (so the pattern key matters).
Saved in float32, as transformers saves them, with a SentencePiece tokenizer.model.
"""

from __future__ import annotations

from pathlib import Path

HIDDEN = 64
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 24
VOCAB = 1200  # the tests' SentencePiece vocabulary size
WINDOW = 5

COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_attention_heads=HEADS,
              num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=256, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)  # the tests' SentencePiece ids

# name -> (transformers config class, model class, config fields)
VARIANTS: dict[str, tuple[str, str, dict]] = {
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(COMMON, num_hidden_layers=2, rope_theta=500.0)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        COMMON, num_hidden_layers=4, query_pre_attn_scalar=HEAD_DIM, sliding_window=WINDOW,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0, rope_theta=500.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        COMMON, num_hidden_layers=4, query_pre_attn_scalar=HEAD_DIM, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        final_logit_softcapping=3.0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})),
}
# Gemma 4, 31B style: full layers with their own head size, one key/value head used as values too
# (attention_k_eq_v) and proportional rope over a quarter of the head; layer scalars; no per-layer
# embeddings.
GEMMA4_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
VARIANTS["gemma4"] = ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
    COMMON, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
    num_hidden_layers=4, layer_types=GEMMA4_TYPES[1:], sliding_window=WINDOW, final_logit_softcapping=3.0,
    hidden_size_per_layer_input=0,
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000.0}}))
# Gemma 4, E2B style: per-layer embeddings, the last two layers reusing earlier layers' keys and
# values, with double-wide MLPs.
VARIANTS["gemma4-e"] = ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
    COMMON, head_dim=16, global_head_dim=32, num_hidden_layers=5, layer_types=GEMMA4_TYPES, sliding_window=WINDOW,
    hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=2, use_double_wide_mlp=True,
    final_logit_softcapping=3.0,
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000.0}}))

# Gemma 4, 26B-A4B style: a mixture of experts beside each layer's dense MLP.
VARIANTS["gemma4-moe"] = ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
    VARIANTS["gemma4"][2], enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32))

# For transformers' GGUF loader, which restores only a few keys (no soft-capping values, no
# query_pre_attn_scalar, no layer pattern, no local rope base): the same models with transformers'
# defaults for those, so that the config it rebuilds describes the model.
VARIANTS["gemma2-defaults"] = ("Gemma2Config", "Gemma2ForCausalLM", dict(
    COMMON, head_dim=256, num_hidden_layers=2, query_pre_attn_scalar=256, sliding_window=WINDOW, rope_theta=500.0))
VARIANTS["gemma3-defaults"] = ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
    COMMON, head_dim=256, num_hidden_layers=2, query_pre_attn_scalar=256, sliding_window=WINDOW))
DEFAULTS_VARIANTS = ("gemma2-defaults", "gemma3-defaults")

# The same text models inside Gemma3/Gemma4ForConditionalGeneration, with a tiny vision tower beside.
MULTIMODAL = "gemma3-vision"
MULTIMODAL_GEMMA4 = "gemma4-vision"
MULTIMODAL_TEXT = {MULTIMODAL: "gemma3", MULTIMODAL_GEMMA4: "gemma4"}
MULTIMODAL_CLASS = {MULTIMODAL: "Gemma3ForConditionalGeneration", MULTIMODAL_GEMMA4: "Gemma4ForConditionalGeneration"}


def _multimodal_config(kind: str):
    import transformers

    text_fields = VARIANTS[MULTIMODAL_TEXT[kind]][2]
    if kind == MULTIMODAL:
        vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=32, patch_size=8)
        return transformers.Gemma3Config(text_config=transformers.Gemma3TextConfig(**text_fields), vision_config=vision,
                                         mm_tokens_per_image=4, image_token_index=VOCAB - 1,
                                         boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3)
    vision = transformers.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    return transformers.Gemma4Config(text_config=transformers.Gemma4TextConfig(**text_fields), vision_config=vision,
                                     audio_config=None, image_token_id=VOCAB - 1, boi_token_id=VOCAB - 2,
                                     eoi_token_id=VOCAB - 3)


def build_model(kind: str, model_dir: Path, seed: int = 0) -> Path:
    """Save a random model of `kind` (a VARIANTS or MULTIMODAL_CLASS key) in model_dir."""
    import torch
    import transformers

    if kind in MULTIMODAL_CLASS:
        config = _multimodal_config(kind)
        model_class = getattr(transformers, MULTIMODAL_CLASS[kind])
    else:
        config_class, model_name, fields = VARIANTS[kind]
        config = getattr(transformers, config_class)(**fields)
        model_class = getattr(transformers, model_name)
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("scale"):  # Gemma 4's router: input and per-expert scales, 1 in a new model
                param.uniform_(0.5, 1.5)
            elif name.endswith("norm.weight"):
                param.normal_(0.0, 0.5)  # the offset from 1 that Gemma stores
            elif param.ndim >= 2:
                param.normal_(0.0, 0.15)
            else:
                param.normal_(0.0, 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4: a saved buffer, 1 in a new model
                buffer.uniform_(0.5, 1.5)
    model.save_pretrained(model_dir)
    return model_dir


def load_model(model_dir: Path, kind: str):
    import transformers

    model_class = MULTIMODAL_CLASS.get(kind) or VARIANTS[kind][1]
    return getattr(transformers, model_class).from_pretrained(model_dir, dtype="float32").eval()
