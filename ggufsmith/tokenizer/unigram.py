"""A SentencePiece Unigram tokenizer -> llama.cpp's "t5" (UGM) tokenizer.

llama.cpp's UGM tokenizer is SentencePiece's Unigram: it normalizes the text with the model's own
precompiled character map (the compiled NFKC-style rules sentencepiece stores in the model, which
we copy as bytes into `tokenizer.ggml.precompiled_charsmap`), escapes spaces as "▁" (one before
the text when `add_space_prefix`; with `remove_extra_whitespaces`, runs of spaces become one "▁"
before each word and leading/trailing spaces go), then finds the segmentation with the highest sum
of piece scores (Viterbi). So it needs the pieces, their log-probability scores and types, and
those three settings. Sources, as T5, mT5, XLM-RoBERTa and their derivatives ship them:

- a Unigram `tokenizer.json` (what transformers saves): `model.vocab` is [[piece, score], ...],
  the charsmap is the base64 `precompiled_charsmap` of its Precompiled normalizer;
- a SentencePiece model file with model type UNIGRAM: `spiece.model` (T5), `tokenizer.model`, or
  `sentencepiece.bpe.model` (XLM-RoBERTa, whose ids fairseq shifts: see _fairseq_ids).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

from ggufsmith.constants import TokenType
from ggufsmith.errors import TokenizerError

from .differences import TokenizationDifferences, hf_normalizer_text, note_space_stripping
from .hf_files import TOKENIZER_CONFIG, TOKENIZER_MODEL, AddedToken, TokenizerFiles, get_typed, tokenizer_json_added_tokens
from .sentencepiece import added_token_entries, load_model_proto
from .sentencepiece_model import ModelProto
from .tokenizer_json import component_steps
from .vocab import Vocabulary, added_token_type

SPIECE_MODEL = "spiece.model"  # T5's name for its SentencePiece model
XLMR_SPIECE_MODEL = "sentencepiece.bpe.model"  # XLM-RoBERTa's (a Unigram model despite the name)
UNIGRAM_MODEL_FILES = (TOKENIZER_MODEL, SPIECE_MODEL, XLMR_SPIECE_MODEL)
_SP_UNIGRAM = 1  # sentencepiece_model.proto TrainerSpec.ModelType
_WHITESPACE_MARK = "\u2581"
# transformers' classes that build their own normalizer (the charsmap only) and pre-tokenizer
# (WhitespaceSplit, then Metaspace prepend_scheme always) around tokenizer.json's vocabulary.
_T5_CLASSES = {"T5Tokenizer", "T5TokenizerFast", "MT5Tokenizer", "MT5TokenizerFast"}
_OWN_PIPELINE_CLASSES = _T5_CLASSES | {"XLMRobertaTokenizer", "XLMRobertaTokenizerFast", "CamembertTokenizer",
                                       "CamembertTokenizerFast"}
_MAX_SENTINELS = 10_000  # T5 has 100; more is damage, and would grow the token list without bound
_MULTIPLE_SPACES = {"Regex": " {2,}"}  # the Replace step older converted tokenizer.json files carry


def is_unigram_json(tokenizer_json: dict[str, Any]) -> bool:
    return (tokenizer_json.get("model") or {}).get("type") == "Unigram"


def unigram_model_file(model_dir: Path) -> Path | None:
    """The first SentencePiece model file in `model_dir` that is a Unigram model, else None."""
    for name in UNIGRAM_MODEL_FILES:
        path = model_dir / name
        if path.is_file():
            try:
                proto = load_model_proto(path)
            except TokenizerError:
                continue
            if proto.trainer_spec.model_type == _SP_UNIGRAM:
                return path
    return None


def is_fairseq_model(path: Path) -> bool:
    """XLM-RoBERTa's SentencePiece model file, whose ids fairseq shifts."""
    return path.name == XLMR_SPIECE_MODEL


_CAMEMBERT_CLASSES = {"CamembertTokenizer", "CamembertTokenizerFast"}


