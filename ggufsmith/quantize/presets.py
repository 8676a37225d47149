"""llama-quantize's presets (Q4_K_M, Q3_K_S, ...): which tensor type each tensor of a model gets.

The rules reproduce llama.cpp's tensor type selection (src/llama-quant.cpp) for the presets whose
tensor types ggufsmith implements, so that our files have the same per-tensor types as
`llama-quantize`'s. The rules are stateful: some depend on the position of a tensor among its kind
(the i-th attn_v), so tensors must be visited in llama.cpp's order, given by `llama_tensor_order`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ggufsmith.constants import GGML_TYPE_LAYOUT, FileType, GGMLType
from ggufsmith.errors import QuantizationError

T = GGMLType


@dataclass(frozen=True)
class Preset:
    name: str
    file_type: FileType
    default_type: GGMLType


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("F32", FileType.ALL_F32, T.F32),
        Preset("F16", FileType.MOSTLY_F16, T.F16),
        Preset("BF16", FileType.MOSTLY_BF16, T.BF16),
        Preset("Q8_0", FileType.MOSTLY_Q8_0, T.Q8_0),
        Preset("Q4_0", FileType.MOSTLY_Q4_0, T.Q4_0),
        Preset("Q4_1", FileType.MOSTLY_Q4_1, T.Q4_1),
        Preset("Q5_0", FileType.MOSTLY_Q5_0, T.Q5_0),
        Preset("Q5_1", FileType.MOSTLY_Q5_1, T.Q5_1),
        Preset("Q2_K", FileType.MOSTLY_Q2_K, T.Q2_K),
        Preset("Q2_K_S", FileType.MOSTLY_Q2_K_S, T.Q2_K),
        Preset("Q3_K_S", FileType.MOSTLY_Q3_K_S, T.Q3_K),
        Preset("Q3_K_M", FileType.MOSTLY_Q3_K_M, T.Q3_K),
        Preset("Q3_K_L", FileType.MOSTLY_Q3_K_L, T.Q3_K),
        Preset("Q4_K_S", FileType.MOSTLY_Q4_K_S, T.Q4_K),
        Preset("Q4_K_M", FileType.MOSTLY_Q4_K_M, T.Q4_K),
        Preset("Q5_K_S", FileType.MOSTLY_Q5_K_S, T.Q5_K),
        Preset("Q5_K_M", FileType.MOSTLY_Q5_K_M, T.Q5_K),
        Preset("Q6_K", FileType.MOSTLY_Q6_K, T.Q6_K),
        Preset("IQ4_NL", FileType.MOSTLY_IQ4_NL, T.IQ4_NL),
        Preset("IQ4_XS", FileType.MOSTLY_IQ4_XS, T.IQ4_XS),
        Preset("TQ1_0", FileType.MOSTLY_TQ1_0, T.TQ1_0),
        Preset("TQ2_0", FileType.MOSTLY_TQ2_0, T.TQ2_0),
        Preset("Q1_0", FileType.MOSTLY_Q1_0, T.Q1_0),
        Preset("Q2_0", FileType.MOSTLY_Q2_0, T.Q2_0),
        Preset("IQ3_XXS", FileType.MOSTLY_IQ3_XXS, T.IQ3_XXS),
        Preset("IQ3_XS", FileType.MOSTLY_IQ3_XS, T.IQ3_S),
        Preset("IQ3_S", FileType.MOSTLY_IQ3_S, T.IQ3_S),
        Preset("IQ3_M", FileType.MOSTLY_IQ3_M, T.IQ3_S),
        Preset("IQ2_XXS", FileType.MOSTLY_IQ2_XXS, T.IQ2_XXS),
        Preset("IQ2_XS", FileType.MOSTLY_IQ2_XS, T.IQ2_XS),
        Preset("IQ2_S", FileType.MOSTLY_IQ2_S, T.IQ2_XS),
        Preset("IQ2_M", FileType.MOSTLY_IQ2_M, T.IQ2_S),
        Preset("IQ1_S", FileType.MOSTLY_IQ1_S, T.IQ1_S),
        Preset("IQ1_M", FileType.MOSTLY_IQ1_M, T.IQ1_M),
        Preset("MXFP4_MOE", FileType.MOSTLY_MXFP4_MOE, T.MXFP4),
    ]
}


def get_preset(name: str) -> Preset:
    preset = PRESETS.get(name.upper())
    if preset is None:
        raise QuantizationError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return preset


def is_block_quantized(ggml_type: GGMLType) -> bool:
    return ggml_type not in (T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64)


@dataclass(frozen=True)
class ModelFacts:
    """What the rules need to know about the model (from its GGUF metadata)."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        # llama.cpp's model-size detection, reduced to the one size the rules ask about.
        if self.arch == "llama":
            return self.n_layer == 80 and self.n_head != self.n_head_kv
        return self.arch in ("qwen2", "deci", "olmo") and self.n_layer == 80


