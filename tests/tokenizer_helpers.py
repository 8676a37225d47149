"""Build small real tokenizers and load our exported tokenizer keys into llama.cpp.

Tokenizers are trained here (SentencePiece's trainer, HF tokenizers' BpeTrainer) on a generated
multilingual text, saved the way transformers saves them, and loaded back with transformers as the
oracle. Our export goes into a vocab-only GGUF that llama-cpp-python loads.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# Sentences in several scripts; the training and the check texts are drawn from different mixes.
_SENTENCES = [
    "The quick brown fox jumps over the lazy dog. It's 10:45, isn't it? We'll see, they've said.",
    "Größere Äpfel schmecken süß, aber Übung macht den Meister – straße, Öl, Fußgänger.",
    "我们今天去公园散步，天气很好。人工智能正在改变世界。",
    "東京は日本の首都です。ひらがなとカタカナ、漢字を使います。",
    "Привет, как дела? Москва — столица России. Ёлка, щука, объём.",
    "مرحبا بالعالم، اللغة العربية جميلة جدا.",
    "Emoji: 🚀 🦙🦙 😶‍🌫️ ✅ 👍🏽 🇩🇪",
    "def main():\n\tfor i in range(10):\n\t\tprint(i ** 2)  # squares\n\treturn 0\n",
    "Numbers 3 33 333 3333 33333 1234567 3.14159 1,000,000 2024-01-31.",
    "Spaces:   three   spaces,\ttabs\t\tand\n\nnewlines\r\n  indented  line   ",
    "HTML <div class=\"x\">Hello &amp; world</div> {\"json\": [1, 2, null]}",
    "e-mail: someone@example.com, URL https://example.org/path?q=1&r=2",
]


def training_text(n_lines: int = 3000, seed: int = 0) -> list[str]:
    """Lines that mix the sentences with shuffled words, so BPE learns multi-script merges."""
    rng = random.Random(seed)
    words = [w for s in _SENTENCES for w in s.split(" ") if w]
    lines = []
    for i in range(n_lines):
        if i % 3 == 0:
            lines.append(_SENTENCES[i % len(_SENTENCES)])
        else:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
    return lines


# Not part of the training lines: new combinations, rare characters, edge whitespace.
CHECK_TEXT = (
    " Hello World! HELLO world... don't WON'T I'M you'RE\n"
    "Übermäßig große Füße; weiß.  Ärger\t\tÖffnung\n"
    "这是一个测试句子，包含中文标点。日本語のテキストもあります！\n"
    "Съешь же ещё этих мягких французских булок.\n"
    "هذا اختبار للنص العربي 123\n"
    "🚀🚀 rocket 🦙 llama 😀😃😄 ⚡️\n"
    "    if x == 1:\n        return [a, b]  # 42\n\n\n"
    "1234567890 0.5 -17 ١٢٣ ½ Ⅻ\n"
    "tabs\there\tand  double  spaces   end   \n"
    "Ω≈ç√∫˜µ≤≥÷ ¡™£¢∞§¶•ªº–≠ ﬁ ｆｕｌｌ－ｗｉｄｔｈ"
)


# One line each of many scripts, accents (composed and combining), digits, ASCII symbols and
# whitespace runs: what every tokenizer family's oracle test runs through.
SCRIPT_TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 10:45, isn't it?",
    "Größere Äpfel schmecken süß – Übung, Öl, Fußgänger. Café naïve résumé",
    "Cafe\u0301 with a combining accent, and ÀÉÎÕÜ ñ ç",
    "我们今天去公园散步，天气很好。人工智能正在改变世界。",
    "東京は日本の首都です。ひらがなとカタカナ、漢字を使います。",
    "Привет, как дела? Москва — столица России. Ёлка, щука, объём.",
    "مرحبا بالعالم، اللغة العربية جميلة جدا.",
    "Numbers 3 33 333 3333 1234567 3.14159 1,000,000 2024-01-31.",
    "Symbols $5 + 3 = 8 < 9 > 7 ^ ` | ~ @ # % & * ( ) [ ] { } \\ / \" ' ...",
    "tabs\there\tand  double  spaces,\nnew\r\nlines   and trailing   ",
]


def write_tokenizer_config(model_dir: Path, **fields) -> None:
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    config.update(fields)
    path.write_text(json.dumps(config, ensure_ascii=False, indent=1))


def write_vocab_gguf(metadata, path: Path, arch: str = "llama") -> Path:
    """A GGUF with general.architecture and the given tokenizer Metadata, and no tensors, written
    by our own GGUFWriter."""
    from ggufsmith.constants import Keys
    from ggufsmith.gguf_writer.metadata import Metadata
    from ggufsmith.gguf_writer.writer import GGUFWriter

    file_metadata = Metadata()
    file_metadata.add_string(Keys.General.ARCHITECTURE, arch)
    file_metadata.update(metadata)
    with GGUFWriter(path, file_metadata):
        pass
    return path


def load_llama_vocab(path: Path):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


# The keys of tokens that llama.cpp, when a file does not name them, finds by their text; and the
# llama-cpp-python function that says which token it took.
TEXT_ROLE_GETTERS = {
    "tokenizer.ggml.eot_token_id": "llama_vocab_eot",
    "tokenizer.ggml.fim_pre_token_id": "llama_vocab_fim_pre",
    "tokenizer.ggml.fim_suf_token_id": "llama_vocab_fim_suf",
    "tokenizer.ggml.fim_mid_token_id": "llama_vocab_fim_mid",
    "tokenizer.ggml.fim_pad_token_id": "llama_vocab_fim_pad",
    "tokenizer.ggml.fim_rep_token_id": "llama_vocab_fim_rep",
    "tokenizer.ggml.fim_sep_token_id": "llama_vocab_fim_sep",
}


def load_llama_without_text_roles(metadata, path: Path):
    """A vocab-only llama.cpp model (a Llama) from `metadata` less the TEXT_ROLE_GETTERS keys,
    written to `path`: what llama.cpp detects by itself. Its C vocab handle is `._model.vocab`;
    keep the Llama while using it (the handle dies with the model: a handle taken from a Llama
    already collected read freed memory and failed at random)."""
    stripped = type(metadata)()
    for key, value in metadata.items():
        if key not in TEXT_ROLE_GETTERS:
            stripped.add_value(key, value)
    return load_llama_vocab(write_vocab_gguf(stripped, path))


# --- SentencePiece -------------------------------------------------------------------------------

SP_USER_DEFINED = ["<tool>", "myword"]
SP_CONTROL = ["<|im_start|>", "<|im_end|>"]


def train_sentencepiece(model_dir: Path, model_type: str = "bpe", vocab_size: int = 1200, **options) -> Path:
    """A SentencePiece model saved as tokenizer.model + tokenizer_config.json for LlamaTokenizer."""
    import io

    import sentencepiece as spm

    model_dir.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    settings = dict(
        model_type=model_type,
        vocab_size=vocab_size,
        byte_fallback=True,
        user_defined_symbols=SP_USER_DEFINED,
        control_symbols=SP_CONTROL,
        normalization_rule_name="identity",
        character_coverage=0.9995,
        hard_vocab_limit=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        minloglevel=2,
    )
    settings.update(options)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_text()), model_writer=buffer, **settings)
    (model_dir / "tokenizer.model").write_bytes(buffer.getvalue())
    # legacy=True: a space prefix after special tokens, the behaviour llama.cpp's SPM tokenizer has.
    write_tokenizer_config(
        model_dir,
        tokenizer_class="LlamaTokenizer",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        add_bos_token=True,
        add_eos_token=False,
        legacy=True,
    )
    return model_dir


# --- byte-level BPE (tokenizer.json) -------------------------------------------------------------

# style -> (split regexes before ByteLevel, ByteLevel use_regex, ignore_merges, special tokens)
BPE_STYLES = {
    "llama3": dict(splits=["LLAMA3_REGEX"], use_regex=False, ignore_merges=True, bos="<|begin_of_text|>",
                   specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                             "<|end_header_id|>", "<|eom_id|>"]),
    "gpt2": dict(splits=[], use_regex=True, ignore_merges=False, bos=None, specials=["<|endoftext|>"],
                 string_merges=True),
    "qwen2": dict(splits=["QWEN2_REGEX"], use_regex=False, ignore_merges=False, bos=None, nfc=True,
                  specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>",
                            "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]),
    "starcoder": dict(splits=["DIGITS"], use_regex=True, ignore_merges=False, bos=None,
                      specials=["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>"]),
    "gpt-4o": dict(splits=["GPT4O_REGEX"], use_regex=False, ignore_merges=False, bos=None,
                   specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    "tekken": dict(splits=["TEKKEN_REGEX"], use_regex=False, ignore_merges=True, bos="<s>",
                   specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]),
    "deepseek-coder": dict(splits=["DEEPSEEK_CODER"], use_regex=False, ignore_merges=False, bos="<｜begin▁of▁sentence｜>",
                           specials=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>",
                                     "<｜fim▁begin｜>", "<｜fim▁end｜>"]),
    "falcon": dict(splits=["FALCON"], use_regex=None, ignore_merges=False, bos=None,
                   specials=["<|endoftext|>", ">>TITLE<<"], clean_up=True),
    "bloom": dict(splits=["BLOOM_REGEX"], use_regex=False, ignore_merges=False, bos=None,
                  specials=["<unk>", "<s>", "</s>", "<pad>"], eos="</s>", clean_up=True),
}
BPE_USER_DEFINED = ["myword"]


def _split_steps(names: list[str]):
    from tokenizers import Regex, pre_tokenizers

    from ggufsmith.tokenizer import pretokenizer as pt

    steps = []
    for name in names:
        if name == "DIGITS":
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        elif name == "FALCON":
            steps.append(pre_tokenizers.Punctuation(behavior="contiguous"))
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
            steps.append(pre_tokenizers.Digits(individual_digits=False))
            steps.append(pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated"))
        elif name == "DEEPSEEK_CODER":
            for regex in pt.DEEPSEEK_CODER_REGEXES[:-1]:
                steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        else:
            steps.append(pre_tokenizers.Split(Regex(getattr(pt, name)), behavior="isolated"))
    return steps


def train_bpe(model_dir: Path, style: str, vocab_size: int = 1500) -> Path:
    """A byte-level BPE tokenizer of the given pre-tokenizer style, saved by transformers."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = BPE_STYLES[style]
    tokenizer = Tokenizer(models.BPE(ignore_merges=spec["ignore_merges"]))
    steps = _split_steps(spec["splits"])
    if spec["use_regex"] is not None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=spec["use_regex"]))
    tokenizer.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    if spec.get("nfc"):
        tokenizer.normalizer = normalizers.NFC()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=spec["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer)
    bos = spec["bos"]
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    eos = spec.get("eos") or (spec["specials"][1] if bos else spec["specials"][0])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos or eos, eos_token=eos)
    fast.add_tokens(BPE_USER_DEFINED)
    fast.save_pretrained(model_dir)
    if spec.get("string_merges"):
        # The older "a b" form of merges, as GPT-2 era tokenizer.json files have it.
        path = model_dir / "tokenizer.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    write_tokenizer_config(model_dir, clean_up_tokenization_spaces=spec.get("clean_up", False))
    return model_dir


