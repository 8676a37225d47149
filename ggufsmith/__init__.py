"""ggufsmith: Hugging Face / PyTorch / safetensors checkpoints to GGUF."""

from ggufsmith.errors import GGUFError, GgufsmithError

__version__ = "0.1.0"

__all__ = ["GGUFError", "GgufsmithError", "__version__", "convert"]


def convert(src, dst, outtype: str = "f16", arch=None, **options):
    """Convert a Hugging Face model folder to a GGUF file; see ggufsmith.converters.pipeline.convert."""
    from ggufsmith.converters.pipeline import convert as _convert

    return _convert(src, dst, outtype, arch, **options)