def _fairseq_ids(proto: ModelProto) -> list[tuple[str, TokenType, float]]:
    """XLM-RoBERTa's ids: fairseq puts <s> <pad> </s> <unk> first and shifts every other piece of
    the SentencePiece model (whose own first three are <unk> <s> </s>) one id up, as transformers'
    XLMRobertaTokenizer does, and <mask> after them all."""
    head = [("<s>", TokenType.CONTROL, 0.0), ("<pad>", TokenType.CONTROL, 0.0), ("</s>", TokenType.CONTROL, 0.0),
            ("<unk>", TokenType.UNKNOWN, 0.0)]
    pieces = [(piece.piece, TokenType(piece.type), piece.score) for piece in proto.pieces[3:]]
    return head + pieces + [("<mask>", TokenType.CONTROL, 0.0)]


def _camembert_ids(proto: ModelProto) -> list[tuple[str, TokenType, float]]:
    """CamemBERT's ids, as transformers' CamembertTokenizer gives them: <s>NOTUSED <pad> </s>NOTUSED
    <unk> first, then every piece of the SentencePiece model four ids up (its own <unk> <s> </s>
    becoming <unk>NOTUSED, <s>, </s>), <mask> after them all."""
    head = [("<s>NOTUSED", TokenType.CONTROL, 0.0), ("<pad>", TokenType.CONTROL, 0.0),
            ("</s>NOTUSED", TokenType.CONTROL, 0.0), ("<unk>", TokenType.UNKNOWN, 0.0)]
    own = [("<unk>NOTUSED", TokenType.CONTROL, -100.0), ("<s>", TokenType.CONTROL, 0.0), ("</s>", TokenType.CONTROL, 0.0)]
    pieces = [(piece.piece, TokenType(piece.type), piece.score) for piece in proto.pieces[3:]]
    return head + own + pieces + [("<mask>", TokenType.CONTROL, 0.0)]


def _load_model_file(path: Path, vocab: Vocabulary, differences: TokenizationDifferences,
                     tokenizer_class: str | None) -> dict[str, int]:
    """Pieces, scores, types and normalizer settings of a Unigram model file; returns the special ids
    the model declares."""
    proto = load_model_proto(path)
    if proto.trainer_spec.treat_whitespace_as_suffix:
        raise TokenizerError(f"{path}: SentencePiece treat_whitespace_as_suffix is not supported by llama.cpp")
    normalizer = proto.normalizer_spec
    if not normalizer.escape_whitespaces:
        differences.add(f"{path.name}'s escape_whitespaces=false", "text with spaces (llama.cpp writes them as '▁')")
    if is_fairseq_model(path) and tokenizer_class in _CAMEMBERT_CLASSES:
        pieces = _camembert_ids(proto)
        declared = {"bos": 5, "pad": 1, "eos": 6, "unk": 3, "cls": 5, "sep": 6, "mask": len(pieces) - 1}
    elif is_fairseq_model(path):
        pieces = _fairseq_ids(proto)
        declared = {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "cls": 0, "sep": 2, "mask": len(pieces) - 1}
    else:
        pieces = [(piece.piece, TokenType(piece.type), piece.score) for piece in proto.pieces]
        spec = proto.trainer_spec
        declared = {role: i for role, i in (("unk", spec.unk_id), ("bos", spec.bos_id), ("eos", spec.eos_id),
                                            ("pad", spec.pad_id)) if 0 <= i < len(pieces)}
    if any(token_type == TokenType.BYTE for _, token_type, _ in pieces):
        # llama.cpp's UGM gives <unk> for a character no piece covers; sentencepiece its UTF-8 bytes.
        differences.add(f"{path.name}'s byte_fallback", "characters outside the vocabulary")
    for token_id, (text, token_type, score) in enumerate(pieces):
        vocab.set_token(token_id, text, token_type, score)
    vocab.add_space_prefix = normalizer.add_dummy_prefix
    vocab.remove_extra_whitespaces = normalizer.remove_extra_whitespaces
    vocab.precompiled_charsmap = _checked_charsmap(normalizer.precompiled_charsmap, f"{path}: normalizer_spec")
    return declared


