"""The GGUF format: typed metadata, a streaming writer and a validating reader."""

from ggufsmith.gguf_writer.metadata import Metadata, MetadataValue
from ggufsmith.gguf_writer.writer import GGUFWriter, TensorInfo

__all__ = ["GGUFWriter", "Metadata", "MetadataValue", "TensorInfo"]
