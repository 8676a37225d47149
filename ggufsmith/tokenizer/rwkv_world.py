"""Export an RWKV "world" vocabulary (rwkv_vocab_v20230424.txt) as llama.cpp's `rwkv` tokenizer.

The vocabulary file has one token a line: `<id> <Python str or bytes literal> <byte length>`.
Tokens are byte strings (many are not valid UTF-8), but GGUF token strings are text, so each token
is written with the escapes llama.cpp's RWKV tokenizer undoes when it builds its trie: `\\\\`,
`\\t`, `\\n`, `\\r`, and `\\xHH` (lowercase) for every other byte outside printable ASCII. Token 0,
absent from the file, is `<s>`, the end-of-text / beginning marker RWKV models are trained with.
The file itself also goes in verbatim, as the spec's `tokenizer.rwkv.world`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ggufsmith.constants import GGUFValueType, Keys, TokenType
from ggufsmith.errors import TokenizerError
from ggufsmith.gguf_writer.metadata import Metadata

from .hf_files import MAX_TOKEN_ID

RWKV_WORLD_VOCAB = "rwkv_vocab_v20230424.txt"
RWKV_BOUNDARY_TOKEN = "<s>"  # id 0

_NAMED_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}


def has_rwkv_world_vocab(model_dir: Path) -> bool:
    return (Path(model_dir) / RWKV_WORLD_VOCAB).is_file()


def escape_token(token: bytes) -> str:
    """A byte string as text that llama.cpp's RWKV tokenizer reads back to the same bytes."""
    parts = []
    for byte in token:
        if byte in _NAMED_ESCAPES:
            parts.append(_NAMED_ESCAPES[byte])
        elif 0x20 <= byte < 0x7F:
            parts.append(chr(byte))
        else:
            parts.append(f"\\x{byte:02x}")
    return "".join(parts)


def read_rwkv_world_vocab(path: Path) -> list[bytes]:
    """Tokens by id, id 0 being the boundary token. Literals are parsed, never executed."""
    by_id: dict[int, bytes] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read the world vocabulary ({e})") from None
    for line_no, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        try:
            first, last = line.index(" "), line.rindex(" ")
            token_id, length = int(line[:first]), int(line[last + 1 :])
            literal = ast.literal_eval(line[first + 1 : last])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            # literal_eval's failures on hostile text include unhashable keys and deep nesting
            raise TokenizerError(f"{path}:{line_no}: not '<id> <literal> <length>'") from None
        try:
            token = literal.encode("utf-8") if isinstance(literal, str) else literal
        except UnicodeEncodeError:  # a lone surrogate ("\ud800") has no UTF-8 bytes
            raise TokenizerError(f"{path}:{line_no}: token is not valid Unicode text") from None
        if not isinstance(token, bytes) or len(token) != length:
            raise TokenizerError(f"{path}:{line_no}: token is not {length} bytes long")
        if not 0 < token_id <= MAX_TOKEN_ID or token_id in by_id:
            raise TokenizerError(f"{path}:{line_no}: id {token_id} is reserved, repeated or out of range")
        by_id[token_id] = token
    n_tokens = max(by_id, default=0) + 1
    missing = [i for i in range(1, n_tokens) if i not in by_id]
    if missing:
        raise TokenizerError(f"{path}: ids {missing[:5]} are missing; llama.cpp needs consecutive ids")
    return [RWKV_BOUNDARY_TOKEN.encode()] + [by_id[i] for i in range(1, n_tokens)]


def export_rwkv_world(model_dir: Path, *, vocab_size: int | None = None) -> Metadata:
    """The tokenizer.* keys for the world vocabulary in `model_dir`, padded to `vocab_size` rows."""
    path = Path(model_dir) / RWKV_WORLD_VOCAB
    if not path.is_file():
        raise TokenizerError(f"{path}: missing; an 'rwkv' tokenizer needs the world vocabulary file")
    tokens = read_rwkv_world_vocab(path)
    texts = [tokens[0].decode()] + [escape_token(t) for t in tokens[1:]]
    types = [TokenType.CONTROL] + [TokenType.NORMAL] * (len(tokens) - 1)
    if vocab_size is not None:
        if vocab_size < len(texts):
            raise TokenizerError(f"{path}: {len(texts)} tokens, but the model has only {vocab_size} embedding rows")
        for i in range(len(texts), vocab_size):
            texts.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)

    md = Metadata()
    md.add_string(Keys.Tokenizer.MODEL, "rwkv")
    md.add_array(Keys.Tokenizer.TOKENS, texts, GGUFValueType.STRING)
    md.add_array(Keys.Tokenizer.TOKEN_TYPE, [int(t) for t in types], GGUFValueType.INT32)
    md.add_uint32(Keys.Tokenizer.BOS_ID, 0)
    md.add_uint32(Keys.Tokenizer.EOS_ID, 0)
    md.add_string(Keys.Tokenizer.RWKV_WORLD, path.read_text(encoding="utf-8"))
    return md
