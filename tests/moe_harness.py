"""What the mixture-of-experts end-to-end tests share (tests/test_arch_moe.py,
tests/test_arch_deepseek.py): the tolerances of llama.cpp's logits against transformers', the
conversions cached per (model, layout, outtype), and the keys every comparison with llama.cpp's
converter lists as different.

Tolerances are in units of the logits' standard deviation. f16 and q8_0 bound the error of 90% of
the positions only: rounding the weights moves the router's scores slightly, and where two experts
are nearly tied for a token llama.cpp may pick the other one (transformers would too, given the
rounded weights), which changes that token's logits by up to half a standard deviation (measured
0.47 at f16), and through attention the later tokens' too. f32, where the routing is the same,
bounds every position. A wrong expert order or a swapped gate/up changes every position by whole
standard deviations, at every outtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from tests import family_models
from tests.family_models import relative_error

TOLERANCE = {"f32": 1e-3, "f16": 0.25, "q8_0": 0.6}
VOCAB = 600  # pieces of the tokenizers trained for the tiny models (plus their special tokens)

# Token ids ggufsmith writes that llama.cpp's converter leaves to llama.cpp's load-time search.
EOT_FIM_DIFFERENCES = {
    key: "written explicitly; llama.cpp finds the same id by its text at load time"
    for key in ("tokenizer.ggml.eot_token_id", *(f"tokenizer.ggml.fim_{kind}_token_id" for kind in ("pre", "suf", "mid", "pad", "rep", "sep")))
}


def conversions(models: Mapping[tuple[str, str], tuple], root: Path) -> Callable[[str, str, str], Path]:
    """get(kind, layout, outtype): the GGUF of models[kind, layout]'s folder at outtype, converted
    once (into root) however many tests ask for it."""
    get = family_models.conversions({f"{kind}-{layout}": model for (kind, layout), model in models.items()}, root)
    return lambda kind, layout, outtype: get(f"{kind}-{layout}", outtype)


def logits_error(got: np.ndarray, expected: np.ndarray, outtype: str) -> float:
    """f32: the largest error over the prompt; f16/q8_0: the 90th percentile of the per-position
    errors (see the module docstring), both in units of the expected logits' standard deviation."""
    if outtype == "f32":
        return relative_error(got, expected)
    return float(np.quantile([relative_error(g[None], e[None]) * e.std() / expected.std() for g, e in zip(got, expected)], 0.9))