def _checked_charsmap(data: bytes, where: str) -> bytes | None:
    """The charsmap if llama.cpp can load it (a little-endian uint32 size of the trie, the trie, then
    the replacement strings), None if empty; llama.cpp refuses to load any other as the whole model."""
    if not data:
        return None
    if len(data) < 4 or int.from_bytes(data[:4], "little") + 4 >= len(data):
        raise TokenizerError(f"{where} is not a SentencePiece precompiled charsmap (its trie size exceeds its length)")
    return data


def _charsmap(step: dict[str, Any], path: Path) -> bytes | None:
    value = get_typed(step, "precompiled_charsmap", str, path, prefix="normalizer.")
    try:
        data = base64.b64decode(value or "", validate=True)
    except (binascii.Error, ValueError):
        raise TokenizerError(f"{path}: normalizer.precompiled_charsmap is not base64") from None
    return _checked_charsmap(data, f"{path}: normalizer.precompiled_charsmap")


def _json_pipeline(tokenizer_json: dict[str, Any], path: Path, files: TokenizerFiles, vocab: Vocabulary,
                   differences: TokenizationDifferences) -> None:
    """The charsmap, add_space_prefix and remove_extra_whitespaces of the pipeline transformers runs."""
    charsmap = None
    other_steps = []
    replaces_space_runs = False
    for step in component_steps(tokenizer_json.get("normalizer"), "normalizers", path, "normalizer"):
        if step["type"] == "Precompiled":
            charsmap = _charsmap(step, path)
        elif step["type"] == "Replace" and step.get("pattern") == _MULTIPLE_SPACES and step.get("content") == " ":
            replaces_space_runs = True
        else:
            other_steps.append(step)
    vocab.precompiled_charsmap = charsmap

    config_path = files.model_dir / TOKENIZER_CONFIG
    tokenizer_class = get_typed(files.tokenizer_config, "tokenizer_class", str, config_path)
    if tokenizer_class in _OWN_PIPELINE_CLASSES:
        # transformers keeps only the charsmap and splits on whitespace itself: what llama.cpp's
        # remove_extra_whitespaces does (one "▁" before each word, no other space).
        prefix = get_typed(files.tokenizer_config, "add_prefix_space", bool, config_path, default=True)
        vocab.add_space_prefix, vocab.remove_extra_whitespaces = prefix, True
        return
    for step in other_steps:
        differences.add(f"{path.name}'s normalizer {step['type']}", hf_normalizer_text(step))
    pre_steps = component_steps(tokenizer_json.get("pre_tokenizer"), "pretokenizers", path, "pre_tokenizer")
    kinds = [step["type"] for step in pre_steps]
    if kinds not in (["Metaspace"], ["WhitespaceSplit", "Metaspace"]) or \
            pre_steps[-1].get("replacement", _WHITESPACE_MARK) != _WHITESPACE_MARK:
        raise TokenizerError(f"{path}: Unigram with pre-tokenizer {' + '.join(kinds) or 'none'} is not supported "
                             "(llama.cpp's UGM tokenizer does what Metaspace does, after an optional WhitespaceSplit)")
    metaspace = pre_steps[-1]
    scheme = metaspace.get("prepend_scheme") or ("always" if metaspace.get("add_prefix_space", True) else "never")
    vocab.add_space_prefix = scheme != "never"
    if scheme == "first":
        differences.add(f"{path.name}'s Metaspace prepend_scheme 'first'",
                        "text that follows a special token, where llama.cpp adds a space")
    if kinds[0] == "WhitespaceSplit":
        vocab.remove_extra_whitespaces = True
    elif replaces_space_runs:
        # Runs of spaces become one, as in llama.cpp, but transformers keeps a trailing space as "▁".
        vocab.remove_extra_whitespaces = True
        differences.add(f"{path.name}'s normalizer Replace(' {{2,}}', ' ')", "text ending in a space")
    else:
        vocab.remove_extra_whitespaces = False
        if vocab.add_space_prefix:
            # llama.cpp (as sentencepiece) puts its "▁" before a leading space too; Metaspace does not.
            differences.add(f"{path.name}'s Metaspace without WhitespaceSplit", "text that begins with a space")


