"""A PEFT LoRA adapter folder: adapter_config.json and its low-rank factors, as lazy tensors.

PEFT saves, for each adapted module of the base model (`model.layers.0.self_attn.q_proj`), the
two factors of the weight's update, under the base model's name prefixed by `base_model.model.`:
  - a linear layer: `<module>.lora_A.weight` (r, in) and `<module>.lora_B.weight` (out, r); the
    update of the module's weight (out, in) is scale * B @ A;
  - an embedding: `<module>.lora_embedding_A` (r, vocab) and `<module>.lora_embedding_B` (dim, r);
    the update of the embedding matrix (vocab, dim) is scale * (B @ A)^T,
  - a parameter adapted directly (`target_parameters`, PEFT's ParamWrapper: transformers 5's fused
    MoE experts, `mlp.experts.gate_up_proj` (E, out, in)): `<module>.lora_A.weight` (E * r, in),
    the experts' A one after the other, and `<module>.lora_B.weight` (out, r * E), whose columns
    are rank-major (column k * E + e is expert e's k-th); expert e's update is scale * B_e @ A_e.
    Several parameters of one module are nested wrappers, saved under `<module>.base_layer.` once
    per level: the innermost is the parameter the module registers first (see _wrapped_parameter);
with scale = alpha / r, or alpha / sqrt(r) with use_rslora; alpha and r may differ per module
(alpha_pattern, rank_pattern; for a parameter, matched against `<module>.<parameter>`). Beside them
PEFT may save the embedding's own weight (`<module>.base_layer.weight`, a copy of the base
model's), which is left out.

What the adapter holds is checked here; whether llama.cpp can apply it is converters/lora.py's
question. Adapters that change more than low-rank updates of weights (DoRA's magnitudes, full
weights of `modules_to_save`, trained biases, layer norms) are refused in one line: llama.cpp
would load them without that part, and compute something else than the adapter does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ggufsmith.errors import ConversionError
from ggufsmith.readers.jsonfile import read_json, shown
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.safetensors import SafetensorsFile

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_BIN = "adapter_model.bin"
_PREFIX = "base_model.model."

# Suffixes of the factors PEFT saves: (which factor, whether the module is an embedding).
_FACTORS = {
    ".lora_A.weight": ("A", False),
    ".lora_B.weight": ("B", False),
    ".lora_embedding_A": ("A", True),
    ".lora_embedding_B": ("B", True),
}
_BASE_LAYER_COPY = ".base_layer.weight"

# adapter_config.json settings whose effect llama.cpp has no way to apply: key -> why.
_REFUSED_SETTINGS = {
    "use_dora": "DoRA rescales each weight's columns by trained magnitudes, which llama.cpp's LoRA cannot do",
    "modules_to_save": "it holds whole trained copies of modules, which llama.cpp's LoRA cannot load",
    "lora_bias": "it trains a bias for lora_B, which llama.cpp's LoRA cannot apply",
    "fan_in_fan_out": "it adapts GPT-2-style Conv1D weights, not supported by ggufsmith's converter yet",
    "alora_invocation_tokens": "activated LoRA (aLoRA) is not supported by ggufsmith's converter yet",
    "use_qalora": "QA-LoRA pools the inputs of its factors, which llama.cpp's LoRA cannot do",
    "layer_replication": "it duplicates layers of the base model, which llama.cpp's LoRA cannot do",
}

# init_lora_weights that subtract the adapter's initial factors from the base weights (PiSSA, OLoRA,
# CorDA): such an adapter applies to that changed base only.
_BASE_CHANGING_INITS = ("pissa", "olora", "corda")

# A ParamWrapper nested inside another is saved under its module's name + ".base_layer".
_WRAPPED = ".base_layer"
# The order in which transformers' expert modules register their stacked parameters, which is the
# order PEFT nests its wrappers in (it wraps a module's parameters as named_parameters lists them).
_PARAMETER_ORDER = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraPair:
    """The two factors of one adapted module's update, as PEFT stores them."""

    weight_name: str  # the base model's weight it updates: "model.layers.0.self_attn.q_proj.weight"
    a: LazyTensor  # (r, in) for a linear layer, (r, vocab) for an embedding, (E, r, in) for stacked experts
    b: LazyTensor  # (out, r) for a linear layer, (dim, r) for an embedding, (E, out, r) for stacked experts
    embedding: bool
    a_name: str  # names in the adapter file, for messages
    b_name: str

    @property
    def rank(self) -> int:
        return self.a.shape[-2]

    @property
    def module(self) -> str:
        """The module's name in the base model, as PEFT's rank/alpha patterns match it."""
        return self.weight_name.removesuffix(".weight")


