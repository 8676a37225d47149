"""Tiny random-weight checkpoints of the standard decoders (falcon, gpt2, gptneox, gptj, bloom, mpt),
built with transformers and saved as transformers saves them.

Weights are drawn with a fixed seed and a larger spread than transformers' init (std 0.02 gives
nearly uniform logits, which would hide layout errors): matrices N(0, 0.15), norm weights around 1,
biases N(0, 0.1).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.family_models import randomize

HIDDEN = 64
LAYERS = 2
HEADS = 4
CONTEXT = 128

# name -> (transformers config class, model class, config fields)
VARIANTS: dict[str, tuple[str, str, dict]] = {
    # Falcon-7B style: one key/value head shared by all queries, one norm per block.
    "falcon-mq": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
        new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False,
        max_position_embeddings=2048)),
    # Falcon-40B style: grouped key/value heads and two norms per block (ln_attn, ln_mlp).
    "falcon-gqa": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_kv_heads=2, num_hidden_layers=LAYERS,
        new_decoder_architecture=True, bias=False, max_position_embeddings=2048)),
    # Falcon2-11B style: the new decoder with a single norm shared by attention and MLP.
    "falcon-gqa-onenorm": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_kv_heads=2, num_hidden_layers=LAYERS,
        new_decoder_architecture=True, num_ln_in_parallel_attn=1, bias=False, max_position_embeddings=2048)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, n_positions=1024)),  # transformers' GGUF loader assumes 1024
    "gptneox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=LAYERS, intermediate_size=4 * HIDDEN,
        max_position_embeddings=CONTEXT, use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
    "gptneox-sequential": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=LAYERS, intermediate_size=3 * HIDDEN,
        max_position_embeddings=CONTEXT, use_parallel_residual=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5})),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(
        hidden_size=HIDDEN, n_head=HEADS, n_layer=LAYERS)),
    # alibi_bias_max: transformers' MptModel always uses 8 whatever the config says (MosaicML's code
    # uses the config's value, as llama.cpp does with the key we write), so the tests keep 8.
    "mpt": ("MptConfig", "MptForCausalLM", dict(
        d_model=HIDDEN, n_heads=HEADS, n_layers=LAYERS, max_seq_len=CONTEXT,
        attn_config={"alibi": True, "alibi_bias_max": 8, "clip_qkv": 1.5})),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(
        n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, n_positions=CONTEXT, rotary_dim=8)),
}


def build_model(kind: str, model_dir: Path, vocab_size: int, seed: int = 0, **overrides) -> Path:
    """Save a random model of `kind` (a VARIANTS key) in model_dir as model.safetensors + config.json.
    Special token ids default to 0 (the first token of the tests' tokenizers)."""
    import torch
    import transformers

    config_class, model_class, fields = VARIANTS[kind]
    fields = dict(bos_token_id=0, eos_token_id=0) | fields | overrides
    config = getattr(transformers, config_class)(vocab_size=vocab_size, **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    randomize(model, norm_spread=0.1)
    model.save_pretrained(model_dir)
    return model_dir


def load_model(model_dir: Path, kind: str):
    """The transformers model of a directory built by build_model, in float32 and eval mode."""
    import transformers

    model_class = VARIANTS[kind][1]
    return getattr(transformers, model_class).from_pretrained(model_dir, dtype="float32").eval()


def hf_logits(model, token_ids: list[int]):
    import torch

    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()


# Falcon's remote-code configs (tiiuae/falcon-7b and -40b before transformers supported Falcon):
# the same weights, described with n_head / n_head_kv / n_layer and no new_decoder_architecture.
def rewrite_as_rw_config(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    old = {
        "architectures": ["RWForCausalLM"],
        "hidden_size": config["hidden_size"],
        "n_head": config["num_attention_heads"],
        "n_layer": config["num_hidden_layers"],
        "layer_norm_epsilon": config["layer_norm_epsilon"],
        "vocab_size": config["vocab_size"],
        "alibi": False,
        "bias": False,
        "parallel_attn": True,
        "bos_token_id": config.get("bos_token_id"),
        "eos_token_id": config.get("eos_token_id"),
    }
    if config["new_decoder_architecture"]:
        old.update(model_type="RefinedWeb", n_head_kv=config["num_kv_heads"])
    else:
        old.update(model_type="RefinedWebModel", multi_query=config["multi_query"])
    (model_dir / "config.json").write_text(json.dumps(old, indent=1))

