"""Tiny random-weight T5 models (transformers) with a SentencePiece Unigram tokenizer trained here.

The tokenizer: a Unigram model (nmt_nfkc) as T5 ships it, spiece.model (which llama.cpp's converter
reads) beside the tokenizer.json transformers saves from it, with 4 <extra_id_N> sentinels. The models:
3 encoder and 2 decoder blocks, d_model 64, 4 heads of 16, 8 relative-position buckets; RMS-norm
weights redrawn around 1 (spread 0.2) and the relative-attention biases redrawn at N(0, 1), so a
lost norm or bias moves the output by far more than the tolerances.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from tests.tokenizer_helpers import training_text


def train_t5_unigram(model_dir: Path, vocab_size: int = 1500) -> None:
    import sentencepiece as spm
    import transformers

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_text()), model_writer=buffer, model_type="unigram",
                                   vocab_size=vocab_size, character_coverage=0.9995, hard_vocab_limit=False,
                                   minloglevel=2, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "spiece.model").write_bytes(buffer.getvalue())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 4}))
    transformers.AutoTokenizer.from_pretrained(model_dir).save_pretrained(model_dir)


def build_t5(model_dir: Path, *, feed_forward_proj: str, tie_word_embeddings: bool, encoder_only: bool = False,
             mt5: bool = False, seed: int = 0) -> Path:
    """T5ForConditionalGeneration (T5EncoderModel; MT5ForConditionalGeneration) for the tokenizer
    already in `model_dir`."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    config = (transformers.MT5Config if mt5 else transformers.T5Config)(
        vocab_size=len(tokenizer) + 3, d_model=64, d_kv=16, d_ff=96, num_layers=3, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, feed_forward_proj=feed_forward_proj,
        tie_word_embeddings=tie_word_embeddings, decoder_start_token_id=0)
    torch.manual_seed(seed)
    model_class = (transformers.T5EncoderModel if encoder_only else
                   transformers.MT5ForConditionalGeneration if mt5 else transformers.T5ForConditionalGeneration)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif "relative_attention_bias" in name:
                param.copy_(torch.randn_like(param))
    model.save_pretrained(model_dir)
    return model_dir
