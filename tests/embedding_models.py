"""Tiny ModernBERT and EmbeddingGemma models in sentence-transformers folders, built with transformers.

ModernBERT: a random ModernBertModel or ModernBertForMaskedLM (4 blocks, hidden 64, a sliding window of 8 tokens on
every second block, different rope bases for global and local blocks) with a byte-level
BPE trained here whose post-processor gives `[CLS] text [SEP]`, as ModernBERT's tokenizer does.
EmbeddingGemma: a random Gemma3TextModel with use_bidirectional_attention (4 blocks, GQA, a window of
8 on a layer pattern that is not llama.cpp's default), the tests' SentencePiece tokenizer adding
<s> and </s>, and after mean pooling two Dense modules (64 -> 128 -> 64, no bias, identity
activation) as google/embeddinggemma-300m has them (768 -> 3072 -> 768).
Weights are redrawn large (matrices N(0, 0.15), norms spread) so that every layer matters.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.bert_models import write_sentence_transformers_modules
from tests.family_models import randomize
from tests.gemma_models import HEAD_DIM, HEADS, KV_HEADS, VOCAB
from tests.tokenizer_helpers import train_sentencepiece, training_text, write_tokenizer_config

HIDDEN = 64
WINDOW = 8
MODERNBERT_SPECIAL = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
DENSE_WIDTH = 128


def train_modernbert_bpe(model_dir: Path, vocab_size: int = 700):
    """A byte-level BPE with ModernBERT's special tokens and `[CLS] $A [SEP]`, saved by transformers."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=MODERNBERT_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(training_text(), trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, cls_token="[CLS]", sep_token="[SEP]",
                                                unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")
    fast.save_pretrained(model_dir)
    return fast


def build_modernbert(model_dir: Path, seed: int = 0, masked_lm: bool = False) -> Path:
    """A random ModernBertModel (with masked_lm, a ModernBertForMaskedLM: the encoder under "model.",
    a prediction head beside it) in a sentence-transformers folder with mean pooling."""
    import torch
    import transformers

    tokenizer = train_modernbert_bpe(model_dir)
    ids = {role: tokenizer.convert_tokens_to_ids(text) for role, text in
           (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"))}
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=128, local_attention=WINDOW, norm_eps=1e-5,
        # global every second layer (global_attn_every_n_layers=2), not llama.cpp's default of every third
        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
        bos_token_id=ids["cls"], cls_token_id=ids["cls"], eos_token_id=ids["sep"], sep_token_id=ids["sep"],
        pad_token_id=ids["pad"])
    torch.manual_seed(seed)
    model = (transformers.ModernBertForMaskedLM if masked_lm else transformers.ModernBertModel)(config)
    randomize(model)
    model.save_pretrained(model_dir)
    write_sentence_transformers_modules(model_dir, "mean", HIDDEN)
    return model_dir


def build_embeddinggemma(model_dir: Path, seed: int = 0, dense: bool = True) -> Path:
    import torch
    import transformers

    train_sentencepiece(model_dir, add_dummy_prefix=False)  # as Gemma 3's tokenizer.model
    write_tokenizer_config(model_dir, tokenizer_class="GemmaTokenizer", add_eos_token=True)
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=256, rms_norm_eps=1e-6,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, num_hidden_layers=4, query_pre_attn_scalar=HEAD_DIM,
        sliding_window=WINDOW, use_bidirectional_attention=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})
    torch.manual_seed(seed)
    model = transformers.Gemma3TextModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.5 if name.endswith("norm.weight") else 0.15)  # norms: offsets from 1
    model.save_pretrained(model_dir)
    denses = [(HIDDEN, DENSE_WIDTH), (DENSE_WIDTH, HIDDEN)] if dense else []
    for i, (n_in, n_out) in enumerate(denses):
        write_dense(model_dir / f"{i + 2}_Dense", torch.randn(n_out, n_in) * n_in ** -0.5)
    write_sentence_transformers_modules(model_dir, "mean", HIDDEN, denses=len(denses))
    return model_dir


def write_dense(folder: Path, weight, *, bias=None,
                activation: str = "torch.nn.modules.linear.Identity") -> None:
    """A sentence-transformers Dense module: config.json and model.safetensors (linear.weight/bias)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    n_out, n_in = weight.shape
    (folder / "config.json").write_text(json.dumps({"in_features": n_in, "out_features": n_out,
                                                    "bias": bias is not None, "activation_function": activation}))
    tensors = {"linear.weight": weight.contiguous()}
    if bias is not None:
        tensors["linear.bias"] = bias.contiguous()
    save_file(tensors, folder / "model.safetensors")