def pattern_value(patterns: dict[str, Any], name: str, default: Any) -> Any:
    """The value of the first of PEFT's alpha_pattern / rank_pattern entries that matches the end of
    a module's (or parameter's) name, as peft.utils.other.get_pattern_key picks it; else `default`."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", name):
            return value
    return default


@dataclass
class PeftAdapter:
    """An opened adapter folder. Close it (or use `with`) to release the file map."""

    folder: Path
    config: dict[str, Any]
    pairs: list[LoraPair]
    files: list[Path]
    _open_files: list[SafetensorsFile] = field(default_factory=list, repr=False)

    @property
    def config_path(self) -> Path:
        return self.folder / ADAPTER_CONFIG

    def scale(self, pair: LoraPair) -> float:
        """The factor PEFT multiplies this module's B @ A by: alpha / r, or alpha / sqrt(r) (rsLoRA),
        with the module's own alpha from alpha_pattern."""
        alpha = self.alpha(pair)
        return alpha / math.sqrt(pair.rank) if self.config.get("use_rslora") else alpha / pair.rank

    def alpha(self, pair: LoraPair | None = None) -> float:
        """lora_alpha, or the alpha_pattern entry PEFT picks for the pair's module (the first pattern
        that matches the end of its name, as peft.utils.other.get_pattern_key)."""
        if pair is None:
            return float(self.config["lora_alpha"])
        return float(pattern_value(self.config.get("alpha_pattern", {}), pair.module, self.config["lora_alpha"]))

    def close(self) -> None:
        for f in self._open_files:
            f.close()
        self._open_files.clear()

    def __enter__(self) -> PeftAdapter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_adapter(folder: str | Path) -> PeftAdapter:
    folder = Path(folder)
    if not folder.is_dir():
        raise ConversionError(f"{folder} is not a directory; give the folder of a PEFT adapter "
                              f"({ADAPTER_CONFIG} and {ADAPTER_SAFETENSORS})")
    config_path = folder / ADAPTER_CONFIG
    if not config_path.is_file():
        raise ConversionError(f"{config_path} not found; a PEFT adapter folder has {ADAPTER_CONFIG} beside "
                              f"{ADAPTER_SAFETENSORS}")
    config = _checked_config(config_path, read_json(config_path))
    adapter = PeftAdapter(folder, config, [], [])
    try:
        if (folder / ADAPTER_SAFETENSORS).is_file():
            path = folder / ADAPTER_SAFETENSORS
            st = SafetensorsFile(path)
            adapter._open_files.append(st)
            tensors = dict(sorted(st.tensors.items()))
        elif (folder / ADAPTER_BIN).is_file():
            from ggufsmith.readers.torch_bin import read_torch_bin

            path = folder / ADAPTER_BIN
            tensors = read_torch_bin(path)
        else:
            raise ConversionError(f"{folder}: no weights found; expected {ADAPTER_SAFETENSORS} or {ADAPTER_BIN}")
        adapter.files = [config_path, path]
        adapter.pairs = _pairs(path, tensors, config)
    except BaseException:
        adapter.close()
        raise
    return adapter


