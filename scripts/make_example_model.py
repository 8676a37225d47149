"""Build examples/tiny-llama: a small random-weight llama checkpoint with a real SentencePiece tokenizer.

It is what the README's first command converts, so it has to look like a real Hugging Face llama
folder (config.json, generation_config.json, model.safetensors in bf16, tokenizer.model,
tokenizer_config.json with a chat template) while staying a few MB. Everything comes from fixed
seeds, so running the script again gives the same tokenizer and weights.

    python scripts/make_example_model.py [--out examples/tiny-llama]

Needs torch, transformers and sentencepiece (the `test` extra).
"""

from __future__ import annotations

import argparse
import io
import json
import random
from pathlib import Path

SEED = 20240601
VOCAB_SIZE = 2000
CONFIG = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention, as Llama 2 70B / Llama 3 / TinyLlama have
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)
# Llama 2's chat format.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# The tokenizer's training text: sentences in several scripts recombined by a seeded generator, so
# the vocabulary has pieces for English, German, French, Russian, Chinese, digits and code.
_SUBJECTS = ["the llama", "a small model", "the tokenizer", "our converter", "every tensor", "the file",
             "das Lama", "ein kleines Modell", "le lama", "un petit modèle", "лама", "маленькая модель",
             "羊驼", "小模型"]
_VERBS = ["reads", "writes", "quantizes", "loads", "checks", "converts", "liest", "schreibt", "prüft",
          "lit", "écrit", "vérifie", "читает", "пишет", "проверяет", "读取", "写入", "检查"]
_OBJECTS = ["the weights", "sixteen bits", "a GGUF file", "the metadata", "every block", "die Gewichte",
            "große Dateien", "les poids", "un fichier GGUF", "веса", "файл GGUF", "权重", "文件", "元数据"]
_ENDINGS = [".", "!", "?", " again.", " quickly.", " schnell.", " très vite.", " быстро.", "。", "！"]
_CODE = ["def convert(path):\n    return load(path)\n", "for i in range(10):\n\tprint(i * 2)\n",
         "x = [1, 2, 3]  # numbers\n", "if (a == b) { return 0; }\n"]


# Made-up words from these syllables give the BPE trainer enough distinct merges for the vocabulary.
_SYLLABLES = {
    "latin": ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zi", "ber", "dun", "gal", "hor", "pli", "stro", "ung"],
    "cyrillic": ["ка", "ло", "ми", "не", "ру", "са", "те", "во", "зи", "бер", "дун", "гал"],
    "han": list("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经"),
}


def _made_up_sentence(rng: random.Random) -> str:
    script = rng.choice(list(_SYLLABLES))
    syllables = _SYLLABLES[script]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(3, 8))]
    return ("" if script == "han" else " ").join(words)


def training_lines(n: int = 8000) -> list[str]:
    rng = random.Random(SEED)
    lines = []
    for i in range(n):
        if i % 10 == 0:
            lines.append(rng.choice(_CODE))
        elif i % 2:
            lines.append(_made_up_sentence(rng))
        else:
            sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
            number = f" {rng.randint(0, 99999)}" if rng.random() < 0.3 else ""
            lines.append(sentence[0].upper() + sentence[1:] + number)
    return lines


def write_tokenizer(out: Path) -> None:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,  # as Llama 2: any text is representable through <0xNN> byte pieces
        split_digits=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1,  # the trainer's result depends on thread scheduling otherwise
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes(model.getvalue())
    tokenizer_config = dict(
        tokenizer_class="LlamaTokenizer",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        add_bos_token=True,
        add_eos_token=False,
        legacy=True,
        model_max_length=CONFIG["max_position_embeddings"],
        chat_template=CHAT_TEMPLATE,
    )
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    special_tokens = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    (out / "special_tokens_map.json").write_text(json.dumps(special_tokens, indent=2) + "\n")


def write_model(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB_SIZE, **CONFIG)).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))
            else:  # std 1.5/sqrt(fan_in): activations stay near unit scale and logits are far from uniform
                param.copy_(1.5 / param.shape[-1] ** 0.5 * torch.randn(param.shape, generator=generator))
    model.config.architectures = ["LlamaForCausalLM"]
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, do_sample=False)
    model.to(torch.bfloat16).save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "examples" / "tiny-llama")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(args.out)
    write_model(args.out)
    total = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out} ({total / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
