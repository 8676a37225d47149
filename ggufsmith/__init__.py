"""ggufsmith: Hugging Face / PyTorch / safetensors checkpoints to GGUF."""

from ggufsmith.errors import GGUFError, GgufsmithError

__version__ = "0.1.0"

__all__ = ["GGUFError", "GgufsmithError", "__version__", "convert", "quantize_gguf", "set_metadata"]


def convert(src, dst, outtype: str = "f16", arch=None, **options):
    """Convert a Hugging Face model folder to a GGUF file; see ggufsmith.converters.pipeline.convert."""
    from ggufsmith.converters.pipeline import convert as _convert

    return _convert(src, dst, outtype, arch, **options)


def quantize_gguf(src, dst, preset, **options):
    """Quantize a GGUF file with a llama-quantize preset ("Q4_K_M", or a QuantizeRequest with all
    options); see ggufsmith.converters.requantize.quantize_gguf."""
    from ggufsmith.converters.requantize import quantize_gguf as _quantize_gguf

    return _quantize_gguf(src, dst, preset, **options)


def set_metadata(path, changes=(), remove=(), output=None):
    """Set ("KEY=VALUE", "KEY:TYPE=VALUE") and remove metadata keys of a GGUF file, rewritten safely;
    see ggufsmith.gguf_writer.edit.set_metadata."""
    from ggufsmith.gguf_writer.edit import set_metadata as _set_metadata

    return _set_metadata(path, changes, remove, output)