def _load_json(path: Path, tokenizer_json: dict[str, Any], vocab: Vocabulary,
               differences: TokenizationDifferences) -> dict[str, int]:
    model = tokenizer_json.get("model") or {}
    items = get_typed(model, "vocab", list, path, default=[], prefix="model.")
    unk_id = get_typed(model, "unk_id", int, path, prefix="model.")
    if model.get("byte_fallback"):
        # llama.cpp's UGM gives <unk> for a character no piece covers; transformers its UTF-8 bytes.
        differences.add(f"{path.name}'s Unigram byte_fallback", "characters outside the vocabulary")
    for token_id, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], (int, float)) and not isinstance(item[1], bool)):
            raise TokenizerError(f"{path}: model.vocab[{token_id}] {item!r:.60} is not [piece, score]")
        token_type = TokenType.UNKNOWN if token_id == unk_id else TokenType.NORMAL
        vocab.set_token(token_id, item[0], token_type, float(item[1]))
    return {"unk": unk_id} if unk_id is not None and 0 <= unk_id < len(items) else {}


def _t5_sentinels(files: TokenizerFiles, first_id: int, added: list[AddedToken]) -> list[AddedToken]:
    """T5Tokenizer's `extra_ids` sentinels, which it adds after the model's pieces when no file lists
    them: <extra_id_{n-1}> first, <extra_id_0> last (T5's 32099)."""
    config_path = files.model_dir / TOKENIZER_CONFIG
    if get_typed(files.tokenizer_config, "tokenizer_class", str, config_path) not in _T5_CLASSES:
        return []
    count = get_typed(files.tokenizer_config, "extra_ids", int, config_path, default=100)
    if not 0 <= count <= _MAX_SENTINELS:
        raise TokenizerError(f"{config_path}: extra_ids is {count}, not a count of sentinel tokens (0 to {_MAX_SENTINELS})")
    listed = {token.content for token in added}
    sentinels = [f"<extra_id_{i}>" for i in range(count - 1, -1, -1)]
    return [AddedToken(first_id + n, text, True) for n, text in enumerate(sentinels) if text not in listed]


def load_unigram_vocabulary(model_dir: Path, tokenizer_json: dict[str, Any], json_path: Path, files: TokenizerFiles,
                            differences: TokenizationDifferences) -> tuple[Vocabulary, dict[str, int]]:
    """The vocabulary of a Unigram tokenizer.json (preferred: transformers runs it) or, without one,
    of a Unigram SentencePiece model file, and the special ids the tokenizer itself declares."""
    if is_unigram_json(tokenizer_json):
        source = json_path
        vocab = Vocabulary(model="t5", pre="default", source=source, scores=[])
        declared = _load_json(json_path, tokenizer_json, vocab, differences)
        _json_pipeline(tokenizer_json, json_path, files, vocab, differences)
        added = tokenizer_json_added_tokens(tokenizer_json, json_path)
    else:
        source = unigram_model_file(model_dir)
        if source is None:
            raise TokenizerError(f"{model_dir}: no Unigram {json_path.name} and no Unigram SentencePiece model "
                                 f"({', '.join(UNIGRAM_MODEL_FILES)}); a 't5' tokenizer needs one of them")
        vocab = Vocabulary(model="t5", pre="default", source=source, scores=[])
        tokenizer_class = get_typed(files.tokenizer_config, "tokenizer_class", str, files.model_dir / TOKENIZER_CONFIG)
        declared = _load_model_file(source, vocab, differences, tokenizer_class)
        added = added_token_entries(model_dir, files, tokenizer_json)
        added = _t5_sentinels(files, len(vocab), added) + added
    note_space_stripping(added, differences)
    for token in added:
        restated = token.id < len(vocab) and vocab.tokens[token.id] == token.content
        if restated and (token.special is None or vocab.types[token.id] == TokenType.UNKNOWN):
            continue
        # The piece's own score stays: llama.cpp's UGM scores user-defined tokens 0 whatever is written.
        score = vocab.scores[token.id] if restated else None
        vocab.set_token(token.id, token.content, added_token_type(token.content, bool(token.special)), score)
    return vocab, declared
