"""ggufsmith: Hugging Face / PyTorch / safetensors checkpoints to GGUF."""

from ggufsmith.errors import GGUFError, GgufsmithError

__version__ = "0.1.0"

__all__ = ["GGUFError", "GgufsmithError", "__version__", "convert", "convert_lora", "merge_gguf", "quantize_gguf", "set_metadata",
           "split_gguf"]


def convert(src, dst, outtype: str = "f16", arch=None, **options):
    """Convert a Hugging Face model folder to a GGUF file; see ggufsmith.converters.pipeline.convert."""
    from ggufsmith.converters.pipeline import convert as _convert

    return _convert(src, dst, outtype, arch, **options)


def convert_lora(adapter_dir, dst=None, outtype: str = "f16", base=None, **options):
    """Convert a PEFT LoRA adapter folder to a GGUF adapter file (`dst`: a file or a folder, default the
    adapter's folder; `base`: the base model's folder or repository id); see
    ggufsmith.converters.lora.convert_lora."""
    from ggufsmith.converters.lora import convert_lora as _convert_lora

    return _convert_lora(adapter_dir, dst, outtype, base, **options)


def quantize_gguf(src, dst, preset, **options):
    """Quantize a GGUF file with a llama-quantize preset ("Q4_K_M", or a QuantizeRequest with all
    options); see ggufsmith.converters.requantize.quantize_gguf."""
    from ggufsmith.converters.requantize import quantize_gguf as _quantize_gguf

    return _quantize_gguf(src, dst, preset, **options)


def split_gguf(src, prefix, rule, **options):
    """Cut a GGUF model into parts PREFIX-0000i-of-0000n.gguf by a SplitRule (max_size, max_tensors);
    see ggufsmith.converters.split_files.split_gguf."""
    from ggufsmith.converters.split_files import split_gguf as _split_gguf

    return _split_gguf(src, prefix, rule, **options)


def merge_gguf(first, dst, **options):
    """Join the parts of a split GGUF model into one file; see ggufsmith.converters.split_files.merge_gguf."""
    from ggufsmith.converters.split_files import merge_gguf as _merge_gguf

    return _merge_gguf(first, dst, **options)


def set_metadata(path, changes=(), remove=(), output=None):
    """Set ("KEY=VALUE", "KEY:TYPE=VALUE") and remove metadata keys of a GGUF file, rewritten safely;
    see ggufsmith.gguf_writer.edit.set_metadata."""
    from ggufsmith.gguf_writer.edit import set_metadata as _set_metadata

    return _set_metadata(path, changes, remove, output)