@dataclass
class QuantizeOptions:
    """llama-quantize's options that influence tensor types."""

    preset: Preset
    pure: bool = False  # --pure: every quantizable tensor gets the preset's default type
    output_tensor_type: GGMLType | None = None  # --output-tensor-type
    token_embedding_type: GGMLType | None = None  # --token-embedding-type
    leave_output_tensor: bool = False  # --leave-output-tensor
    tensor_types: list[tuple[str, GGMLType]] = field(default_factory=list)  # --tensor-type REGEX=TYPE
    has_imatrix: bool = False


def llama_tensor_order(names: Iterable[str]) -> list[str]:
    """llama.cpp's order of a model's tensors: non-block tensors first, then by block number, then by name."""

    def key(name: str) -> tuple[int, str]:
        m = re.match(r"blk\.(\d+)\.", name)
        return (int(m.group(1)) if m else -1, name)

    return sorted(names, key=key)


# Name parts of tensors llama.cpp copies unquantized: norms, MoE routers, small conv/projection
# weights, relative position biases, multimodal embeddings.
_NEVER_QUANTIZED = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
    "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)


def allows_quantization(name: str, n_dims: int, options: QuantizeOptions) -> bool:
    """Whether llama.cpp quantizes this tensor at all (norms, routers, conv1d, ... are copied as they are)."""
    if n_dims < 2 or not name.endswith("weight"):
        return False
    if options.leave_output_tensor and name == "output.weight":
        return False
    if any(part in name for part in _NEVER_QUANTIZED):
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    # RWKV's small 2-D weights
    return not re.search(r"time_mix_(first|w[012]|v[012]|a[012]|g[12]|decay_w[12]|lerp_fused)\.weight", name)


# Types llama-quantize refuses to make (but for token_embd and output) without an importance matrix.
_NEED_IMATRIX = (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S)


