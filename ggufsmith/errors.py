"""The exceptions ggufsmith raises. The CLI turns each into a one-line message and a non-zero exit."""


class GgufsmithError(Exception):
    """Base class: an error the user can act on; its message names the file, tensor or key."""


class GGUFError(GgufsmithError):
    """A GGUF file is malformed, or a writer was used out of order."""


class QuantizationError(GgufsmithError):
    """Data that cannot be quantized to the requested type (bad row length, NaN, Inf, ...)."""


class ConversionError(GgufsmithError):
    """A checkpoint that cannot be converted (missing file, unknown architecture, bad tensor)."""


class TokenizerError(ConversionError):
    """A tokenizer that llama.cpp cannot represent faithfully."""


class OutputError(GgufsmithError):
    """The output cannot be written where asked: an input, a directory, a device, a full disk, ..."""
