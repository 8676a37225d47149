"""Tiny random-weight models of any transformers family, and the comparison every plugin's
end-to-end test makes: llama.cpp's logits on our file against transformers' on the checkpoint.

The error is max |llama.cpp - transformers| over the prompt divided by the standard deviation of
transformers' logits (the measure the architecture issues state their tolerances in). Weights are
drawn with a larger spread than transformers' init (std 0.02 gives nearly uniform logits, which
would hide layout errors); norm weights around 1 with spread 0.2, so that a norm stored as an
offset from 1, or a missing norm, changes the result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PROMPT = "The quick brown fox, größere Äpfel, 我们今天去公园散步。 Привет! 12345 🦙 def f(x): return x ** 2"


def build_model(config_class: str, model_class: str, model_dir: Path, seed: int = 0, fused_experts: bool = False,
                **fields) -> Path:
    """Save a random `model_class` (a transformers class name) built from `config_class(**fields)`;
    with fused_experts, in the layout transformers 5 keeps in memory (experts stacked and gate_up
    fused: save_pretrained(save_original_format=False)) instead of one tensor per expert."""
    import torch
    import transformers

    config = getattr(transformers, config_class)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    randomize(model)
    model.save_pretrained(model_dir, save_original_format=not fused_experts)
    return model_dir


def randomize(model, norm_spread: float = 0.2) -> None:
    """Matrices N(0, 0.15), biases N(0, 0.1), norm weights and other vectors N(1, norm_spread),
    routers' selection biases (e_score_correction_bias, expert_bias) N(0, 0.1)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2:
                param.normal_(0.0, 0.15)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(1.0, norm_spread)
        # DeepSeek-style routers' selection bias is a buffer, zero at init: without a spread of its
        # own a file that dropped it would route the same.
        for name, buffer in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # DeepSeek's, LFM2-MoE's
                buffer.normal_(0.0, 0.1)


def hf_logits(model_dir: Path, model_class: str, token_ids: list[int]) -> np.ndarray:
    import torch
    import transformers

    model = getattr(transformers, model_class).from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()


def llamacpp_logits(gguf_path: Path, token_ids: list[int], lora_path: Path | None = None) -> np.ndarray:
    """llama.cpp's logits for every position, F32 KV cache, so that only the weights' type differs;
    with `lora_path`, the GGUF adapter applied at scale 1."""
    import llama_cpp

    adapter = {} if lora_path is None else dict(lora_path=str(lora_path), lora_scale=1.0)
    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=256, n_batch=256, logits_all=True, verbose=False,
                          type_k=0, type_v=0, **adapter)
    try:
        llm.eval(token_ids)
        return np.array(llm.scores[: len(token_ids)], dtype=np.float32)
    finally:
        llm.close()


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    """max |got - expected| in units of the expected logits' standard deviation."""
    return float(np.abs(got - expected).max() / expected.std())


def prompt_ids(model_dir: Path, prompt: str = PROMPT) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).encode(prompt, add_special_tokens=False)


def build_bpe_models(root: Path, specs, vocab_size: int) -> dict[str, Path]:
    """kind -> folder of the random-weight model specs[kind] = (config class, model class, config
    fields), with a Qwen2-style byte-level BPE tokenizer of `vocab_size` pieces trained for it."""
    from tests.tokenizer_helpers import train_bpe

    dirs = {}
    for kind, (config_class, model_class, fields) in specs.items():
        train_bpe(root / kind, "qwen2", vocab_size=vocab_size)
        dirs[kind] = build_model(config_class, model_class, root / kind, **fields)
    return dirs


def with_reference_logits(dirs: dict[str, Path], specs) -> dict[str, tuple[Path, list[int], np.ndarray]]:
    """kind -> (folder, the prompt's token ids, transformers' logits for them) for build_bpe_models' folders."""
    out = {}
    for kind, model_dir in dirs.items():
        ids = prompt_ids(model_dir)
        out[kind] = model_dir, ids, hf_logits(model_dir, specs[kind][1], ids)
    return out


def conversions(models, root: Path):
    """get(name, outtype): the GGUF of models[name]'s folder (its first item) at outtype, converted
    once (into root) however many tests ask for it."""
    import ggufsmith

    cache: dict[tuple[str, str], Path] = {}

    def get(name: str, outtype: str) -> Path:
        if (name, outtype) not in cache:
            cache[name, outtype] = root / f"{name}-{outtype}.gguf"
            ggufsmith.convert(models[name][0], cache[name, outtype], outtype=outtype)
        return cache[name, outtype]

    return get
