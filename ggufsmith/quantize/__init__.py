"""Quantization to and from every GGML type ggufsmith supports, in vectorized numpy.

Importing this package registers every family module with the registry; the rest of ggufsmith
calls `quantize`, `dequantize` and `get_format` and never keeps a table of its own.
"""

from ggufsmith.quantize.registry import (
    QuantFormat,
    dequantize,
    get_format,
    quantize,
    register,
    supported_types,
)

# One module per quant family; each registers its types on import.
from ggufsmith.quantize import float_types  # noqa: E402,F401  F32, F16, BF16
from ggufsmith.quantize import legacy_symmetric  # noqa: E402,F401  Q8_0, Q4_0, Q5_0
from ggufsmith.quantize import k_symmetric  # noqa: E402,F401  Q3_K, Q6_K
from ggufsmith.quantize import legacy_affine  # noqa: E402,F401  Q4_1, Q5_1
from ggufsmith.quantize import k_affine  # noqa: E402,F401  Q2_K, Q4_K, Q5_K
from ggufsmith.quantize import ternary  # noqa: E402,F401  TQ1_0, TQ2_0
from ggufsmith.quantize import low_bit  # noqa: E402,F401  Q1_0, Q2_0
from ggufsmith.quantize import iq_nonlinear  # noqa: E402,F401  IQ4_NL, IQ4_XS
from ggufsmith.quantize import iq3  # noqa: E402,F401  IQ3_XXS, IQ3_S
from ggufsmith.quantize import iq2  # noqa: E402,F401  IQ2_XXS, IQ2_XS, IQ2_S
from ggufsmith.quantize import iq1  # noqa: E402,F401  IQ1_S, IQ1_M
from ggufsmith.quantize import mxfp4  # noqa: E402,F401  MXFP4

__all__ = ["QuantFormat", "dequantize", "get_format", "quantize", "register", "supported_types"]
