"""A multi-task model's task LoRA adapters (jina-embeddings-v3) -> one GGUF adapter file per task,
written beside the model's GGUF, as llama.cpp's convert_hf_to_gguf.py writes them.

Each task is planned as any LoRA adapter (converters/lora.py: names and layouts through the base
model's plugin, alpha as llama.cpp applies it), at F32 whatever the model's type (as llama.cpp's
converter), and named `lora-<task>-<model file name>` in the model's folder. Its keys are
llama.cpp's: general.architecture, general.type adapter, adapter.type lora, adapter.lora.alpha,
adapter.lora.task_name and adapter.lora.prompt_prefix (the task's instruction, from config.json's
task_instructions). A file is applied with llama.cpp's --lora (llama-cpp-python's lora_path).

One departure from llama.cpp's converter, so that llama.cpp computes the model with the task
selected: jina also adapts the token type embeddings, but llama.cpp's bert graph adds the token
type row without any adapter (the converter's token_types.weight.lora_a/b are loaded and never
used). The update of that row (every token has type 0 in llama.cpp) is a constant vector added to
every token's embedding, which the token embeddings' adapter carries as one more rank: lora_a (vocab,
r+1) gains a column of ones and lora_b (dim, r+1) the vector, its other columns rescaled by (r+1)/r
since llama.cpp scales by alpha over the file's rank.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from ggufsmith.arch.base import Architecture
from ggufsmith.constants import Keys
from ggufsmith.converters.lora import make_lora_plan
from ggufsmith.converters.plan import ConversionPlan
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.checkpoint import Checkpoint
from ggufsmith.readers.jina_task_adapters import TaskAdapter, read_task_adapters
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.peft_adapter import LoraPair

log = logging.getLogger(__name__)

ADAPTER_OUTTYPE = "f32"  # llama.cpp's converter writes the task adapters at F32 for any --outtype
_TOKEN_EMBEDDINGS = "word_embeddings.weight"
_TOKEN_TYPES = "token_type_embeddings.weight"


def task_adapter_file(model_file: Path, task: str) -> Path:
    """llama.cpp's name: the model file's, prefixed by lora-<task>-."""
    return model_file.with_name(f"lora-{task}-{model_file.name}")


def task_adapter_plans(checkpoint: Checkpoint, plugin: Architecture,
                       model_file: Path) -> list[tuple[ConversionPlan, Path]]:
    """(plan, path) of each task adapter of the checkpoint ([] for a model without task adapters)."""
    adapters = read_task_adapters(checkpoint.config, checkpoint.tensors)
    jobs = []
    for adapter in adapters:
        applied = replace(adapter, pairs=with_token_types_folded(adapter))
        plan = make_lora_plan(applied, plugin, ADAPTER_OUTTYPE)
        plan.metadata = task_adapter_metadata(plugin, adapter, plan.metadata)
        path = task_adapter_file(model_file, adapter.task)
        plan.output = path
        jobs.append((plan, path))
    if adapters:
        log.info("%s: writing its %d task LoRA adapters beside %s (lora-<task>-%s)", checkpoint.config.path,
                 len(adapters), model_file.name, model_file.name)
    return jobs


def task_adapter_metadata(plugin: Architecture, adapter: TaskAdapter, planned: Metadata) -> Metadata:
    """llama.cpp's converter's keys of a task adapter, in its order (no general.* name keys: it
    writes none)."""
    metadata = Metadata()
    metadata.add_string(Keys.General.ARCHITECTURE, plugin.name)
    metadata.add_string(Keys.General.TYPE, "adapter")
    metadata.add_string(Keys.Adapter.TYPE, "lora")
    metadata.add_value(Keys.Adapter.LORA_ALPHA, planned[Keys.Adapter.LORA_ALPHA])
    metadata.add_string(Keys.Adapter.LORA_TASK_NAME, adapter.task)
    if adapter.prompt_prefix is not None:
        metadata.add_string(Keys.Adapter.LORA_PROMPT_PREFIX, adapter.prompt_prefix)
    return metadata


def with_token_types_folded(adapter: TaskAdapter) -> list[LoraPair]:
    """The adapter's pairs, the token type embeddings' update moved into the token embeddings'
    (see the module docstring)."""
    by_name = {p.weight_name: p for p in adapter.pairs}
    types = next((p for name, p in by_name.items() if name.endswith(_TOKEN_TYPES)), None)
    if types is None:
        return adapter.pairs
    tokens = next((p for name, p in by_name.items() if name.endswith(_TOKEN_EMBEDDINGS)), None)
    if tokens is None:
        raise ConversionError(f"{adapter.config_path}: the task adapter {adapter.task!r} adapts the token type "
                              "embeddings but not the token embeddings, which llama.cpp's adapter would need to "
                              "carry the update; the checkpoint is incomplete")
    alpha, rank = adapter.alpha(), tokens.rank
    type_scale = adapter.scale(types)

    def row0_update() -> np.ndarray:  # (dim,): the update of token type 0's embedding
        return type_scale * (types.b.load().astype(np.float64) @ types.a.load().astype(np.float64)[:, 0])

    a = LazyTensor(
        (rank + 1, tokens.a.shape[1]), "F32",
        lambda: np.vstack([tokens.a.load().astype(np.float32), np.ones((1, tokens.a.shape[1]), np.float32)]),
        tokens.a.source)
    b = LazyTensor(
        (tokens.b.shape[0], rank + 1), "F32",
        lambda: np.hstack([tokens.b.load().astype(np.float64) * ((rank + 1) / rank),
                           row0_update()[:, None] * ((rank + 1) / alpha)]).astype(np.float32),
        tokens.b.source)
    folded = replace(tokens, a=a, b=b)
    return [folded if p is tokens else p for p in adapter.pairs if p is not types]
