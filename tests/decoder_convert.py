"""Convert a decoder test model to GGUF: ggufsmith.convert when the pipeline is there, else the same
steps spelled out (plugin keys and tensors, tokenizer export, quantize, write), so the decoder
plugins can be checked against llama.cpp before the pipeline lands."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ggufsmith.arch.base import HFConfig
from ggufsmith.arch.registry import find_architecture
from ggufsmith.constants import FileType, GGMLType, Keys
from ggufsmith.converters.lazy_tensor import LazyTensor
from ggufsmith.converters.tokenizer import export_tokenizer
from ggufsmith.gguf_writer import GGUFWriter, Metadata
from ggufsmith.quantize import quantize

OUTTYPES = {"f32": (GGMLType.F32, FileType.ALL_F32), "f16": (GGMLType.F16, FileType.MOSTLY_F16),
            "q8_0": (GGMLType.Q8_0, FileType.MOSTLY_Q8_0)}


def lazy_safetensors(model_dir: Path) -> dict[str, LazyTensor]:
    from safetensors.numpy import load_file

    arrays = load_file(Path(model_dir) / "model.safetensors")
    return {name: LazyTensor.from_array(array, source=name) for name, array in arrays.items()}


def convert(model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    try:
        from ggufsmith import convert as pipeline_convert
    except ImportError:
        pipeline_convert = None
    if pipeline_convert is not None:
        pipeline_convert(model_dir, out, outtype=outtype)
        return out
    config = HFConfig.from_dir(model_dir)
    plugin = find_architecture(config)(config)
    weight_type, file_type = OUTTYPES[outtype]
    metadata = Metadata()
    metadata.add_string(Keys.General.ARCHITECTURE, plugin.name)
    metadata.update(plugin.metadata())
    metadata.add_uint32(Keys.General.FILE_TYPE, int(file_type))
    metadata.update(export_tokenizer(model_dir, vocab_size=config.get("vocab_size"), kind=plugin.tokenizer_kind))
    mapped = plugin.map_tensors(lazy_safetensors(model_dir))
    writer = GGUFWriter(out, metadata)
    types = {}
    for m in mapped:
        types[m.name] = GGMLType.F32 if len(m.tensor.shape) == 1 or plugin.keep_f32(m.name) else weight_type
        writer.add_tensor(m.name, m.tensor.shape, types[m.name])
    for m in mapped:
        writer.write_tensor(m.name, quantize(m.tensor.load().astype(np.float32), types[m.name]))
    return writer.finish()