def train_bpe_for_table_entry(
    model_dir: Path,
    name: str,
    vocab_size: int = 1500,
    *,
    specials: tuple[str, ...] = ("<|endoftext|>",),
    bos: str | None = None,
    eos: str = "<|endoftext|>",
    model_type: str | None = None,
    nfc: bool = False,
    **tokenizer_config,
) -> Path:
    """A byte-level BPE tokenizer whose pre_tokenizer is built from one entry of our
    pre-tokenizer table, with that entry's ignore_merges and clean-up flags, and a config.json with
    `model_type` (by default the entry's family, if it has one). `bos`, when given, is put before every
    sequence by the post-processor, as Llama 3-style tokenizers do; `tokenizer_config` adds entries
    (chat_template, ...) to tokenizer_config.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from ggufsmith.tokenizer import pretokenizer as pt

    entry = next(e for e in pt.PRE_TOKENIZERS if e.name == name)
    steps = []
    for regex in entry.regexes:
        if regex == pt.GPT2_REGEX:
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        elif regex == pt.PUNCTUATION_CONTIGUOUS:
            steps.append(pre_tokenizers.Punctuation(behavior="contiguous"))
        elif regex == pt.DIGITS_INDIVIDUAL:
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        elif regex == pt.DIGITS_RUNS:
            steps.append(pre_tokenizers.Digits(individual_digits=False))
        else:
            steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
    if pt.GPT2_REGEX not in entry.regexes:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tokenizer = Tokenizer(models.BPE(ignore_merges=entry.ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer)
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos or eos, eos_token=eos)
    fast.save_pretrained(model_dir)
    write_tokenizer_config(model_dir, clean_up_tokenization_spaces=entry.clean_spaces, **tokenizer_config)
    model_type = model_type or (entry.model_types[0] if entry.model_types else None)
    if model_type:
        (model_dir / "config.json").write_text(json.dumps({"model_type": model_type}))
    return model_dir
