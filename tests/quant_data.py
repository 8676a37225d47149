"""Float32 rows that exercise every branch of ggml's quantizers, for the quantizer tests.

Each generator returns float32[n_rows, row_length] from a seeded numpy Generator, so a failure is
reproducible from the test's parameters alone. `block_size` lets the generators place special
blocks (all zero, constant, one spike) exactly on block boundaries of the type under test.
`quant_cases` bundles them; `model_weight_rows` gives weights of a real (randomly initialised)
transformers Llama model, the distribution the converter actually meets.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np


def normal_rows(rng: np.random.Generator, n_rows: int, row_length: int) -> np.ndarray:
    return rng.standard_normal((n_rows, row_length), dtype=np.float32)


def heavy_tailed_rows(rng: np.random.Generator, n_rows: int, row_length: int) -> np.ndarray:
    # Student-t with 2 degrees of freedom: rare values far larger than the rest of their block.
    return rng.standard_t(2.0, (n_rows, row_length)).astype(np.float32)


def outlier_rows(rng: np.random.Generator, n_rows: int, row_length: int) -> np.ndarray:
    rows = rng.standard_normal((n_rows, row_length), dtype=np.float32) * np.float32(0.02)
    spikes = rng.random((n_rows, row_length)) < 0.005
    rows[spikes] = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), spikes.sum()) * np.float32(3.0)
    return rows


def block_scaled_rows(rng: np.random.Generator, n_rows: int, row_length: int, block_size: int) -> np.ndarray:
    """Every block at its own magnitude, 1e-6 .. 1e4, as in layers with very different scales."""
    rows = rng.standard_normal((n_rows, row_length), dtype=np.float32)
    scales = np.exp(rng.uniform(np.log(1e-6), np.log(1e4), (n_rows, row_length // block_size, 1)))
    return (rows.reshape(n_rows, -1, block_size) * scales.astype(np.float32)).reshape(n_rows, row_length)


def special_block_rows(rng: np.random.Generator, n_rows: int, row_length: int, block_size: int) -> np.ndarray:
    """Blocks that hit the degenerate branches: all zero, -0.0, constant, a single non-zero value,
    two values tied for the largest magnitude with opposite signs, and values on rounding ties."""
    n_blocks = row_length // block_size
    blocks = rng.standard_normal((n_rows, n_blocks, block_size), dtype=np.float32)
    kind = rng.integers(0, 8, (n_rows, n_blocks))
    blocks[kind == 0] = 0.0
    blocks[kind == 1] = -0.0
    blocks[kind == 2] = rng.standard_normal((int((kind == 2).sum()), 1), dtype=np.float32)
    for r, b in np.argwhere(kind == 3):
        blocks[r, b] = 0.0
        blocks[r, b, rng.integers(block_size)] = rng.standard_normal(dtype=np.float32)
    for r, b in np.argwhere(kind == 4):
        i, j = rng.choice(block_size, 2, replace=False)
        blocks[r, b, i], blocks[r, b, j] = 2.0, -2.0
    # Small integers and halves times a power of two: products land exactly on .5 rounding ties.
    halves = rng.integers(-16, 17, (int((kind == 5).sum()), block_size)).astype(np.float32) / np.float32(2)
    blocks[kind == 5] = halves * np.float32(2.0 ** rng.integers(-4, 5))
    # Mostly zero with a few values, as in pruned or sparse weights.
    sparse = kind == 6
    blocks[sparse] *= (rng.random((int(sparse.sum()), block_size)) < 0.1).astype(np.float32)
    return blocks.reshape(n_rows, row_length)


def tiny_rows(rng: np.random.Generator, n_rows: int, row_length: int) -> np.ndarray:
    """Magnitudes from 1e-45 (float32 subnormals) up to 1e-10, where scales underflow in float16."""
    exponents = rng.uniform(-45, -10, (n_rows, 1)).astype(np.float64)
    rows = rng.standard_normal((n_rows, row_length)) * 10.0**exponents
    return rows.astype(np.float32)


def huge_rows(rng: np.random.Generator, n_rows: int, row_length: int) -> np.ndarray:
    """Magnitudes from 1e4 up to 1e37, where scales overflow float16 and squares overflow float32."""
    exponents = rng.uniform(4, 37, (n_rows, 1))
    return (rng.standard_normal((n_rows, row_length)) * 10.0**exponents).astype(np.float32)


def quant_cases(rng: np.random.Generator, n_rows: int, row_length: int, block_size: int) -> Iterator[tuple[str, np.ndarray]]:
    """(name, rows) for each distribution above, n_rows rows each."""
    yield "normal", normal_rows(rng, n_rows, row_length)
    yield "heavy_tailed", heavy_tailed_rows(rng, n_rows, row_length)
    yield "outliers", outlier_rows(rng, n_rows, row_length)
    yield "block_scaled", block_scaled_rows(rng, n_rows, row_length, block_size)
    yield "special_blocks", special_block_rows(rng, n_rows, row_length, block_size)
    yield "tiny", tiny_rows(rng, n_rows, row_length)
    yield "huge", huge_rows(rng, n_rows, row_length)


def importance_vectors(rng: np.random.Generator, row_length: int) -> Iterator[tuple[str, np.ndarray]]:
    """llama.cpp imatrix-like weights per column: positive, heavy-tailed, and with exact zeros."""
    yield "uniform", rng.uniform(0.1, 2.0, row_length).astype(np.float32)
    yield "lognormal", rng.lognormal(0.0, 2.0, row_length).astype(np.float32)
    with_zeros = rng.exponential(1.0, row_length).astype(np.float32)
    with_zeros[rng.random(row_length) < 0.3] = 0.0
    yield "with_zeros", with_zeros


@lru_cache(maxsize=1)
def _llama_weights() -> tuple[np.ndarray, ...]:
    torch = __import__("pytest").importorskip("torch")
    transformers = __import__("pytest").importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        # Random init gives every linear layer the same std; real checkpoints do not. Spread them.
        for i, param in enumerate(model.parameters()):
            param.mul_(1.5 ** (i % 7 - 3))
    return tuple(p.detach().float().numpy().reshape(-1) for p in model.parameters() if p.ndim == 2)


def model_weight_rows(row_length: int, max_rows: int | None = None) -> np.ndarray:
    """Rows of `row_length` cut from the 2-D weights of a small random LlamaForCausalLM."""
    flat = np.concatenate(_llama_weights())
    n_rows = flat.size // row_length
    if max_rows is not None:
        n_rows = min(n_rows, max_rows)
    return np.ascontiguousarray(flat[: n_rows * row_length].reshape(n_rows, row_length), dtype=np.float32)
