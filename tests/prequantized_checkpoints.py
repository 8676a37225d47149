"""Pre-quantized checkpoints made in the tests: the small float Qwen3 they start from, and its
integer-quantized copies, GPTQ and AWQ as their libraries pack them, compressed-tensors by the
compressed-tensors library itself.

GPTQModel and AutoAWQ cannot be installed here (GPTQModel needs a newer torch than the one the
tests run on, AutoAWQ needs triton and its kernels), so their packing is written out below from
their code, loop for loop (GPTQModel's `PackableQuantLinear.pack_original`, AutoAWQ's
`WQLinear_GEMM.from_linear`), deliberately not as the bit-stream arithmetic ggufsmith's reader
uses. Every packer returns, besides the tensors it packs, the weight its integer codes stand for,
computed from the codes before packing: the tests' expected values never go through an unpacking.
llama.cpp's convert_hf_to_gguf.py reads GPTQ (2, 4 and 8 bits) and compressed-tensors: the tests
compare its files with ours, which cross-checks these packers against an unpacking of its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from tests.damaged_inputs import edit_json

MODEL_CLASS = "Qwen3ForCausalLM"
# 320-wide MLP: FP8's 128-blocks are cut at the edge (2.5 blocks), as in real checkpoints' odd sizes
FIELDS = dict(vocab_size=608, hidden_size=256, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False,
              bos_token_id=0, eos_token_id=0, pad_token_id=0)
GROUP = 32  # inputs per scale of the integer formats


def small_float_model(folder: Path) -> Path:
    """The float32 Qwen3 (FIELDS) with a trained BPE tokenizer that every pre-quantized copy starts from."""
    from tests.family_models import build_bpe_models

    spec = {folder.name: ("Qwen3Config", MODEL_CLASS, FIELDS)}
    return build_bpe_models(folder.parent, spec, vocab_size=600)[folder.name]


AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's order_map: nibble i of a word takes column order_map[i]


def quantize_groups(weight: np.ndarray, bits: int, g_idx: np.ndarray, sym: bool, min_zero: int):
    """Min-max quantization of weight (outputs, inputs) per group of inputs: (codes (inputs, outputs),
    zero points and fp16 scales (groups, outputs), the dequantized weight (outputs, inputs))."""
    maxq = (1 << bits) - 1
    columns = weight.T.astype(np.float32)
    n_groups = int(g_idx.max()) + 1
    scales = np.empty((n_groups, weight.shape[0]), np.float16)
    zeros = np.empty((n_groups, weight.shape[0]), np.int64)
    for group in range(n_groups):
        block = columns[g_idx == group]
        low, high = np.minimum(block.min(0), 0), np.maximum(block.max(0), 0)
        if sym:
            scale, zero = 2 * np.maximum(-low, high) / maxq, np.full(low.shape, (maxq + 1) // 2)
        else:
            scale = (high - low) / maxq
            zero = np.clip(np.round(-low / scale), min_zero, maxq)
        scales[group], zeros[group] = scale.astype(np.float16), zero
    scale_of, zero_of = scales.astype(np.float32)[g_idx], zeros[g_idx]
    codes = np.clip(np.round(columns / scale_of + zero_of), 0, maxq).astype(np.int64)
    dequantized = (scale_of * (codes - zero_of).astype(np.float32)).T
    return codes, zeros, scales, np.ascontiguousarray(dequantized)


def gptq_pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """GPTQModel's pack_original: the codes of each column packed along the rows into int32 words."""
    words = np.zeros((-(-values.shape[0] * bits // 32), values.shape[1]), np.int64)
    if bits in (2, 4, 8):
        per_word = 32 // bits
        for row in range(words.shape[0]):
            for j in range(min(per_word, values.shape[0] - row * per_word)):
                words[row] |= values[row * per_word + j] << (bits * j)
    else:  # 3 bits: 32 codes in 3 words, two of them split across words
        i = row = 0
        while row < words.shape[0]:
            for j in range(i, i + 10):
                words[row] |= values[j] << (3 * (j - i))
            i += 10
            words[row] |= values[i] << 30
            row += 1
            words[row] |= (values[i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                words[row] |= values[j] << (3 * (j - i) + 1)
            i += 10
            words[row] |= values[i] << 31
            row += 1
            words[row] |= (values[i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                words[row] |= values[j] << (3 * (j - i) + 2)
            i += 10
            row += 1
    return (words & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def gptq_tensors(weight: np.ndarray, bits: int, desc_act: bool, sym: bool, checkpoint_format: str,
                 rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """{"qweight", "qzeros", "scales", "g_idx"} as GPTQModel saves a Linear, and the dequantized weight."""
    inputs = weight.shape[1]
    order = rng.permutation(inputs) if desc_act else np.arange(inputs)  # act order: groups in a shuffled order
    g_idx = np.empty(inputs, np.int32)
    g_idx[order] = np.arange(inputs) // GROUP
    # the first format stores zero - 1, so a zero of 0 cannot be stored: min-max gives zeros >= 1 then
    stored_minus = 1 if checkpoint_format == "gptq" else 0
    codes, zeros, scales, dequantized = quantize_groups(weight, bits, g_idx, sym, min_zero=stored_minus)
    stored_zeros = zeros - stored_minus
    tensors = {"qweight": gptq_pack_rows(codes, bits), "qzeros": gptq_pack_rows(stored_zeros.T, bits).T.copy(),
               "scales": scales, "g_idx": g_idx}
    return tensors, dequantized


def awq_tensors(weight: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """{"qweight", "qzeros", "scales"} as AutoAWQ's WQLinear_GEMM.from_linear packs 4 bits, and the
    dequantized weight."""
    g_idx = (np.arange(weight.shape[1]) // GROUP).astype(np.int32)
    codes, zeros, scales, dequantized = quantize_groups(weight, 4, g_idx, sym=False, min_zero=0)

    def pack_columns(values: np.ndarray) -> np.ndarray:
        words = np.zeros((values.shape[0], values.shape[1] // 8), np.int64)
        for col in range(words.shape[1]):
            for i in range(8):
                words[:, col] |= values[:, col * 8 + AWQ_PACK_ORDER[i]] << (i * 4)
        return (words & 0xFFFFFFFF).astype(np.uint32).view(np.int32)

    return {"qweight": pack_columns(codes), "qzeros": pack_columns(zeros), "scales": scales}, dequantized


def write_packed_checkpoint(original: Path, folder: Path, quantization_config: dict, pack) -> dict[str, np.ndarray]:
    """A copy of the float checkpoint at `original` with every Linear of the blocks replaced by
    pack(weight) -> (tensors, dequantized) as `<module>.<tensor>`; returns the state dict of the
    dequantized model."""
    from safetensors.numpy import save_file
    from safetensors.torch import load_file  # numpy has no bfloat16

    shutil.copytree(original, folder)
    stored, dequantized = {}, {}
    for name, tensor in load_file(original / "model.safetensors").items():
        tensor = tensor.float().numpy()
        if name.endswith("proj.weight"):
            parts, values = pack(tensor.astype(np.float32))
            module = name.removesuffix(".weight")
            stored |= {f"{module}.{part}": array for part, array in parts.items()}
            dequantized[name] = values
        else:
            stored[name] = dequantized[name] = tensor
    save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})
    edit_json(folder / "config.json", quantization_config=quantization_config)
    return dequantized


def compressed_tensors_checkpoint(original: Path, folder: Path, model_class: str, fmt: str, bits: int,
                                  strategy: str, symmetric: bool,
                                  static_activations: bool = False) -> dict[str, np.ndarray]:
    """The float model at `original` quantized by the compressed-tensors library (min-max scales and
    zero points from its calculate_qparams, every Linear but lm_head), compressed in format `fmt`
    and saved; returns the state dict the library decompresses it back to. With
    `static_activations`, the scheme is W8A8 with static asymmetric int8 activations: the
    checkpoint then also holds each Linear's input_scale and input_zero_point."""
    import torch
    import transformers
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import save_file

    shutil.copytree(original, folder)
    model = getattr(transformers, model_class).from_pretrained(original, dtype=torch.float32).eval()
    args = QuantizationArgs(num_bits=bits, type="int", strategy=strategy, symmetric=symmetric,
                            group_size=GROUP if strategy == "group" else None)
    activations = QuantizationArgs(num_bits=8, type="int", strategy="tensor", symmetric=False, dynamic=False)
    scheme = QuantizationScheme(targets=["Linear"], weights=args,
                                input_activations=activations if static_activations else None)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                weight = module.weight
                if strategy == "group":
                    grouped = weight.reshape(weight.shape[0], -1, GROUP)
                    low, high = grouped.amin(-1), grouped.amax(-1)
                elif strategy == "channel":
                    low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
                else:
                    low, high = weight.amin().reshape(1), weight.amax().reshape(1)
                scale, zero = calculate_qparams(low, high, args)
                module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
                if hasattr(module, "weight_zero_point"):
                    module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, fmt)
    compressor.compress_model(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    compressor.update_config(folder)
    compressor.decompress_model(model)
    return {k: v.numpy() for k, v in model.state_dict().items()}
