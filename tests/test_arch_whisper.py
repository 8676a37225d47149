"""Whisper: the spec's whisper.encoder.* / whisper.decoder.* keys, tensor names from
docs/architectures-other.md, every tensor of an f32 file against transformers'
WhisperForConditionalGeneration, and the mel filters against transformers' WhisperFeatureExtractor.

No runtime loads whisper GGUF files, so the model itself cannot be run through llama.cpp."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ggufsmith.readers.config import HFConfig
from ggufsmith.arch.whisper import MEL_FILTERS, Whisper
from tests import tokenizer_helpers
from tests.archs_other_helpers import (
    convert_for_tests,
    dequantized,
    documented_gguf_name,
    documented_names,
    numpy_state_dict,
    read_gguf,
)

transformers = pytest.importorskip("transformers")

CONFIG = dict(vocab_size=400, num_mel_bins=80, d_model=32, encoder_layers=2, decoder_layers=3,
              encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=96,
              max_source_positions=60, max_target_positions=40, architectures=["WhisperForConditionalGeneration"])
# Whisper's tokenizer is GPT-2's byte-level BPE plus these special tokens (and more languages).
WHISPER_SPECIALS = ["<|startoftranscript|>", "<|en|>", "<|de|>", "<|transcribe|>", "<|translate|>",
                    "<|notimestamps|>"]


def _whisper_tokenizer(folder):
    """A GPT-2-style BPE trained here, with Whisper's special tokens added as Whisper has them."""
    tokenizer_helpers.train_bpe(folder, "gpt2", vocab_size=360)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": WHISPER_SPECIALS})
    tokenizer.save_pretrained(folder)
    return tokenizer


@pytest.fixture(scope="module")
def whisper_case(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whisper")
    tokenizer = _whisper_tokenizer(folder)
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    sot = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    assert len(tokenizer) <= CONFIG["vocab_size"]
    config = transformers.WhisperConfig(**CONFIG, pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
                                        decoder_start_token_id=sot)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # make norms and biases distinctive too
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    extractor.save_pretrained(folder)
    return folder, numpy_state_dict(model), extractor


@pytest.fixture(scope="module")
def whisper_f32(whisper_case, tmp_path_factory):
    out = tmp_path_factory.mktemp("whisper_out") / "whisper-f32.gguf"
    return read_gguf(convert_for_tests(whisper_case[0], out, "f32"))


def test_required_spec_keys_have_their_types_and_values(whisper_f32):
    keys, _ = whisper_f32
    u64 = "UINT64"
    expected = {
        "general.architecture": ("whisper", "STRING"),
        "whisper.encoder.context_length": (60, u64),
        "whisper.encoder.embedding_length": (32, u64),
        "whisper.encoder.block_count": (2, u64),
        "whisper.encoder.mels_count": (80, u64),
        "whisper.encoder.attention.head_count": (4, u64),
        "whisper.decoder.context_length": (40, u64),
        "whisper.decoder.embedding_length": (32, u64),
        "whisper.decoder.block_count": (3, u64),
        "whisper.decoder.attention.head_count": (2, u64),
        "whisper.encoder.feed_forward_length": (64, u64),
        "whisper.decoder.feed_forward_length": (96, u64),
    }
    assert {k: keys[k] for k in expected} == expected


def test_decoder_start_token_is_the_configs(whisper_case, whisper_f32):
    tokenizer = transformers.AutoTokenizer.from_pretrained(whisper_case[0])
    sot = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    assert whisper_f32[0]["whisper.decoder_start_token_id"] == (sot, "UINT32")


def test_tokenizer_is_exported_as_it_ships(whisper_case, whisper_f32, tmp_path):
    """Every token at its id, special tokens as control tokens, and llama.cpp (reading the same
    keys as a gpt2 vocabulary) tokenizes as transformers does."""
    keys, _ = whisper_f32
    tokenizer = transformers.AutoTokenizer.from_pretrained(whisper_case[0])
    tokens = list(keys["tokenizer.ggml.tokens"][0])
    n = len(tokenizer)
    assert tokens[:n] == tokenizer.convert_ids_to_tokens(list(range(n)))
    assert len(tokens) == CONFIG["vocab_size"]
    types = list(keys["tokenizer.ggml.token_type"][0])
    for special in WHISPER_SPECIALS + ["<|endoftext|>"]:
        assert types[tokenizer.convert_tokens_to_ids(special)] == 3, special
    assert keys["tokenizer.ggml.model"] == ("gpt2", "STRING")

    from ggufsmith.tokenizer import export_tokenizer

    vocab = tokenizer_helpers.write_vocab_gguf(
        export_tokenizer(whisper_case[0], vocab_size=CONFIG["vocab_size"]), tmp_path / "v.gguf", arch="gpt2")
    llm = tokenizer_helpers.load_llama_vocab(vocab)
    text = tokenizer_helpers.CHECK_TEXT + "<|startoftranscript|><|en|><|transcribe|> hi"
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == expected


def test_every_tensor_is_documented_and_equals_the_hf_weight(whisper_case, whisper_f32):
    _, state, _ = whisper_case
    _, tensors = whisper_f32
    rows = documented_names("whisper")
    # proj_out is tied to the token embedding and not saved, so not converted
    documented = {documented_gguf_name(rows, hf): hf for hf in state if hf != "proj_out.weight"}
    assert None not in documented, "an HF tensor has no documented GGUF name"
    assert set(tensors) == set(documented) | {MEL_FILTERS}
    for name, hf in documented.items():
        assert tensors[name][1] == "F32"
        np.testing.assert_array_equal(dequantized(tensors[name]), state[hf], err_msg=name)


def test_mel_filters_are_the_feature_extractors(whisper_case, whisper_f32):
    _, _, extractor = whisper_case
    entry = whisper_f32[1][MEL_FILTERS]
    assert entry[1] == "F32"
    np.testing.assert_array_equal(dequantized(entry), extractor.mel_filters.T.astype(np.float32))


@pytest.mark.parametrize("n_mels, n_fft, sampling_rate", [(128, 400, 16000), (80, 512, 16000), (64, 400, 22050)])
def test_mel_filters_follow_the_preprocessor_config(tmp_path, n_mels, n_fft, sampling_rate):
    extractor = transformers.WhisperFeatureExtractor(feature_size=n_mels, n_fft=n_fft, sampling_rate=sampling_rate)
    extractor.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG | {"num_mel_bins": n_mels}))
    plugin = Whisper(HFConfig.from_dir(tmp_path))
    filters = plugin.extra_tensors()[MEL_FILTERS].load()
    np.testing.assert_array_equal(filters, extractor.mel_filters.T.astype(np.float32))