def requires_importance(name: str, ggml_type: GGMLType, preset: Preset) -> bool:
    """llama.cpp refuses to make these without an importance matrix: the result would be garbage."""
    if _category(name) in ("token_embd", "output"):
        return False
    return ggml_type in _NEED_IMATRIX or (ggml_type == T.Q2_K and preset.name == "Q2_K_S")


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, category in (
        ("attn_qkv.weight", "attn_v"),  # fused qkv and the kv projection count as attn_v in llama.cpp
        ("attn_kv_b.weight", "attn_v"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if part in name:
            return category
    return "other"


def _is_expert_stack(shape: Sequence[int], category: str, arch: str) -> bool:
    """Whether MXFP4_MOE makes this tensor MXFP4: llama.cpp's test is a third dimension (ne[2],
    numpy's shape[-3]) above 1, i.e. a stack of expert matrices. bailingmoe3's MLA projections
    are 3-D too, so for it only the feed-forward stacks count."""
    if len(shape) < 3 or int(shape[-3]) <= 1:
        return False
    return arch != "bailingmoe3" or category in ("ffn_up", "ffn_gate", "ffn_down")


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


# llama.cpp's fallbacks for types whose blocks of 256 do not fit a row; a type of blocks of 32 or
# less stays as it is (and becomes F16 below if even that does not fit).
_FALLBACKS = {
    T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
    T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0, T.Q2_0: T.Q4_0,
    T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL,
    T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL,
}


def _fallback(row_length: int, ggml_type: GGMLType) -> GGMLType:
    """A type whose block fits the row length, as llama.cpp falls back (K-quants need rows of 256)."""
    if row_length % GGML_TYPE_LAYOUT[ggml_type].block_size == 0:
        return ggml_type
    fallback = _FALLBACKS.get(ggml_type)
    if fallback is None:
        if GGML_TYPE_LAYOUT[ggml_type].block_size > 32:  # llama.cpp throws too
            raise QuantizationError(
                f"no fallback type for {ggml_type.name} on rows of {row_length} values (not a multiple of "
                f"{GGML_TYPE_LAYOUT[ggml_type].block_size}); choose another type for this tensor with --tensor-type"
            )
        fallback = ggml_type
    if row_length % GGML_TYPE_LAYOUT[fallback].block_size:
        return T.F16
    return fallback


# The presets below 2.5 bits per weight, which share one set of rules in llama.cpp.
_LOWEST_BIT = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M")
_ATTN_OUTPUT_Q5_K_WITH_8_EXPERTS = (
    "Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS",
)


class TypeChooser:
    """Picks each tensor's type. Call `choose` for every tensor in `llama_tensor_order`."""

    def __init__(self, options: QuantizeOptions, facts: ModelFacts, tensor_names: Sequence[str]) -> None:
        self.options = options
        self.facts = facts
        self.ftype = options.preset.name
        self.tied_embeddings = "output.weight" not in tensor_names
        self.n_attention_wv = sum(_category(n) == "attn_v" for n in tensor_names)
        self.i_attention_wv = 0
        self.i_ffn_down = 0
        self.i_ffn_gate = 0
        self.i_ffn_up = 0
        self.patterns = [(re.compile(p), t) for p, t in options.tensor_types]
        self.n_fallback = 0

    def choose(self, name: str, shape: Sequence[int], current_type: GGMLType) -> GGMLType:
        """The type of tensor `name` (shape in numpy order, rows last) currently of `current_type`."""
        opts = self.options
        if not allows_quantization(name, len(shape), opts):
            return current_type
        category = _category(name)
        if opts.token_embedding_type is not None and category == "token_embd":
            return opts.token_embedding_type
        if opts.output_tensor_type is not None and category == "output":
            return opts.output_tensor_type
        new_type = opts.preset.default_type
        if not is_block_quantized(new_type):
            return new_type
        manual = next((t for regex, t in self.patterns if regex.search(name)), None)
        if manual is not None:
            new_type = manual
        elif not opts.pure:
            new_type = self._mixture_rule(name, shape, new_type, category)
        chosen = _fallback(int(shape[-1]), new_type)
        self.n_fallback += chosen != new_type
        return chosen

    def _mixture_rule(self, name: str, shape: Sequence[int], new_type: GGMLType, category: str) -> GGMLType:
        f, ftype = self.facts, self.ftype
        falcon = f.arch == "falcon"
        if category == "output" or (self.tied_embeddings and category == "token_embd"):
            if self.options.output_tensor_type is not None:
                return self.options.output_tensor_type
            if falcon or ftype == "MXFP4_MOE" or int(shape[-1]) % GGML_TYPE_LAYOUT[new_type].block_size:
                return T.Q8_0
            if ftype in _LOWEST_BIT or ftype == "IQ3_XXS":
                return T.Q5_K
            return new_type if new_type == T.Q8_0 else T.Q6_K
        if ftype == "MXFP4_MOE":
            return T.MXFP4 if _is_expert_stack(shape, category, f.arch) else T.Q8_0
        if category == "token_embd":
            if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                return T.Q2_K
            if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
                return T.IQ3_S
            return T.Q4_K if ftype in ("TQ1_0", "TQ2_0", "Q2_0") else new_type
        if ftype in _LOWEST_BIT:
            return self._lowest_bit_rule(name, category, new_type)
        if category == "attn_v":
            i, n = self.i_attention_wv, self.n_attention_wv
            self.i_attention_wv += 1
            if ftype == "Q2_K":
                new_type = T.Q4_K if f.n_gqa >= 4 else T.Q3_K
            elif ftype == "Q2_K_S" and f.n_gqa >= 4:
                new_type = T.Q4_K
            elif ftype == "IQ3_XXS":
                new_type = T.Q4_K if f.n_gqa >= 4 else T.IQ3_XXS if self.options.has_imatrix else T.IQ3_S
            elif ftype in ("IQ3_XS", "IQ3_S") and f.n_gqa >= 4:
                new_type = T.Q4_K
            elif ftype == "IQ3_M":
                new_type = T.Q4_K
            elif ftype == "Q3_K_M":
                new_type = T.Q5_K if i < 2 else T.Q4_K
            elif ftype == "Q3_K_L":
                new_type = T.Q5_K
            elif ftype in ("IQ4_NL", "IQ4_XS") and f.n_gqa >= 4:
                new_type = T.Q5_K
            elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
                new_type = T.Q6_K
            elif ftype == "Q4_K_S" and i < 4:
                new_type = T.Q5_K
            if f.is_70b and new_type in (T.Q3_K, T.Q4_K):
                new_type = T.Q5_K  # 8 heads share attn_v in 70B models: more bits cost little
            if f.n_expert == 8:
                new_type = T.Q8_0
            return new_type
        if category == "attn_k":
            if f.n_expert == 8:
                return T.Q8_0
            return {"IQ3_XS": T.IQ3_XXS, "IQ3_XXS": T.IQ2_S}.get(ftype, new_type)
        if category == "attn_q":
            return {"IQ3_XS": T.IQ3_XXS, "IQ3_XXS": T.IQ2_S}.get(ftype, new_type)
        if category == "ffn_down":
            i, n = self._layer_of(name, self.i_ffn_down)
            self.i_ffn_down += 1
            if ftype == "Q2_K":
                return T.Q3_K
            if ftype == "Q2_K_S":
                return T.Q4_K if i < n // 8 else new_type
            if ftype == "IQ3_XXS" and not self.options.has_imatrix:
                return T.Q4_K if i < n // 8 else T.Q3_K
            if ftype == "Q3_K_M":
                if i < n // 16:
                    return T.Q5_K
                return T.Q4_K if not falcon or _use_more_bits(i, n) else T.Q3_K
            if ftype == "IQ3_M" and (i < n // 8 or (f.n_expert == 8 and _use_more_bits(i, n))):
                return T.Q4_K
            if ftype == "Q3_K_L":
                return T.Q4_K if falcon else T.Q5_K
            if ftype == "Q4_K_M":
                if falcon:
                    return T.Q6_K if i < n // 16 else T.Q5_K if _use_more_bits(i, n) else T.Q4_K
                return T.Q6_K if _use_more_bits(i, n) else new_type
            if ftype in ("IQ4_NL", "IQ4_XS") and not self.options.has_imatrix and i < n // 8:
                return T.Q5_K
            if ftype == "Q5_K_M" and _use_more_bits(i, n):
                return T.Q6_K
            if ftype == "Q4_K_S" and not falcon and i < n // 8:
                return T.Q5_K
            if ftype in ("Q4_0", "Q5_0") and self.options.has_imatrix and i < n // 8:
                return T.Q4_1 if ftype == "Q4_0" else T.Q5_1
            return new_type
        if category == "attn_output":
            if falcon:
                return T.Q4_K if ftype == "Q3_K_L" else new_type
            if f.n_expert == 8:
                return T.Q5_K if ftype in _ATTN_OUTPUT_Q5_K_WITH_8_EXPERTS else new_type
            return {"Q2_K": T.Q3_K, "IQ3_XXS": T.IQ3_S, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K, "IQ3_M": T.Q4_K}.get(ftype, new_type)
        if category in ("ffn_gate", "ffn_up"):
            counter = "i_" + category
            i, n = self._layer_of(name, getattr(self, counter))
            setattr(self, counter, getattr(self, counter) + 1)
            if ftype == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
                return T.IQ3_XXS
        return new_type

    def _lowest_bit_rule(self, name: str, category: str, new_type: GGMLType) -> GGMLType:
        """llama.cpp's rules for IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ1_S and IQ1_M."""
        f, ftype = self.facts, self.ftype
        iq2_s = ftype in ("IQ2_S", "IQ2_M")
        if category == "attn_v":
            self.i_attention_wv += 1
            if f.n_gqa >= 4 or f.n_expert >= 4:
                return T.Q4_K
            return T.IQ3_S if iq2_s else T.Q2_K
        if category == "attn_k" and f.n_expert == 8:
            return T.Q4_K
        if category == "ffn_down":
            i = self.i_ffn_down
            self.i_ffn_down += 1
            # llama.cpp compares the count of ffn_down tensors so far with the model's block count
            # (not the number of ffn_down tensors: two per block with shared experts, fewer after
            # --prune-layers)
            if i < self.facts.n_layer // 8:
                return T.IQ3_S if iq2_s else T.Q2_K
            return new_type
        if category == "attn_output":
            if f.n_expert == 8:
                return T.Q5_K
            if ftype in ("IQ1_S", "IQ1_M"):
                return T.IQ2_XXS
            return T.IQ3_S if iq2_s else new_type
        return new_type

    def _layer_of(self, name: str, counter: int) -> tuple[int, int]:
        """(layer index, layer count) of an ffn tensor: by position, or by name in MoE models,
        whose expert tensors are not in layer order."""
        n_layer = self.facts.n_layer
        if max(1, self.facts.n_expert) > 1:
            m = re.match(r"blk\.(\d+)\.", name)
            if not m or not 0 <= int(m.group(1)) < n_layer:
                raise QuantizationError(f"cannot tell the layer of tensor {name} (the model has {n_layer} blocks)")
            return int(m.group(1)), n_layer
        return counter, n_layer
