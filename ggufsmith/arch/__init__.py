"""Architecture plugins: one small module per architecture family, all on the interface in base.py."""

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig, MappedTensor
from ggufsmith.arch.registry import all_architectures, find_architecture, get_architecture

__all__ = [
    "ArchKeys",
    "Architecture",
    "HFConfig",
    "MappedTensor",
    "all_architectures",
    "find_architecture",
    "get_architecture",
]
