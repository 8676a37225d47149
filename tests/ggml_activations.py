"""Activations as ggml's CPU backend computes them, to patch into a transformers model so that a
test can tell the error our conversion makes from the error llama.cpp's kernels make.

ggml evaluates GELU through a table of 65,536 float16 values (`GGML_GELU_FP16` in ggml-cpu/vec.h,
on by default): the input is rounded to float16, the table holds the tanh form of GELU of each
float16 rounded to float16, and inputs beyond +-10 bypass it. That rounds the activation to 11
bits, which by itself moves a BERT embedding by about 1e-3 of its std; with the same rounding on the
transformers side, what is left is float32 summation order.
"""

from __future__ import annotations

import math


def ggml_gelu(x):
    """ggml_vec_gelu_f32 with the float16 table, for a torch float32 tensor."""
    import torch

    h = x.to(torch.float16).to(torch.float32)
    tanh_gelu = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * h * (1.0 + 0.044715 * h * h)))
    table = tanh_gelu.to(torch.float16).to(torch.float32)
    return torch.where(x <= -10.0, torch.zeros_like(x), torch.where(x >= 10.0, x, table))


def use_ggml_gelu(model, attribute: str = "intermediate_act_fn") -> int:
    """Replace the GELU that every MLP block of `model` keeps as `attribute` (BERT's intermediate
    blocks: intermediate_act_fn; DistilBERT's FFN: activation; ModernBERT's MLP and T5's gated
    feed-forward: act; Gemma's MLP: act_fn) by ggml's; returns how
    many were replaced (a test asserts it is not zero, so a renamed attribute cannot pass silently)."""
    import torch

    class GgmlGelu(torch.nn.Module):
        def forward(self, x):
            return ggml_gelu(x)

    blocks = [module for module in model.modules()
              if type(module).__name__.endswith(("MLP", "Intermediate", "FFN", "DenseGatedActDense"))
              and hasattr(module, attribute)]
    for module in blocks:
        setattr(module, attribute, GgmlGelu())
    return len(blocks)