def _checked_config(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    def refuse(key: str, why: str) -> ConversionError:
        return ConversionError(f"{path}: {key} is {shown(config[key])}: {why}")

    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise ConversionError(f"{path}: peft_type is {shown(peft_type)}; only LORA adapters convert to GGUF")
    for key, why in _REFUSED_SETTINGS.items():
        if config.get(key) not in (None, False, [], {}, ""):
            raise refuse(key, why)
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.startswith(_BASE_CHANGING_INITS):
        raise refuse("init_lora_weights", "the adapter works on a base model PEFT changed when it made the adapter, "
                     "not on the published one; convert it to a plain LoRA first (PEFT save_pretrained with "
                     "path_initial_model_for_weight_conversion)")
    if config.get("bias", "none") != "none":
        raise refuse("bias", "it trains the base model's biases, which llama.cpp's LoRA cannot apply")
    alpha = config.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ConversionError(f"{path}: lora_alpha is {shown(alpha)}; expected a number")
    if alpha == 0:  # llama.cpp reads alpha 0 as "no alpha" and applies the adapter at full scale
        raise refuse("lora_alpha", "the adapter changes nothing (its scale is 0)")
    for key in ("alpha_pattern", "rank_pattern"):
        pattern = config.get(key) or {}
        if not isinstance(pattern, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    for v in pattern.values()):
            raise ConversionError(f"{path}: {key} is {shown(pattern)}; expected an object of module pattern -> number")
        if key == "alpha_pattern" and any(v == 0 for v in pattern.values()):
            raise refuse(key, "a module's alpha is 0 (llama.cpp reads 0 as no alpha)")
        config[key] = pattern
    return config


def _pairs(path: Path, tensors: dict[str, LazyTensor], config: dict[str, Any]) -> list[LoraPair]:
    """The adapter's tensors paired by module, each checked: two factors of matching rank."""
    halves: dict[str, dict[str, tuple[str, LazyTensor]]] = {}
    embedding_of: dict[str, bool] = {}
    wrapped: set[str] = set()  # the parameters adapted through ParamWrapper (target_parameters)
    for name, tensor in tensors.items():
        if name.endswith(_BASE_LAYER_COPY):
            continue  # the base model's own embedding, saved beside its factors
        suffix = next((s for s in _FACTORS if name.endswith(s)), None)
        if suffix is None or not name.startswith(_PREFIX):
            raise ConversionError(
                f"{path}: tensor {name} is not a LoRA factor (lora_A / lora_B); the adapter carries trained "
                "weights of its own (modules_to_save, biases, norms), which llama.cpp's LoRA cannot apply"
            )
        factor, embedding = _FACTORS[suffix]
        module = name[len(_PREFIX):-len(suffix)]
        weight_name = module + ".weight"
        parameter = _wrapped_parameter(path, name, module, config)
        if parameter is not None:
            weight_name = parameter
            wrapped.add(parameter)
        if len(tensor.shape) != 2:
            raise ConversionError(f"{path}: tensor {name} has shape {list(tensor.shape)}; LoRA factors of a "
                                  "linear or embedding layer are matrices (convolution adapters are not supported)")
        halves.setdefault(weight_name, {})[factor] = (name, tensor)
        embedding_of[weight_name] = embedding
    pairs = []
    for weight_name, factors in halves.items():
        if set(factors) != {"A", "B"}:
            have, lacking = ("A", "B") if "A" in factors else ("B", "A")
            raise ConversionError(f"{path}: tensor {factors[have][0]} has no lora_{lacking} beside it; "
                                  "the adapter file is incomplete")
        (a_name, a), (b_name, b) = factors["A"], factors["B"]
        if a.shape[0] != b.shape[1]:
            raise ConversionError(f"{path}: {a_name} has rank {a.shape[0]} (shape {list(a.shape)}) but {b_name} "
                                  f"has rank {b.shape[1]} (shape {list(b.shape)}); the adapter is damaged")
        if weight_name in wrapped:
            a, b = _unflattened_experts(path, config, weight_name, (a_name, a), (b_name, b))
            if a.shape[-2] != b.shape[-1]:
                raise ConversionError(f"{path}: {a_name} has rank {a.shape[-2]} but {b_name} has rank {b.shape[-1]}; "
                                      "the adapter is damaged")
        pairs.append(LoraPair(weight_name, a, b, embedding_of[weight_name], a_name, b_name))
    if not pairs:
        raise ConversionError(f"{path}: holds no LoRA factors (lora_A / lora_B tensors)")
    return pairs


def _wrapped_parameter(path: Path, name: str, module: str, config: dict[str, Any]) -> str | None:
    """For a factor of a parameter adapted through target_parameters, the parameter's full name
    (`model.layers.0.mlp.experts.gate_up_proj`); None for a module adapted as a layer.

    PEFT nests one wrapper per targeted parameter of a module, in the order the module registers
    them, the first innermost: the file says how deep (`.base_layer` repeated), and the parameters
    a module has are those of target_parameters whose module part ends its name."""
    depth = 0
    while module.endswith(_WRAPPED):
        module = module.removesuffix(_WRAPPED)
        depth += 1
    targets = config.get("target_parameters") or []
    if isinstance(targets, str):
        targets = [targets]
    candidates = []
    for target in sorted(set(targets)):
        owner, _, parameter = str(target).rpartition(".")
        if (not owner or module == owner or module.endswith("." + owner)) and parameter not in candidates:
            candidates.append(parameter)
    if not candidates:
        if depth:
            raise ConversionError(f"{path}: tensor {name} adapts a wrapped parameter, but the adapter config's "
                                  "target_parameters names none of this module's")
        return None
    if len(candidates) > 1:
        unknown = [c for c in candidates if c not in _PARAMETER_ORDER]
        if unknown:
            raise ConversionError(
                f"{path}: tensor {name}: the module {module} has several adapted parameters "
                f"({', '.join(candidates)}) and the order PEFT nested them in is not known for {unknown[0]}; "
                "merge the adapter into the base model (PEFT merge_and_unload) and convert that")
        candidates.sort(key=_PARAMETER_ORDER.index)
    if depth >= len(candidates):
        raise ConversionError(f"{path}: tensor {name} is nested {depth + 1} wrappers deep, but target_parameters "
                              f"names {len(candidates)} parameter(s) of {module}; the adapter does not match its "
                              "config")
    return f"{module}.{candidates[len(candidates) - 1 - depth]}"


def _unflattened_experts(path: Path, config: dict[str, Any], parameter: str, a: tuple[str, LazyTensor],
                         b: tuple[str, LazyTensor]) -> tuple[LazyTensor, LazyTensor]:
    """A ParamWrapper's A (E * r, in) and B (out, r * E) as stacks of per-expert factors,
    (E, r, in) and (E, out, r); a 2-D parameter (E = 1) keeps its factors as a linear layer's.
    r is the adapter's for this parameter (rank_pattern, else r)."""
    (a_name, a_tensor), (b_name, b_tensor) = a, b
    rank = pattern_value(config.get("rank_pattern", {}), parameter, config.get("r", 8))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConversionError(f"{path.parent / ADAPTER_CONFIG}: the rank of {parameter} is {shown(rank)}; "
                              "expected a positive integer")
    rows, columns = a_tensor.shape
    if rows % rank or b_tensor.shape[1] != rows:
        raise ConversionError(f"{path}: {a_name} has shape {list(a_tensor.shape)} and {b_name} "
                              f"{list(b_tensor.shape)}; for r = {rank} PEFT saves (experts * r, in) and "
                              "(out, r * experts): the adapter does not match its config")
    experts = rows // rank
    if experts == 1:
        return a_tensor, b_tensor
    out = b_tensor.shape[0]
    stacked_a = a_tensor.reshape(experts, rank, columns)
    stacked_b = b_tensor.map(lambda m: np.ascontiguousarray(m.reshape(out, rank, experts).transpose(2, 0, 1)),
                             shape=(experts, out, rank))
    return stacked_a, stacked_b
