"""The model check every plugin gets from its tensor table (arch/tensors.py): a checkpoint that
lacks a tensor llama.cpp needs, or holds one of another shape than the metadata implies, is
refused before anything is written — for every built-in architecture, not only llama (whose
catalogue of damaged models is tests/test_damaged_models.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ggufsmith.arch.registry import all_architectures
from ggufsmith.arch.tensors import T, _names_in, check_model, model_dims, table_entries
from ggufsmith.converters.pipeline import make_plan
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.checkpoint import open_checkpoint
from ggufsmith.readers.lazy_tensor import LazyTensor
from tests.decoder_models import VARIANTS, build_model
from tests.tokenizer_helpers import train_bpe

pytest.importorskip("transformers")

STANDARD_DIMS = {"n_layer", "n_ctx", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "head_dim_v", "n_rot",
                 "n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp", "d_conv", "d_inner", "d_state", "dt_rank",
                 "n_group", "n_vocab"}


@pytest.mark.parametrize("name", sorted(all_architectures()))
def test_every_builtin_plugin_declares_each_tensor_with_its_shape(name):
    plugin = all_architectures()[name]
    entries = list(table_entries(plugin.tensor_names))
    undeclared = [hf for hf, entry in entries if not isinstance(entry, T) or not entry.shape]
    assert not undeclared, f"{name}: no shape declared for {undeclared[:5]}"
    for _, entry in entries:
        for expression in (*entry.shape, entry.when or "0", entry.blocks):
            compile(str(expression), "<shape>", "eval")  # a typo in a shape expression fails here
        assert set(n for e in entry.shape for n in _names_in(e)) - STANDARD_DIMS - {"n_mels", "n_att"} <= \
            _plugin_dim_names(plugin), entry


def _plugin_dim_names(plugin) -> set[str]:
    whisper = {"n_enc_layer", "n_dec_layer", "n_enc_ff", "n_dec_ff", "n_enc_ctx", "n_dec_ctx"} if plugin.name == "whisper" else set()
    return whisper | set(plugin.dim_names)


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("validation")
    dirs = {}
    for kind in VARIANTS:
        model_dir = root / kind
        train_bpe(model_dir, "gpt2", vocab_size=300)
        build_model(kind, model_dir, 320)
        dirs[kind] = model_dir
    return dirs


def _victim(plan) -> tuple[str, str]:
    """(HF name, GGUF name) of a 2-D weight of block 1 that llama.cpp cannot do without."""
    for t in plan.tensors:
        if t.name.startswith("blk.1.") and len(t.shape) == 2 and re.search(r"(qkv|attn_q|ffn_up)\.weight$", t.name):
            return t.sources[0], t.name
    raise AssertionError("no block-1 weight found")


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_a_missing_tensor_is_refused_by_name(decoder_dirs, kind):
    with open_checkpoint(decoder_dirs[kind]) as checkpoint:
        hf_name, gguf_name = _victim(make_plan(checkpoint, "f32"))  # the whole model passes
        del checkpoint.tensors[hf_name]
        with pytest.raises(ConversionError, match=rf"lacks {re.escape(gguf_name)} \(from {re.escape(hf_name)}\)"):
            make_plan(checkpoint, "f32")


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_a_tensor_of_the_wrong_shape_is_refused_by_name(decoder_dirs, kind):
    with open_checkpoint(decoder_dirs[kind]) as checkpoint:
        hf_name, gguf_name = _victim(make_plan(checkpoint, "f32"))
        rows, columns = checkpoint.tensors[hf_name].shape
        checkpoint.tensors[hf_name] = LazyTensor.from_array(np.zeros((rows, columns + 8), np.float32), source=hf_name)
        with pytest.raises(ConversionError, match=rf"tensor {re.escape(gguf_name)} .*has shape .* implies"):
            make_plan(checkpoint, "f32")


def test_per_layer_dims_and_conditions():
    """A hybrid's table: attention only where the pattern says, its width per layer."""
    table = {
        "a.{bid}": T("blk.{bid}.attn_q.weight", "n_head * 4", "n_embd", when="is_attention[bid]"),
        "s.{bid}": T("blk.{bid}.ssm_in.weight", "n_embd", "n_embd", when="not is_attention[bid]"),
    }
    metadata = Metadata()
    metadata.add_uint32("x.block_count", 3)
    metadata.add_uint32("x.embedding_length", 8)
    metadata.add_array("x.attention.head_count", [2, 0, 3], element_type=_u32())
    dims = model_dims(metadata, "x", {"is_attention": [True, False, True]})
    good = [("blk.0.attn_q.weight", (8, 8), ["a.0"]), ("blk.1.ssm_in.weight", (8, 8), ["s.1"]),
            ("blk.2.attn_q.weight", (12, 8), ["a.2"])]
    check_model("x", table, good, dims)
    with pytest.raises(ConversionError, match=r"blk\.1\.ssm_in\.weight \(from s\.1\)"):
        check_model("x", table, [good[0], good[2]], dims)
    with pytest.raises(ConversionError, match=r"blk\.2\.attn_q\.weight .* has shape \[8, 8\].*\[12, 8\]"):
        check_model("x", table, [good[0], good[1], ("blk.2.attn_q.weight", (8, 8), ["a.2"])], dims)
    with pytest.raises(ConversionError, match=r"blk\.1\.attn_q\.weight .* is not part of this model"):
        check_model("x", table, [*good, ("blk.1.attn_q.weight", (0 + 8, 8), ["a.1"])], dims)


def _u32():
    from ggufsmith.constants import GGUFValueType

    return GGUFValueType.UINT32
