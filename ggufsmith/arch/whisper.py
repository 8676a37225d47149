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

from pathlib import Path

import numpy as np

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.common import weights_and_biases
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.jsonfile import read_json

MEL_FILTERS = "enc.mel_filters.weight"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
# WhisperFeatureExtractor's defaults, used when the folder has no preprocessor_config.json.
DEFAULT_N_FFT = 400
DEFAULT_SAMPLING_RATE = 16000
# The feature extractor's mel bands always span 0..8000 Hz, whatever the sampling rate.
MEL_MAX_HZ = 8000.0


def _attention(hf: str, gguf: str, blocks: str) -> dict[str, T]:
    """q/v/out projections with bias, k without (Whisper's k_proj has no bias)."""
    projection = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "out_proj": "output"}
    table = {f"{hf}.{p}.weight": T(f"{gguf}_{g}.weight", "n_embd", "n_embd", blocks=blocks) for p, g in projection.items()}
    table.update({f"{hf}.{p}.bias": T(f"{gguf}_{g}.bias", "n_embd", blocks=blocks) for p, g in projection.items() if p != "k_proj"})
    return table


def _block(hf: str, gguf: str, side: str) -> dict[str, T]:
    """Self-attention and feed-forward of one encoder or decoder layer (side: "enc" or "dec")."""
    blocks, n_ff = f"n_{side}_layer", f"n_{side}_ff"
    return {
        **_attention(f"{hf}.self_attn", f"{gguf}.attn", blocks),
        **weights_and_biases(
            {"self_attn_layer_norm": T("attn_norm", "n_embd", blocks=blocks),
             "final_layer_norm": T("ffn_norm", "n_embd", blocks=blocks),
             "fc1": T("ffn_up", n_ff, "n_embd", blocks=blocks), "fc2": T("ffn_down", "n_embd", n_ff, blocks=blocks)},
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
        **weights_and_biases({"model.encoder.conv1": T("enc.conv1d.1", "n_embd", "n_mels", 3),
                              "model.encoder.conv2": T("enc.conv1d.2", "n_embd", "n_embd", 3)}),
        "model.encoder.embed_positions.weight": T("enc.pos_embd.weight", "n_enc_ctx", "n_embd"),
        **_block("model.encoder.layers.{bid}", "enc.blk.{bid}", "enc"),
        **weights_and_biases({"model.encoder.layer_norm": T("enc.output_norm", "n_embd")}),
        "model.decoder.embed_tokens.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        "model.decoder.embed_positions.weight": T("dec.pos_embd.weight", "n_dec_ctx", "n_embd"),
        **_block("model.decoder.layers.{bid}", "dec.blk.{bid}", "dec"),
        **weights_and_biases({"model.decoder.layers.{bid}.encoder_attn_layer_norm":
                              T("dec.blk.{bid}.cross_attn_norm", "n_embd", blocks="n_dec_layer")}),
        **_attention("model.decoder.layers.{bid}.encoder_attn", "dec.blk.{bid}.cross_attn", "n_dec_layer"),
        **weights_and_biases({"model.decoder.layer_norm": T("dec.output_norm", "n_embd")}),
        "proj_out.weight": T("output.weight", "n_vocab", "n_embd", optional=True),
    }
    # Conv kernels have rows of 3 (no block type fits); position tables and the mel bank are
    # kept exact as llama.cpp keeps its position embeddings.
    f32_tensors = (r"enc\.conv1d\.\d\.weight", r"(enc|dec)\.pos_embd\.weight", r"enc\.mel_filters\.weight")

    def dims(self) -> dict[str, int]:
        c = self.config
        return {"n_embd": c.get_int("d_model", min=1), "n_mels": c.get_int("num_mel_bins", min=1),
                "n_enc_layer": c.get_int("encoder_layers", min=1), "n_dec_layer": c.get_int("decoder_layers", min=1),
                "n_enc_ff": c.get_int("encoder_ffn_dim", min=1), "n_dec_ff": c.get_int("decoder_ffn_dim", min=1),
                "n_enc_ctx": c.get_int("max_source_positions", min=1), "n_dec_ctx": c.get_int("max_target_positions", min=1)}

    def metadata(self) -> Metadata:
        c, d = self.config, self.dims()
        m = Metadata()
        keys = ArchKeys(m, self.name)
        w = Keys.Whisper
        keys.u64(w.ENCODER_CONTEXT_LENGTH, d["n_enc_ctx"])
        keys.u64(w.ENCODER_EMBEDDING_LENGTH, d["n_embd"])
        keys.u64(w.ENCODER_BLOCK_COUNT, d["n_enc_layer"])
        keys.u64(w.ENCODER_MELS_COUNT, d["n_mels"])
        keys.u64(w.ENCODER_HEAD_COUNT, c.get_int("encoder_attention_heads", min=1))
        keys.u64(w.ENCODER_FEED_FORWARD_LENGTH, d["n_enc_ff"])
        keys.u64(w.DECODER_CONTEXT_LENGTH, d["n_dec_ctx"])
        keys.u64(w.DECODER_EMBEDDING_LENGTH, d["n_embd"])
        keys.u64(w.DECODER_BLOCK_COUNT, d["n_dec_layer"])
        keys.u64(w.DECODER_HEAD_COUNT, c.get_int("decoder_attention_heads", min=1))
        keys.u64(w.DECODER_FEED_FORWARD_LENGTH, d["n_dec_ff"])
        keys.u32(Keys.LLM.DECODER_START_TOKEN_ID, c.get_int("decoder_start_token_id", default=None))
        return m

    def extra_tensors(self) -> dict[str, LazyTensor]:
        n_mels = self.config.get_int("num_mel_bins", min=1)
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
        settings = HFConfig(read_json(path), path)
        n_mels = settings.get_int("feature_size", default=self.config.get_int("num_mel_bins"))
        if n_mels != self.config.get_int("num_mel_bins"):
            raise ConversionError(
                f"{path}: feature_size {n_mels} differs from num_mel_bins in config.json; "
                "the encoder could not read these features"
            )
        return (settings.get_int("n_fft", default=DEFAULT_N_FFT, min=2),
                settings.get_int("sampling_rate", default=DEFAULT_SAMPLING_RATE, min=1))


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
