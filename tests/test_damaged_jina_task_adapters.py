"""jina-embeddings-v3 folders whose task LoRA adapters are broken (the stacked
`...parametrizations.weight.0.lora_A/B` tensors, config.json's lora_adaptations and
task_instructions): each is refused in one line naming the tensor or key, and neither the model's
file nor any adapter file is written (contract: tests/damaged_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.bert_models import JINA_TASKS, build_jina_v3, jina_v3_as_published, train_xlmr_unigram
from tests.damaged_inputs import assert_convert_refused, edit_config, edit_safetensors

pytest.importorskip("transformers")

QKV_A = "roberta.encoder.layers.1.mixer.Wqkv.parametrizations.weight.0.lora_A"
QKV_B = "roberta.encoder.layers.1.mixer.Wqkv.parametrizations.weight.0.lora_B"
TYPES_B = "roberta.embeddings.token_type_embeddings.parametrizations.weight.0.lora_B"
INSTRUCTIONS = {task: f"Instruction for {task}: " for task in JINA_TASKS}


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jina_task_adapters_damaged")
    train_xlmr_unigram(root / "native", vocab_size=400)
    build_jina_v3(root / "native", hidden_size=32)
    return jina_v3_as_published(root / "native", root / "published")


def _tensor(name: str, change):
    def damage(model_dir: Path) -> None:
        def edit(tensors):
            tensors[name] = change(tensors[name])
        edit_safetensors(model_dir, edit)
    return damage


def _without(name: str):
    return lambda model_dir: edit_safetensors(model_dir, lambda tensors: tensors.pop(name))


def _config(**changes):
    return lambda model_dir: edit_config(model_dir, **changes)


# damage -> the tensor or key the error names
CASES = {
    "adapter-of-the-wrong-input-width": (_tensor(QKV_A, lambda a: np.concatenate([a, a], axis=2)), "Wqkv"),
    "adapter-of-the-wrong-output-height": (_tensor(QKV_B, lambda b: b[:, :-8]), "Wqkv"),
    "factors-of-different-ranks": (_tensor(QKV_B, lambda b: b[:, :, :-1]), QKV_B),
    "fewer-stacked-adapters-than-tasks": (_tensor(QKV_A, lambda a: a[:-1]), QKV_A),
    "a-factor-without-its-partner": (_without(QKV_B), QKV_A),
    "unknown-task-in-task_instructions": (_config(task_instructions=INSTRUCTIONS | {"retrieval.qeury": "Query: "}),
                                          "retrieval.qeury"),
    "task-without-an-instruction": (_config(task_instructions={t: v for t, v in INSTRUCTIONS.items()
                                                               if t != "separation"}), "separation"),
    "task-names-not-a-list": (_config(lora_adaptations="retrieval.query"), "lora_adaptations"),
    "repeated-task-name": (_config(lora_adaptations=JINA_TASKS[:-1] + [JINA_TASKS[0]]), "lora_adaptations"),
    "lora_alpha-not-a-number": (_config(lora_alpha="one"), "lora_alpha"),
    "token-types-adapted-without-token-embeddings": (
        lambda d: [_without(f"roberta.embeddings.word_embeddings.parametrizations.weight.0.lora_{f}")(d) for f in "AB"],
        "token type"),
}


@pytest.mark.parametrize("damage, culprit", CASES.values(), ids=CASES.keys())
def test_refused_in_one_line_and_nothing_written(published, tmp_path, damage, culprit):
    line = assert_convert_refused(published, tmp_path, damage, culprit)
    assert not list(tmp_path.glob("lora-*")), line


def test_an_adapter_target_that_cannot_be_written_stops_everything(published, tmp_path):
    """Each adapter file is a target checked like the model's, before anything is written: here a
    folder stands where an adapter file would go."""
    from tests.damaged_inputs import assert_clean_failure, run_cli

    (tmp_path / "lora-separation-out.gguf").mkdir()
    target = tmp_path / "out.gguf"
    assert_clean_failure(run_cli("convert", published, target, "--outtype", "f32"), "lora-separation-out.gguf", target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora-separation-out.gguf"]


def test_dry_run_names_the_adapter_files_and_writes_nothing(published, tmp_path):
    from tests.damaged_inputs import run_cli

    proc = run_cli("convert", published, tmp_path / "out.gguf", "--outtype", "f32", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    for task in JINA_TASKS:
        assert f"would write {tmp_path / f'lora-{task}-out.gguf'}" in proc.stdout
    assert not list(tmp_path.iterdir())
