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


class BatchError(GgufsmithError):
    """A batch plan that cannot be run as written (a bad key, a missing source, a name clash)."""


def one_line(e: BaseException) -> str:
    """An error as the one line the CLI and batch reports show."""
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    return " ".join(str(e).split()) or type(e).__name__