def test_mel_count_disagreeing_with_the_config_is_refused(tmp_path):
    from ggufsmith.errors import ConversionError

    transformers.WhisperFeatureExtractor(feature_size=128).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(ConversionError, match="feature_size 128"):
        Whisper(HFConfig.from_dir(tmp_path)).extra_tensors()


def test_untied_output_projection_is_kept(whisper_case):
    from tests.archs_other_helpers import lazy_source

    _, state, _ = whisper_case
    plugin = Whisper(HFConfig(CONFIG | {"tie_word_embeddings": False}))
    names = {t.name: t.sources for t in plugin.map_tensors(lazy_source(state))}
    assert names["output.weight"] == ("proj_out.weight",)


def test_f16_file_holds_the_weights_rounded_to_f16(whisper_case, tmp_path):
    """2-D weights become F16 (rounded as torch rounds them); norms, biases, conv kernels,
    position tables and the mel filters stay F32 and exact."""
    _, state, extractor = whisper_case
    _, tensors = read_gguf(convert_for_tests(whisper_case[0], tmp_path / "whisper-f16.gguf", "f16"))
    rows = documented_names("whisper")
    documented = {documented_gguf_name(rows, hf): hf for hf in state if hf != "proj_out.weight"}
    for name, hf in documented.items():
        f16 = len(state[hf].shape) == 2 and "pos_embd" not in name
        assert tensors[name][1] == ("F16" if f16 else "F32"), name
        expected = torch.from_numpy(state[hf]).half().float().numpy() if f16 else state[hf]
        np.testing.assert_array_equal(dequantized(tensors[name]), expected, err_msg=name)
    assert tensors[MEL_FILTERS][1] == "F32"


def test_registry_claims_rwkv_and_whisper():
    from ggufsmith.arch.registry import find_architecture
    from ggufsmith.arch.rwkv import Rwkv

    assert find_architecture(HFConfig(CONFIG)) is Whisper
    assert find_architecture(HFConfig({"architectures": ["RwkvForCausalLM"]})) is Rwkv
