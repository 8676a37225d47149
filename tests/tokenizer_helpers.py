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


def write_tokenizer_config(model_dir: Path, **fields) -> None:
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    config.update(fields)
    path.write_text(json.dumps(config, ensure_ascii=False, indent=1))


def write_vocab_gguf(metadata, path: Path, arch: str = "llama") -> Path:
    """A GGUF with general.architecture and the given tokenizer Metadata, and no tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        sub_type = gguf.GGUFValueType(int(value.element_type)) if value.element_type is not None else None
        val = value.value
        if sub_type is not None and not isinstance(val, list):
            val = list(val.tolist() if hasattr(val, "tolist") else val)
        writer.add_key_value(key, val, gguf.GGUFValueType(int(value.type)), sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def load_llama_vocab(path: Path):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
