"""Read a SentencePiece tokenizer.model without the sentencepiece and protobuf packages.

The file is a protobuf `ModelProto` (sentencepiece_model.proto). The exporter needs a handful of its
fields, so instead of a dependency this decodes the protobuf wire format (varints, fixed 32/64-bit
values, length-delimited bytes) and keeps those fields, with the schema's proto2 defaults. The
objects have the attribute names of the generated protobuf classes. Unknown fields are skipped, as
protobuf does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

# Field numbers of sentencepiece_model.proto.
_MODEL_PIECES, _MODEL_TRAINER_SPEC, _MODEL_NORMALIZER_SPEC = 1, 2, 3
_PIECE_PIECE, _PIECE_SCORE, _PIECE_TYPE = 1, 2, 3
_TRAINER_INTS = {3: "model_type", 24: "treat_whitespace_as_suffix", 40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}
_NORMALIZER_BOOLS = {3: "add_dummy_prefix", 4: "remove_extra_whitespaces", 5: "escape_whitespaces"}
_NORMALIZER_NAME, _NORMALIZER_CHARSMAP = 1, 2
# The values of the schema's enums (SentencePiece.Type, TrainerSpec.ModelType). As protobuf does, an
# enum field with any other value keeps the value it had (proto2 sets unknown enum values aside).
_PIECE_TYPES = range(1, 7)  # NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE
_MODEL_TYPES = range(1, 5)  # UNIGRAM, BPE, WORD, CHAR

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_MAX_FIELD_NUMBER = (1 << 29) - 1  # protobuf's limit; a larger one makes the file corrupt


@dataclass
class SentencePiece:
    piece: str = ""
    score: float = 0.0
    type: int = 1  # NORMAL


@dataclass
class TrainerSpec:
    model_type: int = 1  # UNIGRAM
    treat_whitespace_as_suffix: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1


@dataclass
class NormalizerSpec:
    name: str = ""
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


@dataclass
class ModelProto:
    pieces: list[SentencePiece] = field(default_factory=list)
    trainer_spec: TrainerSpec = field(default_factory=TrainerSpec)
    normalizer_spec: NormalizerSpec = field(default_factory=NormalizerSpec)


def parse_model_proto(data: bytes) -> ModelProto:
    """Decode a serialized ModelProto. Raises ValueError if `data` is not valid protobuf of it."""
    model = ModelProto()
    for number, wire, value in _fields(data):
        if number == _MODEL_PIECES and wire == _BYTES:
            model.pieces.append(_piece(value))
        elif number == _MODEL_TRAINER_SPEC and wire == _BYTES:
            _merge_trainer_spec(model.trainer_spec, value)
        elif number == _MODEL_NORMALIZER_SPEC and wire == _BYTES:
            _merge_normalizer_spec(model.normalizer_spec, value)
    return model


def _piece(data: bytes) -> SentencePiece:
    piece = SentencePiece()
    for number, wire, value in _fields(data):
        if number == _PIECE_PIECE and wire == _BYTES:
            piece.piece = _text(value)
        elif number == _PIECE_SCORE and wire == _FIXED32:
            piece.score = struct.unpack("<f", value)[0]
        elif number == _PIECE_TYPE and wire == _VARINT and _int32(value) in _PIECE_TYPES:
            piece.type = _int32(value)
    return piece


def _merge_trainer_spec(spec: TrainerSpec, data: bytes) -> None:
    for number, wire, value in _fields(data):
        if number in _TRAINER_INTS and wire == _VARINT:
            name = _TRAINER_INTS[number]
            if name == "treat_whitespace_as_suffix":
                spec.treat_whitespace_as_suffix = bool(value)
            elif name != "model_type" or _int32(value) in _MODEL_TYPES:
                setattr(spec, name, _int32(value))


def _merge_normalizer_spec(spec: NormalizerSpec, data: bytes) -> None:
    for number, wire, value in _fields(data):
        if number == _NORMALIZER_NAME and wire == _BYTES:
            spec.name = _text(value)
        elif number == _NORMALIZER_CHARSMAP and wire == _BYTES:
            spec.precompiled_charsmap = bytes(value)
        elif number in _NORMALIZER_BOOLS and wire == _VARINT:
            setattr(spec, _NORMALIZER_BOOLS[number], bool(value))


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if not 0 < number <= _MAX_FIELD_NUMBER:
            raise ValueError(f"field number {number} out of range")
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            value, pos = data[pos:pos + size], pos + size
        elif wire == _BYTES:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > end:
            raise ValueError("truncated field")
        yield number, wire, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _int32(value: int) -> int:
    # Negative int32 values are sign-extended to 64 bits on the wire.
    value &= 0xFFFFFFFFFFFFFFFF
    value = value - (1 << 64) if value >= 1 << 63 else value
    return ((value + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _text(value: bytes) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"a string field is not UTF-8 ({e})") from None
