"""Tiny random-weight llama-family checkpoints built with transformers, for the llama tests.

Each variant is a config for transformers' own model class; weights are drawn from a fixed seed and
scaled so that logits over a prompt are far from uniform (transformers' default init of std 0.02
gives near-constant logits, which would make any comparison pass).
"""

from __future__ import annotations

from pathlib import Path

# name -> (transformers class, config fields). Shapes are small but keep every code path: GQA
# (4 heads, 2 kv heads), head_dim different from hidden/heads, experts, tied embeddings, rope scaling.
_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
VARIANTS: dict[str, tuple[str, dict]] = {
    "llama_gqa": ("LlamaForCausalLM", dict(_COMMON, rope_theta=10000.0)),
    "llama_tied": ("LlamaForCausalLM", dict(_COMMON, num_key_value_heads=4, tie_word_embeddings=True)),
    "llama_head_dim": ("LlamaForCausalLM", dict(_COMMON, head_dim=32, rope_theta=50000.0)),
    "llama_bias": ("LlamaForCausalLM", dict(_COMMON, attention_bias=True, mlp_bias=True)),
    "llama_rope_linear": ("LlamaForCausalLM", dict(_COMMON, rope_scaling=dict(rope_type="linear", factor=4.0))),
    "llama_rope_yarn": ("LlamaForCausalLM", dict(
        _COMMON, rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64))),
    # An explicit yarn attention_factor (transformers' default is 1 + 0.1 ln(factor)).
    "llama_rope_yarn_attn": ("LlamaForCausalLM", dict(_COMMON, rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=64, attention_factor=1.5))),
    "llama_rope_llama3": ("LlamaForCausalLM", dict(
        _COMMON, rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                        high_freq_factor=4.0, original_max_position_embeddings=64))),
    "mistral": ("MistralForCausalLM", dict(_COMMON, sliding_window=None, rope_theta=1e6)),
    "mixtral": ("MixtralForCausalLM", dict(_COMMON, num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6)),
}


def build_model(model_dir: Path, variant: str, vocab_size: int, seed: int = 0, **extra_config):
    """Save a random-weight model of `variant` to `model_dir` (safetensors) and return it (float32, eval)."""
    import torch
    import transformers

    class_name, fields = VARIANTS[variant]
    model_class = getattr(transformers, class_name)
    config = model_class.config_class(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, **fields, **extra_config)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomize_weights(model, seed)
    model.save_pretrained(model_dir)
    return model


def randomize_weights(model, seed: int) -> None:
    """Weights of std 1/sqrt(fan_in) (unit-scale activations), norms near 1, biases small."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))
            elif param.dim() == 1:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            else:
                std = 1.5 / param.shape[-1] ** 0.5
                param.copy_(std * torch.randn(param.shape, generator=generator))


def with_tokenizer(model_dir: Path, tokenizer_dir: Path) -> Path:
    """A model folder holding a copy of the tokenizer files (trained once by tests/tokenizer_helpers.py)."""
    import shutil

    model_dir.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, model_dir / f.name)
    return model_dir


def tokenizer_vocab_size(model_dir: Path) -> int:
    """The embedding rows the model needs: every id the HF tokenizer can produce."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model_dir))


def checkpoint_tensors(model_dir: Path):
    """The saved checkpoint's tensors, read by the safetensors library: name -> LazyTensor."""
    from safetensors.numpy import load_file

    from ggufsmith.readers.lazy_tensor import LazyTensor

    return {name: LazyTensor.from_array(array, source=name)
            for name, array in load_file(Path(model_dir) / "model.safetensors").items()}
