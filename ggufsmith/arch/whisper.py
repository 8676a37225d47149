"""Whisper (WhisperForConditionalGeneration): an audio encoder and a text decoder.

Keys: the spec's `whisper.encoder.*` / `whisper.decoder.*` set (uint64, as the spec types the
[llm] keys they share definitions with), plus the fc widths and the decoder start token.

Tensor names: the encoder under `enc.`, the decoder under `dec.`, blocks as in llama.cpp's
encoder-decoder models (`enc.blk.N.attn_q`, `dec.blk.N.cross_attn_q`, ...), the token embedding
as the plain `token_embd` (it is also the output projection when tied). Every weight is stored as
HF stores it; the only synthesized tensor is `enc.mel_filters`, the mel filter bank the feature
extractor applies to the power spectrum, shape (n_mels, n_fft // 2 + 1) in numpy order (one row
per mel band, as openai/whisper and whisper.cpp hold it; transformers holds its transpose).

No GGML runtime loads whisper from a GGUF file yet.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.arch.common import weights_and_biases
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata

MEL_FILTERS = "enc.mel_filters.weight"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
# WhisperFeatureExtractor's defaults, used when the folder has no preprocessor_config.json.
DEFAULT_N_FFT = 400
DEFAULT_SAMPLING_RATE = 16000
# The feature extractor's mel bands always span 0..8000 Hz, whatever the sampling rate.
MEL_MAX_HZ = 8000.0


def _attention(hf: str, gguf: str) -> dict[str, str]:
    """q/v/out projections with bias, k without (Whisper's k_proj has no bias)."""
    table = {f"{hf}.k_proj.weight": f"{gguf}_k.weight"}
    for hf_proj, gguf_proj in (("q_proj", "q"), ("v_proj", "v"), ("out_proj", "output")):
        for part in ("weight", "bias"):
            table[f"{hf}.{hf_proj}.{part}"] = f"{gguf}_{gguf_proj}.{part}"
    return table


def _block(hf: str, gguf: str) -> dict[str, str]:
    """Self-attention and feed-forward of one encoder or decoder layer."""
    return {
        **_attention(f"{hf}.self_attn", f"{gguf}.attn"),
        **weights_and_biases(
            {"self_attn_layer_norm": "attn_norm", "final_layer_norm": "ffn_norm", "fc1": "ffn_up", "fc2": "ffn_down"},
            hf_prefix=f"{hf}.",
            gguf_prefix=f"{gguf}.",
        ),
    }


class Whisper(Architecture):
    name = "whisper"
    hf_classes = ("WhisperForConditionalGeneration",)
    model_types = ("whisper",)
    tokenizer_kind = "gpt2"  # tokenizer.json, byte-level BPE with Whisper's special tokens
    tied_output_head = r"proj_out\.weight"
    tensor_names = {
        **weights_and_biases({"model.encoder.conv1": "enc.conv1d.1", "model.encoder.conv2": "enc.conv1d.2"}),
        "model.encoder.embed_positions.weight": "enc.pos_embd.weight",
        **_block("model.encoder.layers.{bid}", "enc.blk.{bid}"),
        **weights_and_biases({"model.encoder.layer_norm": "enc.output_norm"}),
        "model.decoder.embed_tokens.weight": "token_embd.weight",
        "model.decoder.embed_positions.weight": "dec.pos_embd.weight",
        **_block("model.decoder.layers.{bid}", "dec.blk.{bid}"),
        **weights_and_biases({"model.decoder.layers.{bid}.encoder_attn_layer_norm": "dec.blk.{bid}.cross_attn_norm"}),
        **_attention("model.decoder.layers.{bid}.encoder_attn", "dec.blk.{bid}.cross_attn"),
        **weights_and_biases({"model.decoder.layer_norm": "dec.output_norm"}),
        "proj_out.weight": "output.weight",
    }
    # Conv kernels have rows of 3 (no block type fits); position tables and the mel bank are
    # kept exact as llama.cpp keeps its position embeddings.
    f32_tensors = (r"enc\.conv1d\.\d\.weight", r"(enc|dec)\.pos_embd\.weight", r"enc\.mel_filters\.weight")

    def metadata(self) -> Metadata:
        c = self.config
        d_model = c.get("d_model")
        m = Metadata()
        keys = ArchKeys(m, self.name)
        w = Keys.Whisper
        keys.u64(w.ENCODER_CONTEXT_LENGTH, c.get("max_source_positions"))
        keys.u64(w.ENCODER_EMBEDDING_LENGTH, d_model)
        keys.u64(w.ENCODER_BLOCK_COUNT, c.get("encoder_layers"))
        keys.u64(w.ENCODER_MELS_COUNT, c.get("num_mel_bins"))
        keys.u64(w.ENCODER_HEAD_COUNT, c.get("encoder_attention_heads"))
        keys.u64(w.ENCODER_FEED_FORWARD_LENGTH, c.get("encoder_ffn_dim"))
        keys.u64(w.DECODER_CONTEXT_LENGTH, c.get("max_target_positions"))
        keys.u64(w.DECODER_EMBEDDING_LENGTH, d_model)
        keys.u64(w.DECODER_BLOCK_COUNT, c.get("decoder_layers"))
        keys.u64(w.DECODER_HEAD_COUNT, c.get("decoder_attention_heads"))
        keys.u64(w.DECODER_FEED_FORWARD_LENGTH, c.get("decoder_ffn_dim"))
        keys.u32(Keys.LLM.DECODER_START_TOKEN_ID, c.get("decoder_start_token_id", default=None))
        return m

    def extra_tensors(self) -> dict[str, LazyTensor]:
        n_mels = self.config.get("num_mel_bins")
        n_fft, sampling_rate = self._feature_extractor_settings()
        source = f"{self.config.path.parent / PREPROCESSOR_CONFIG} (computed)"
        return {
            MEL_FILTERS: LazyTensor(
                (n_mels, n_fft // 2 + 1),
                "F32",
                lambda: slaney_mel_filters(n_mels, n_fft, sampling_rate, MEL_MAX_HZ).astype(np.float32),
                source,
            )
        }

    def _feature_extractor_settings(self) -> tuple[int, int]:
        path = Path(self.config.path).parent / PREPROCESSOR_CONFIG
        if not path.is_file():
            return DEFAULT_N_FFT, DEFAULT_SAMPLING_RATE
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ConversionError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        n_mels = values.get("feature_size", self.config.get("num_mel_bins"))
        if n_mels != self.config.get("num_mel_bins"):
            raise ConversionError(
                f"{path}: feature_size {n_mels} differs from num_mel_bins in config.json; "
                "the encoder could not read these features"
            )
        return int(values.get("n_fft", DEFAULT_N_FFT)), int(values.get("sampling_rate", DEFAULT_SAMPLING_RATE))


def slaney_mel_filters(n_mels: int, n_fft: int, sampling_rate: int, max_hz: float) -> np.ndarray:
    """Slaney-style triangular mel filters with area normalization, (n_mels, n_fft // 2 + 1), float64.

    Mel scale (Slaney's Auditory Toolbox): linear, 3 mels per 200 Hz, up to 1000 Hz (15 mels);
    logarithmic above, 27 mels per factor 6.4. Band i spans centers i..i+2 of n_mels + 2 points
    equally spaced in mel from 0 Hz to max_hz; each triangle is scaled by 2 / its width in Hz so
    that every band carries about the same energy.
    """
    break_hz, break_mel = 1000.0, 15.0
    mels_per_log_hz = 27.0 / np.log(6.4)

    def mel_from_hz(hz: np.ndarray) -> np.ndarray:
        linear = 3.0 * hz / 200.0
        logarithmic = break_mel + np.log(np.maximum(hz, break_hz) / break_hz) * mels_per_log_hz
        return np.where(hz >= break_hz, logarithmic, linear)

    def hz_from_mel(mel: np.ndarray) -> np.ndarray:
        linear = 200.0 * mel / 3.0
        logarithmic = break_hz * np.exp((np.maximum(mel, break_mel) - break_mel) / mels_per_log_hz)
        return np.where(mel >= break_mel, logarithmic, linear)

    edges_mel = np.linspace(mel_from_hz(np.float64(0.0)), mel_from_hz(np.float64(max_hz)), n_mels + 2)
    edges_hz = hz_from_mel(edges_mel)
    bin_hz = np.linspace(0, sampling_rate // 2, n_fft // 2 + 1)

    lower, center, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bin_hz[None, :] - lower) / (center - lower)
    falling = (upper - bin_hz[None, :]) / (upper - center)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return triangles * (2.0 / (upper - lower))
