"""RWKV-4: keys the spec requires, tensor names from docs/architectures-other.md, tensor values
against transformers' RwkvForCausalLM, and the world vocabulary against llama.cpp's RWKV tokenizer
and BlinkDL's reference tokenizer (the `rwkv` package, which ships the vocabulary file).

No runtime loads RWKV-4 GGUF files, so the model itself cannot be run through llama.cpp."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ggufsmith.constants import GGUFValueType
from ggufsmith.tokenizer.rwkv_world import RWKV_WORLD_VOCAB, escape_token, export_rwkv_world, read_rwkv_world_vocab
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.gguf_writer.writer import GGUFWriter
from tests.archs_other_helpers import (
    convert_for_tests,
    dequantized,
    documented_gguf_name,
    documented_names,
    numpy_state_dict,
    read_gguf,
)

transformers = pytest.importorskip("transformers")

MULTILINGUAL = (
    "Hello world! Grüße aus Köln, 你好世界。 Привет, мир — ça va? 🙂 こんにちは\n\n"
    "\tdef f(x):\n        return {'a': \"b\\\\n\"}  # done\r\n\x00\x7f ½ ∑ 𝔘"
)


def _world_vocab_dir() -> Path:
    try:
        import rwkv
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the rwkv package (world vocabulary and reference tokenizer) is not installed")
    return Path(rwkv.__file__).parent


@pytest.fixture(scope="module")
def rwkv_case(tmp_path_factory):
    """A tiny RWKV-4 with the world vocabulary: (saved folder, HF weights as stored, HF weights as
    transformers runs them after its inference-time rescaling)."""
    vocab_dir = _world_vocab_dir()
    torch.manual_seed(0)
    config = transformers.RwkvConfig(vocab_size=65536, hidden_size=32, num_hidden_layers=3, intermediate_size=64,
                                     context_length=256, rescale_every=1, architectures=["RwkvForCausalLM"])
    model = transformers.RwkvForCausalLM(config).eval()
    with torch.no_grad():  # HF's init leaves some vectors constant; make every tensor distinctive
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = tmp_path_factory.mktemp("rwkv")
    model.save_pretrained(folder)
    shutil.copy(vocab_dir / RWKV_WORLD_VOCAB, folder / RWKV_WORLD_VOCAB)
    stored = numpy_state_dict(model)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))  # transformers rescales its weights on the first eval forward
    return folder, stored, numpy_state_dict(model)


@pytest.fixture(scope="module")
def rwkv_f32(rwkv_case, tmp_path_factory):
    folder = rwkv_case[0]
    return read_gguf(convert_for_tests(folder, tmp_path_factory.mktemp("rwkv_out") / "rwkv-f32.gguf", "f32"))


def test_required_spec_keys_have_their_types_and_values(rwkv_case, rwkv_f32):
    keys, _ = rwkv_f32
    expected = {
        "general.architecture": ("rwkv", "STRING"),
        "rwkv.architecture_version": (4, "UINT32"),
        "rwkv.context_length": (256, "UINT64"),
        "rwkv.block_count": (3, "UINT64"),
        "rwkv.embedding_length": (32, "UINT64"),
        "rwkv.feed_forward_length": (64, "UINT64"),
        "rwkv.rescale_every_n_layers": (1, "UINT32"),
        "tokenizer.ggml.model": ("rwkv", "STRING"),
    }
    assert {k: keys[k] for k in expected} == expected
    assert keys["rwkv.attention.layer_norm_epsilon"][0] == pytest.approx(1e-5)


def test_every_tensor_is_documented_and_equals_what_transformers_runs(rwkv_case, rwkv_f32):
    _, stored, running = rwkv_case
    _, tensors = rwkv_f32
    rows = documented_names("rwkv")
    documented = {documented_gguf_name(rows, hf): hf for hf in stored}
    assert None not in documented, "an HF tensor has no documented GGUF name"
    assert set(tensors) == set(documented)
    rescaled = 0
    for name, entry in tensors.items():
        assert entry[1] == "F32"
        expected = running[documented[name]]
        got = dequantized(entry)
        if "shift" in name:  # (1, 1, n_embd) vectors are stored flat
            expected = expected.reshape(-1)
        np.testing.assert_array_equal(got, expected, err_msg=name)
        rescaled += not np.array_equal(running[documented[name]], stored[documented[name]])
    assert rescaled == 4  # output and value weights of blocks 1 and 2 (block 0 is divided by 1)


@pytest.mark.slow
def test_world_vocabulary_round_trips_through_llama_cpp(rwkv_case, tmp_path):
    """Every token's text, as llama.cpp's RWKV tokenizer decodes it, is the token's bytes."""
    llama_cpp = pytest.importorskip("llama_cpp")
    folder = rwkv_case[0]
    path = _vocab_only_file(folder, tmp_path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tokens = read_rwkv_world_vocab(folder / RWKV_WORLD_VOCAB)
    # llama_cpp.Llama.detokenize truncates pieces at 32 bytes; call llama.cpp directly
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    buffer = ctypes.create_string_buffer(1024)
    for token_id in range(1, len(tokens)):
        n = llama_cpp.llama_token_to_piece(vocab, token_id, buffer, len(buffer), 0, False)
        assert buffer.raw[:n] == tokens[token_id], token_id


@pytest.mark.slow
def test_tokenization_matches_the_reference_tokenizer(rwkv_case, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    folder = rwkv_case[0]
    llm = llama_cpp.Llama(model_path=str(_vocab_only_file(folder, tmp_path)), vocab_only=True, verbose=False)
    reference = TRIE_TOKENIZER(str(folder / RWKV_WORLD_VOCAB))
    for text in (MULTILINGUAL, " leading space", "trailing\n\n", "a" * 50):
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == reference.encode(text), text


def _vocab_only_file(folder: Path, tmp_path: Path) -> Path:
    """Our tokenizer keys inside a file llama.cpp agrees to open: it knows no `rwkv` architecture,
    so the keys go under rwkv6's name (the tokenizer is the same for RWKV-4, 5, 6 and 7)."""
    md = Metadata()
    md.add_string("general.architecture", "rwkv6")
    for key, value in (("context_length", 256), ("embedding_length", 64), ("block_count", 1),
                       ("feed_forward_length", 128), ("attention.head_count", 0), ("wkv.head_size", 64),
                       ("time_mix_extra_dim", 32), ("time_decay_extra_dim", 64), ("rescale_every_n_layers", 0)):
        md.add_uint32(f"rwkv6.{key}", value)
    md.add_float32("rwkv6.attention.layer_norm_epsilon", 1e-5)
    md.update(export_rwkv_world(folder, vocab_size=65536))
    path = tmp_path / "rwkv-vocab.gguf"
    with GGUFWriter(path, md):
        pass
    return path


def test_world_vocabulary_keys(rwkv_case):
    folder = rwkv_case[0]
    md = export_rwkv_world(folder, vocab_size=65536)
    tokens = md.get("tokenizer.ggml.tokens")
    assert len(tokens) == 65536 and tokens[0] == "<s>" and tokens[-1] == "[PAD65535]"
    assert md["tokenizer.ggml.token_type"].element_type == GGUFValueType.INT32
    assert md.get("tokenizer.ggml.token_type")[:2] == [3, 1] and md.get("tokenizer.ggml.token_type")[-1] == 5
    # the spec's verbatim copy of the vocabulary file
    assert md.get("tokenizer.rwkv.world") == (folder / RWKV_WORLD_VOCAB).read_text(encoding="utf-8")


def test_escapes_are_unambiguous():
    assert escape_token(b"a\\b") == "a\\\\b"
    assert escape_token(b"\n\t\r") == "\\n\\t\\r"
    assert escape_token("é".encode()) == "\\xc3\\xa9"
    assert escape_token(b"'\"") == "'\""


def test_a_smaller_embedding_than_the_vocabulary_is_refused(rwkv_case):
    from ggufsmith.errors import TokenizerError

    with pytest.raises(TokenizerError, match="embedding rows"):
        export_rwkv_world(rwkv_case[0], vocab_size=1000)


def test_no_rescaling_when_the_config_has_none(rwkv_case):
    from ggufsmith.readers.config import HFConfig
    from ggufsmith.arch.rwkv import Rwkv
    from tests.archs_other_helpers import lazy_source

    _, stored, _ = rwkv_case
    config = HFConfig({"hidden_size": 32, "num_hidden_layers": 3, "context_length": 256, "rescale_every": 0})
    plugin = Rwkv(config)
    assert plugin.metadata().get("rwkv.rescale_every_n_layers") == 0
    for t in plugin.map_tensors(lazy_source(stored)):
        np.testing.assert_array_equal(t.tensor.load(), stored[t.sources[0]].reshape(t.tensor.shape), err_msg=t.name)


def test_pile_models_tokenizer_json_is_exported_as_bpe(tmp_path):
    """RWKV-4 Pile checkpoints ship GPT-NeoX's tokenizer.json instead of the world vocabulary."""
    from ggufsmith.readers.config import HFConfig
    from ggufsmith.arch.rwkv import Rwkv
    from ggufsmith.tokenizer import export_tokenizer
    from tests import tokenizer_helpers

    tokenizer_helpers.train_bpe(tmp_path, "gpt2", vocab_size=300)
    (tmp_path / "config.json").write_text('{"architectures": ["RwkvForCausalLM"], "vocab_size": 304}')
    plugin = Rwkv(HFConfig.from_dir(tmp_path))
    md = export_tokenizer(tmp_path, vocab_size=304, kind=plugin.tokenizer_kind)
    assert md.get("tokenizer.ggml.model") == "gpt2"
