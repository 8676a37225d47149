"""Export a Hugging Face tokenizer directory as the `tokenizer.*` GGUF keys llama.cpp reads.

Two kinds are supported:
  "llama"  a SentencePiece BPE tokenizer.model (tokens, scores, types; llama.cpp's SPM tokenizer),
           or, without one, a SentencePiece-style (byte_fallback, "▁") BPE tokenizer.json
  "gpt2"   a byte-level BPE (tokens, merges, types, and the named pre-tokenizer), from tokenizer.json
           or, without one, from the slow files vocab.json + merges.txt, or from Meta's Llama 3
           tokenizer.model (a tiktoken file: tiktoken_file.py)
  "gemma4" Gemma 4's tokenizer.json (BPE merges over "▁"-escaped text; llama.cpp's gemma4 tokenizer),
           chosen by the architecture plugin
  "rwkv"   an RWKV world vocabulary file (llama.cpp's RWKV greedy byte-trie tokenizer)
  "bert"   a WordPiece tokenizer.json or vocab.txt (llama.cpp's WPM tokenizer; wordpiece.py)
  "t5"     a SentencePiece Unigram: tokenizer.json, spiece.model, sentencepiece.bpe.model or tokenizer.model
           (llama.cpp's UGM tokenizer; unigram.py)
What llama.cpp's own converter converts is converted. Where llama.cpp will then tokenize some text
differently from transformers / sentencepiece (a normalization it does not apply, added tokens that
strip spaces, ...), one warning says what differs and for which text; with strict=True that is a
TokenizerError instead. What llama.cpp cannot represent at all (suffix
spaces, ...) is always a TokenizerError.

Public readers of the untrusted files (each raises only TokenizerError): load_tokenizer_json(path),
load_sentencepiece_model(path).
"""

from __future__ import annotations

from pathlib import Path

from ggufsmith.errors import TokenizerError
from ggufsmith.gguf_writer.metadata import Metadata

from .bpe import load_bpe_vocabulary
from .bpe_vocab_files import MERGES_TXT, VOCAB_JSON, has_bpe_vocab_files, tokenizer_json_from_vocab_files
from .chat_template import add_chat_template_metadata
from .differences import TokenizationDifferences
from .gemma4 import load_gemma4_vocabulary
from .hf_files import TOKENIZER_JSON, TOKENIZER_MODEL, TokenizerFiles
from .pretokenizer import identify_pre_tokenizer
from .rwkv_world import RWKV_WORLD_VOCAB, export_rwkv_world, has_rwkv_world_vocab
from .sentencepiece import is_sentencepiece_model, load_sentencepiece_vocabulary
from .sentencepiece import load_model_proto as load_sentencepiece_model
from .sentencepiece_json import is_sentencepiece_style, load_sentencepiece_json_vocabulary
from .special_tokens import add_special_tokens_metadata
from .tiktoken_file import is_tiktoken_file, tokenizer_json_from_tiktoken
from .tokenizer_json import load_tokenizer_json
from .unigram import is_fairseq_model, is_unigram_json, load_unigram_vocabulary, unigram_model_file
from .wordpiece import (
    VOCAB_TXT, has_vocab_txt, is_wordpiece, load_wordpiece_vocabulary, mark_word_starts, pair_adds_separator,
    special_token_fallbacks,
)

__all__ = ["KINDS", "detect_kind", "export_tokenizer", "identify_pre_tokenizer", "load_sentencepiece_model",
           "load_tokenizer_json"]

KINDS = ("llama", "gpt2", "gemma4", "rwkv", "bert", "t5")


def detect_kind(model_dir: Path, tokenizer_json: dict | None = None) -> str:
    """"t5" for a Unigram tokenizer.json, or a Unigram SentencePiece model (spiece.model,
    sentencepiece.bpe.model, tokenizer.model) without another tokenizer.json; "llama" if
    tokenizer.model is a SentencePiece (BPE) model, else from tokenizer.json: "llama" for a
    SentencePiece-style BPE (byte_fallback), "bert" for WordPiece, "gpt2" for anything else (checked
    when exported); without either, "bert" for a vocab.txt.
    `tokenizer_json` is the already parsed tokenizer.json, if the caller has it."""
    model_file = model_dir / TOKENIZER_MODEL
    json_file = model_dir / TOKENIZER_JSON
    if json_file.is_file() and tokenizer_json is None:
        tokenizer_json = load_tokenizer_json(json_file)
    if is_unigram_json(tokenizer_json or {}) or (not json_file.is_file() and unigram_model_file(model_dir)):
        return "t5"
    if model_file.is_file() and not json_file.is_file() and is_tiktoken_file(model_file):
        return "gpt2"  # Meta's Llama 3 tokenizer.model
    if model_file.is_file() and (not json_file.is_file() or is_sentencepiece_model(model_file)):
        return "llama"
    if json_file.is_file():
        if is_wordpiece(tokenizer_json):
            return "bert"
        return "llama" if is_sentencepiece_style(tokenizer_json) else "gpt2"
    if has_bpe_vocab_files(model_dir):
        return "gpt2"
    if has_rwkv_world_vocab(model_dir):
        return "rwkv"
    if has_vocab_txt(model_dir):
        return "bert"
    raise TokenizerError(
        f"{model_dir}: no tokenizer found (expected {TOKENIZER_MODEL}, {TOKENIZER_JSON}, "
        f"{VOCAB_JSON} + {MERGES_TXT}, {VOCAB_TXT} or {RWKV_WORLD_VOCAB})"
    )


