"""ggufsmith: Hugging Face / PyTorch / safetensors checkpoints to GGUF."""

from ggufsmith.errors import GGUFError, GgufsmithError

__version__ = "0.1.0"

__all__ = ["GGUFError", "GgufsmithError", "__version__"]
