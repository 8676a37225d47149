"""The task LoRA adapters of jina-embeddings-v3's published checkpoint, one PeftAdapter per task.

jina's own code (modeling_lora.py, for its XLMRobertaLoRA) turns every linear and embedding weight
of the encoder into a parametrization: the stored weight is `<module>.parametrizations.weight.original`
and beside it `<module>.parametrizations.weight.0.lora_A` / `lora_B` hold one low-rank update per
task, stacked on a first axis in the order of config.json's `lora_adaptations`:
  - a linear layer (out, in): lora_A (tasks, r, in), lora_B (tasks, out, r); update B @ A;
  - an embedding (vocab, dim): lora_A (tasks, vocab, r), lora_B (tasks, r, dim); update A @ B;
each scaled by lora_alpha / r. Selecting a task uses that task's slice on every weight.

Each task is given here as PEFT's factors (a linear layer's A (r, in) and B (out, r), an
embedding's A (r, vocab) and B (dim, r)) so that converters/lora.py plans it like any adapter.
The pooler's adapters are left out with the pooler (not part of the embeddings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.jsonfile import shown
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.peft_adapter import LoraPair, PeftAdapter

_STACKED = re.compile(r"(?P<module>.+)\.parametrizations\.weight\.0\.lora_(?P<factor>[AB])")
_POOLER = re.compile(r"(roberta\.)?pooler\..*")
TASKS_KEY = "lora_adaptations"
INSTRUCTIONS_KEY = "task_instructions"


@dataclass
class TaskAdapter(PeftAdapter):
    """One task's adapter; messages name the model's config.json (there is no adapter_config.json)."""

    task: str = ""
    prompt_prefix: str | None = None  # config.json task_instructions[task], if given
    model_config_path: Path | None = None

    @property
    def config_path(self) -> Path:
        return self.model_config_path or self.folder / "config.json"


def task_names(config: HFConfig) -> list[str]:
    """config.json's lora_adaptations, checked: distinct non-empty names ([] when absent)."""
    tasks = config.get(TASKS_KEY, default=None)
    if tasks is None:
        return []
    if (not isinstance(tasks, list) or not all(isinstance(t, str) and t for t in tasks)
            or len(set(tasks)) != len(tasks)):
        raise ConversionError(f"{config.path}: {TASKS_KEY} is {shown(tasks)}; expected a list of distinct task names")
    return tasks


def read_task_adapters(config: HFConfig, tensors: dict[str, LazyTensor]) -> list[TaskAdapter]:
    """One adapter per task of config.json's lora_adaptations ([] when the model has none)."""
    tasks = task_names(config)
    if not tasks:
        return []
    alpha = config.get("lora_alpha", default=1.0)  # jina's LoRAParametrization default
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ConversionError(f"{config.path}: lora_alpha is {shown(alpha)}; expected a positive number")
    instructions = _instructions(config, tasks)
    stacked = _stacked_factors(config, tensors, len(tasks))
    adapters = []
    for i, task in enumerate(tasks):
        pairs = [_pair(module, a, b, i, task) for module, (a, b) in stacked.items()]
        adapters.append(TaskAdapter(folder=config.path.parent, config={"lora_alpha": float(alpha)}, pairs=pairs,
                                    files=[config.path], task=task, prompt_prefix=instructions.get(task),
                                    model_config_path=config.path))
    return adapters


def _instructions(config: HFConfig, tasks: list[str]) -> dict[str, str]:
    """task_instructions: a prompt prefix for every task, and for no task not in lora_adaptations."""
    instructions = config.get(INSTRUCTIONS_KEY, default=None)
    if instructions is None:
        return {}
    if not isinstance(instructions, dict) or not all(isinstance(v, str) for v in instructions.values()):
        raise ConversionError(f"{config.path}: {INSTRUCTIONS_KEY} is {shown(instructions)}; expected an object of "
                              "task name -> prompt prefix")
    unknown = [t for t in instructions if t not in tasks]
    if unknown:
        raise ConversionError(f"{config.path}: {INSTRUCTIONS_KEY} names the task {unknown[0]!r}, which is not one of "
                              f"{TASKS_KEY} ({', '.join(tasks)}); correct the name or add the task")
    missing = [t for t in tasks if t not in instructions]
    if missing:
        raise ConversionError(f"{config.path}: {INSTRUCTIONS_KEY} has no prompt prefix for the task {missing[0]!r} "
                              f"of {TASKS_KEY}; add one")
    return instructions


def _stacked_factors(config: HFConfig, tensors: dict[str, LazyTensor],
                     n_tasks: int) -> dict[str, tuple[LazyTensor, LazyTensor]]:
    """module -> its stacked (lora_A, lora_B), each checked: 3-D, one slice per task, same rank."""
    halves: dict[str, dict[str, tuple[str, LazyTensor]]] = {}
    for name, tensor in tensors.items():
        match = _STACKED.fullmatch(name)
        if match and not _POOLER.fullmatch(match["module"]):
            halves.setdefault(match["module"], {})[match["factor"]] = (name, tensor)
    if not halves:
        raise ConversionError(f"{config.path}: {TASKS_KEY} names {n_tasks} tasks but the checkpoint holds no task "
                              "adapter (no ...parametrizations.weight.0.lora_A tensors)")
    stacked = {}
    for module, factors in halves.items():
        if set(factors) != {"A", "B"}:
            (have, _), lacking = next(iter(factors.values())), "B" if "A" in factors else "A"
            raise ConversionError(f"{config.path.parent}: tensor {have} has no lora_{lacking} beside it; "
                                  "the checkpoint is incomplete")
        (a_name, a), (b_name, b) = factors["A"], factors["B"]
        for name, t in ((a_name, a), (b_name, b)):
            if len(t.shape) != 3 or t.shape[0] != n_tasks:
                raise ConversionError(f"{config.path.parent}: tensor {name} has shape {list(t.shape)}; expected one "
                                      f"matrix per task of {TASKS_KEY} ({n_tasks}, ...)")
        embedding = _is_embedding(module)
        rank_a, rank_b = (a.shape[2], b.shape[1]) if embedding else (a.shape[1], b.shape[2])
        if rank_a != rank_b:
            raise ConversionError(f"{config.path.parent}: tensor {a_name} has rank {rank_a} (shape {list(a.shape)}) "
                                  f"but {b_name} has rank {rank_b} (shape {list(b.shape)}); the checkpoint is damaged")
        stacked[module] = (a, b)
    return stacked


def _is_embedding(module: str) -> bool:
    """jina stores an nn.Embedding's factors the other way round (embeddings.word_embeddings,
    embeddings.token_type_embeddings)."""
    return module.endswith("_embeddings")


def _pair(module: str, a: LazyTensor, b: LazyTensor, i: int, task: str) -> LoraPair:
    """Task i's factors in PEFT's layout."""
    def task_slice(t: LazyTensor, transpose: bool) -> LazyTensor:
        shape = t.shape[1:][::-1] if transpose else t.shape[1:]
        return t.map(lambda x: np.ascontiguousarray(x[i].T if transpose else x[i]), shape=shape)

    embedding = _is_embedding(module)
    a_name, b_name = (f"{module}.parametrizations.weight.0.lora_{f}[{i}] ({task})" for f in "AB")
    return LoraPair(f"{module}.weight", task_slice(a, embedding), task_slice(b, embedding), embedding, a_name, b_name)