def export_tokenizer(
    model_dir: Path, *, vocab_size: int | None = None, kind: str | None = None, strict: bool = False
) -> Metadata:
    """Every tokenizer.* key llama.cpp reads for the tokenizer in `model_dir`.

    `vocab_size` (config.json's) pads the vocabulary with unused [PAD<id>] tokens up to the model's
    embedding rows; a larger tokenizer is an error. `kind` (one of KINDS) overrides detection.
    `strict` refuses a tokenizer that llama.cpp would apply differently on some text (see above).
    """
    model_dir = Path(model_dir)
    json_file = model_dir / TOKENIZER_JSON
    tokenizer_json = load_tokenizer_json(json_file)  # {} when absent; parsed once, it can be large
    kind = kind or detect_kind(model_dir, tokenizer_json)
    if kind == "rwkv":
        return export_rwkv_world(model_dir, vocab_size=vocab_size)
    files = TokenizerFiles.load(model_dir)
    differences = TokenizationDifferences(model_dir)
    post_processor = None
    fallback_ids: dict[str, int] = {}
    add_sep = None  # tokenizer.ggml.add_sep_token; None: llama.cpp's default for the kind
    if kind == "llama":
        model_file = model_dir / TOKENIZER_MODEL
        # Without a SentencePiece-style tokenizer.json to fall back on, a damaged tokenizer.model is
        # read anyway, so that the error says what is wrong with it.
        if model_file.is_file() and (is_sentencepiece_model(model_file) or not is_sentencepiece_style(tokenizer_json)):
            vocab, fallback_ids = load_sentencepiece_vocabulary(
                model_dir, files, model_file, tokenizer_json, differences
            )
        elif is_sentencepiece_style(tokenizer_json):
            vocab = load_sentencepiece_json_vocabulary(json_file, tokenizer_json, files, differences)
            post_processor = tokenizer_json.get("post_processor")
        else:
            raise TokenizerError(
                f"{model_file}: missing or not SentencePiece, and no SentencePiece-style {TOKENIZER_JSON}; "
                "a 'llama' tokenizer needs one of them"
            )
        # transformers' LlamaTokenizer adds <s> but not </s> unless tokenizer_config.json says otherwise.
        default_add_bos, default_add_eos = True, False
    elif kind == "gpt2":
        source = json_file
        if not json_file.is_file() and is_tiktoken_file(model_dir / TOKENIZER_MODEL):
            source = model_dir / TOKENIZER_MODEL
            tokenizer_json, files = tokenizer_json_from_tiktoken(source, model_dir)
        elif not json_file.is_file():
            if not has_bpe_vocab_files(model_dir):
                raise TokenizerError(
                    f"{json_file}: missing, and no {VOCAB_JSON} + {MERGES_TXT}; "
                    "a 'gpt2' (BPE) tokenizer needs one of them"
                )
            tokenizer_json = tokenizer_json_from_vocab_files(model_dir, files)
            source = model_dir / VOCAB_JSON
        vocab = load_bpe_vocabulary(source, tokenizer_json, files, differences)
        post_processor = tokenizer_json.get("post_processor")
        default_add_bos, default_add_eos = False, False
        # RoBERTa's </s></s> between a pair of texts; else llama.cpp's default (none) is right
        add_sep = True if pair_adds_separator(post_processor, source) else None
    elif kind == "gemma4":
        if not is_sentencepiece_style(tokenizer_json):
            raise TokenizerError(f"{json_file}: missing or not a BPE with byte_fallback; a 'gemma4' tokenizer needs it")
        vocab = load_gemma4_vocabulary(json_file, tokenizer_json, files, differences)
        post_processor = tokenizer_json.get("post_processor")
        default_add_bos, default_add_eos = True, False  # GemmaTokenizer's defaults
    elif kind == "bert":
        if tokenizer_json and not is_wordpiece(tokenizer_json):
            raise TokenizerError(f"{json_file}: not a WordPiece model; a 'bert' tokenizer needs one")
        if not tokenizer_json and not has_vocab_txt(model_dir):
            raise TokenizerError(f"{model_dir}: neither a WordPiece {TOKENIZER_JSON} nor a {VOCAB_TXT}; "
                                 "a 'bert' tokenizer needs one of them")
        vocab = load_wordpiece_vocabulary(model_dir, tokenizer_json, files, differences)
        post_processor = tokenizer_json.get("post_processor")
        fallback_ids = special_token_fallbacks(vocab)
        default_add_bos, default_add_eos = True, True  # BertTokenizer: [CLS] text [SEP]
        add_sep = pair_adds_separator(post_processor, json_file)
    elif kind == "t5":
        vocab, fallback_ids = load_unigram_vocabulary(model_dir, tokenizer_json, json_file, files, differences)
        post_processor = tokenizer_json.get("post_processor")
        default_add_bos, default_add_eos = False, True  # T5Tokenizer: text </s>
        add_sep = pair_adds_separator(post_processor, json_file)  # XLM-R's </s></s>; T5's pair has one </s>
        if post_processor is None and is_fairseq_model(vocab.source):
            default_add_bos, add_sep = True, True  # XLMRobertaTokenizer: <s> A </s></s> B </s>
    else:
        raise TokenizerError(f"{model_dir}: unknown tokenizer kind {kind!r} (expected one of {', '.join(KINDS)})")

    if vocab_size is not None:
        vocab.pad_to(vocab_size)
    if kind == "bert":
        mark_word_starts(vocab)  # after padding, as llama.cpp's converter; control tokens keep their texts
    vocab.check_unique()
    differences.report(strict)

    metadata = Metadata()
    vocab.to_metadata(metadata)
    add_special_tokens_metadata(
        metadata,
        files,
        vocab,
        default_add_bos=default_add_bos,
        default_add_eos=default_add_eos,
        post_processor=post_processor,
        fallback_ids=fallback_ids,
        add_sep=add_sep,
    )
    add_chat_template_metadata(metadata, model_dir, files.tokenizer_config)
    return metadata
