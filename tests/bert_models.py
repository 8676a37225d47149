"""Tiny BERT encoders in sentence-transformers folders, with WordPiece tokenizers trained here.

The tokenizer is trained with HF tokenizers' WordPieceTrainer on the multilingual training text of
tests/tokenizer_helpers.py and saved by transformers' BertTokenizer (tokenizer.json +
tokenizer_config.json), or written as a bare vocab.txt. The model is a random-weight BertModel or
BertForMaskedLM with every parameter redrawn at a scale that makes the layers matter (N(0, 0.15)
matrices, LayerNorm weights around 1 and biases around 0 with spread 0.2, token-type and position
embeddings as large as the token embeddings), so a missing token-type row, a shifted position or
a wrong norm moves the output by far more than the tolerances.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tokenizer_helpers import training_text

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POOLING_FLAGS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "last": "pooling_mode_lasttoken"}


def train_wordpiece(model_dir: Path, *, lowercase: bool, vocab_size: int = 700):
    """A WordPiece tokenizer saved the way transformers 5 saves BertTokenizer; returns it."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL)
    tokenizer.train_from_iterator(training_text(), trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.decoder = decoders.WordPiece()
    fast = transformers.BertTokenizerFast(tokenizer_object=tokenizer, do_lower_case=lowercase)
    fast.save_pretrained(model_dir)
    return fast


def write_vocab_txt_only(source_dir: Path, model_dir: Path, *, lowercase: bool) -> None:
    """The vocabulary of `source_dir`'s tokenizer.json as the slow files: vocab.txt and a
    tokenizer_config.json, no tokenizer.json (older BERT checkpoints)."""
    vocab = json.loads((source_dir / "tokenizer.json").read_text())["model"]["vocab"]
    model_dir.mkdir(parents=True, exist_ok=True)
    pieces = sorted(vocab, key=vocab.get)
    (model_dir / "vocab.txt").write_text("".join(f"{piece}\n" for piece in pieces), encoding="utf-8")
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                 "do_lower_case": lowercase}))


def write_sentence_transformers_modules(model_dir: Path, pooling: str, hidden_size: int, denses: int = 0) -> None:
    """modules.json (Transformer at the root, Pooling, `denses` Dense modules 2_Dense, 3_Dense ...,
    Normalize) and 1_Pooling/config.json; the Dense folders are the caller's."""
    kinds = ["Transformer", "Pooling", *["Dense"] * denses, "Normalize"]
    paths = ["", "1_Pooling", *[f"{i + 2}_Dense" for i in range(denses)], f"{denses + 2}_Normalize"]
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
               for i, (kind, path) in enumerate(zip(kinds, paths))]
    (model_dir / "modules.json").write_text(json.dumps(modules, indent=1))
    (model_dir / "1_Pooling").mkdir(exist_ok=True)
    (model_dir / paths[-1]).mkdir(exist_ok=True)
    config = {"word_embedding_dimension": hidden_size, **{flag: False for flag in POOLING_FLAGS.values()}}
    config[POOLING_FLAGS[pooling]] = True
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=1))


def build_bert(model_dir: Path, *, masked_lm: bool = False, roberta: bool = False, xlmr: bool = False,
               camembert: bool = False, distilbert: bool = False, seed: int = 0, hidden_size: int = 64,
               labels: list[str] | None = None) -> Path:
    """A random-weight BertModel (BertForMaskedLM; RobertaModel, XLMRobertaModel or CamembertModel,
    whose positions start at pad_token_id + 1 and which have one token type; DistilBertModel or
    DistilBertForMaskedLM, BERT under other names without token types) for the tokenizer already in
    `model_dir`; with `labels`, the *ForSequenceClassification model of that family with those labels
    (a reranker: one)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    roberta = roberta or xlmr or camembert
    family = ("Camembert" if camembert else "XLMRoberta" if xlmr else "Roberta" if roberta else
              "DistilBert" if distilbert else "Bert")
    sizes = dict(vocab_size=len(tokenizer) + 3,  # a few rows past the tokenizer: padded with unused tokens
                 max_position_embeddings=98 if roberta else 96, pad_token_id=1 if roberta else 0,
                 **({"id2label": dict(enumerate(labels))} if labels else {}))
    if distilbert:
        config = transformers.DistilBertConfig(dim=hidden_size, n_layers=3, n_heads=4, hidden_dim=2 * hidden_size,
                                               **sizes)
    else:
        config = getattr(transformers, family + "Config")(
            hidden_size=hidden_size, num_hidden_layers=3, num_attention_heads=4, intermediate_size=2 * hidden_size,
            type_vocab_size=1 if roberta else 2, layer_norm_eps=1e-12, **sizes)
    torch.manual_seed(seed)
    head = "ForSequenceClassification" if labels else "ForMaskedLM" if masked_lm else "Model"
    model = redraw_weights(getattr(transformers, family + head)(config).eval())
    model.save_pretrained(model_dir)
    return model_dir


def redraw_weights(model):
    """Every parameter redrawn large (see the module's docstring); returns the model."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layernorm.weight" in name.lower() or "layer_norm.weight" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif param.dim() == 1:
                param.copy_(0.2 * torch.randn_like(param))
            elif "embeddings" in name:
                param.copy_(torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    return model


def build_jina_v3(model_dir: Path, *, seed: int = 0, hidden_size: int = 64) -> Path:
    """A random-weight JinaEmbeddingsV3Model (XLM-R with rotary attention, no position table) for the
    XLM-R tokenizer already in `model_dir`, with sentence-transformers' mean pooling; transformers
    saves it under the names of jina's own checkpoint (emb_ln, encoder.layers.N.mixer.Wqkv, ...)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    config = transformers.JinaEmbeddingsV3Config(
        vocab_size=len(tokenizer) + 3, hidden_size=hidden_size, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=2 * hidden_size, max_position_embeddings=98, type_vocab_size=1, layer_norm_eps=1e-5)
    torch.manual_seed(seed)
    model = transformers.JinaEmbeddingsV3Model(config).eval()
    redraw_weights(model)
    model.save_pretrained(model_dir)
    write_sentence_transformers_modules(model_dir, "mean", hidden_size=hidden_size)
    return model_dir


JINA_TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]


def jina_v3_as_published(source_dir: Path, model_dir: Path, *, rank: int = 4) -> Path:
    """`source_dir`'s JinaEmbeddingsV3Model as jinaai/jina-embeddings-v3 publishes it for its own
    (remote) code, which llama.cpp's converter reads: an XLMRobertaModel config with
    position_embedding_type rotary and the task LoRA settings, the weights under "roberta.", each
    linear and embedding weight as a parametrization (".parametrizations.weight.original") with
    its stacked task adapters (".parametrizations.weight.0.lora_A/B", one per task)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source_dir, model_dir, ignore=lambda folder, names: [
        name for name in names if Path(folder) == source_dir and name in ("model.safetensors", "config.json")])
    source = json.loads((source_dir / "config.json").read_text())
    config = {key: source[key] for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                           "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "vocab_size",
                                           "pad_token_id", "bos_token_id", "eos_token_id", "hidden_act")}
    config |= {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "position_embedding_type": "rotary",
               "rotary_emb_base": source["rope_parameters"]["rope_theta"], "lora_adaptations": JINA_TASKS,
               "task_instructions": {task: f"Instruction for {task}: " for task in JINA_TASKS},
               "lora_rank": rank, "lora_alpha": 1, "lora_dropout_p": 0.0, "load_trained_adapters": True}
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    generator = torch.Generator().manual_seed(1)
    tensors = {}
    for name, tensor in load_file(source_dir / "model.safetensors").items():
        if not name.endswith(".weight") or tensor.dim() != 2:
            tensors["roberta." + name] = tensor
            continue
        stem = "roberta." + name[:-len("weight")] + "parametrizations.weight."
        tensors[stem + "original"] = tensor
        rows, columns = tensor.shape
        embedding = "embeddings" in name  # an embedding's adapter is stored the other way round
        a_shape, b_shape = ((rows, rank), (rank, columns)) if embedding else ((rank, columns), (rows, rank))
        tensors[stem + "0.lora_A"] = 0.1 * torch.randn(len(JINA_TASKS), *a_shape, generator=generator)
        tensors[stem + "0.lora_B"] = 0.1 * torch.randn(len(JINA_TASKS), *b_shape, generator=generator)
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    return model_dir


def build_eurobert(model_dir: Path, model_class: str = "EuroBertModel", pooling: str = "mean", seed: int = 0) -> Path:
    """A random-weight EuroBertModel (or EuroBertForMaskedLM) with GQA and a Llama-3-style byte-level
    BPE tokenizer, in a sentence-transformers folder with `pooling`."""
    import torch
    import transformers

    from tests.family_models import randomize
    from tests.tokenizer_helpers import train_bpe

    train_bpe(model_dir, "llama3", vocab_size=700)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    config = transformers.EuroBertConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    randomize(model)
    model.save_pretrained(model_dir)
    write_sentence_transformers_modules(model_dir, pooling, hidden_size=64)
    return model_dir


ROBERTA_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def train_roberta_bpe(model_dir: Path, vocab_size: int = 700):
    """A byte-level BPE with RoBERTa's special tokens and `<s> A </s>` post-processor, saved by
    transformers' RobertaTokenizer; returns it."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=ROBERTA_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(training_text(), trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", tokenizer.token_to_id("</s>")),
                                                            ("<s>", tokenizer.token_to_id("<s>")))
    fast = transformers.RobertaTokenizerFast(tokenizer_object=tokenizer)
    fast.save_pretrained(model_dir)
    return fast


def train_xlmr_unigram(model_dir: Path, vocab_size: int = 1500, tokenizer_class: str = "XLMRobertaTokenizer",
                       keep_model_file: bool = False):
    """A SentencePiece Unigram model (nmt_nfkc normalization) in XLM-RoBERTa's sentencepiece.bpe.model,
    saved by transformers' XLMRobertaTokenizer (or `tokenizer_class`: CamembertTokenizer, whose
    fairseq specials differ) as XLM-R folders ship it (tokenizer.json, whose ids fairseq shifted;
    keep_model_file: sentencepiece.bpe.model beside it, as CamemBERT folders ship); returns it."""
    import io

    import sentencepiece as spm
    import transformers

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_text()), model_writer=buffer, model_type="unigram",
                                   vocab_size=vocab_size, character_coverage=0.9995, hard_vocab_limit=False,
                                   minloglevel=2)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "sentencepiece.bpe.model").write_bytes(buffer.getvalue())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    if not keep_model_file:
        (model_dir / "sentencepiece.bpe.model").unlink()  # as BGE-M3 ships: tokenizer.json only
    tokenizer.save_pretrained(model_dir)
    return tokenizer


# -- what the embedding tests compare ------------------------------------------------------------

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Größere Äpfel schmecken süß, aber Übung macht den Meister!",
    "我们今天去公园散步，天气很好。",
    "Hello, WORLD... it's 10:45 -- isn't it? (e-mail: someone@example.com)",
    "Привет, как дела? Москва — столица России.",
]


def pooled(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """sentence-transformers' pooling, then its Normalize module (what llama.cpp's normalize=True does)."""
    vector = {"mean": hidden.mean(0), "cls": hidden[0], "last": hidden[-1]}[pooling]
    return vector / np.linalg.norm(vector)


def llama_embeddings(path: Path, texts: list[str], **options) -> list[np.ndarray]:
    """One pooled, L2-normalized vector per text with the file's pooling; with
    pooling_type=NONE, every token's state as it is."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), embedding=True, n_ctx=96, n_batch=96, n_ubatch=96,
                          verbose=False, **options)
    try:
        return [np.asarray(llm.embed(text, normalize=options.get("pooling_type") is None), dtype=np.float64)
                for text in texts]
    finally:
        llm.close()


def encoder_states(model_dir: Path, model_class: str = "AutoModel", patch=None) -> list[tuple[list[int], np.ndarray]]:
    """Per sentence of SENTENCES: transformers' token ids and the last hidden state of the encoder in
    `model_dir` (AutoModel: the encoder of a MaskedLM too), after patch(model) if given."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = getattr(transformers, model_class).from_pretrained(model_dir, dtype=torch.float32).eval()  # whatever it was saved in
    if patch is not None:
        patch(model)
    rows = []
    for text in SENTENCES:
        ids = tokenizer(text)["input_ids"]
        with torch.no_grad():
            rows.append((ids, model(torch.tensor([ids])).last_hidden_state[0].double().numpy()))
    return rows


def assert_pooled_match(path: Path, rows, pooling: str, max_error: float, min_cosine: float, label: str) -> None:
    """llama.cpp's pooled, normalized embedding of each sentence (the file's pooling) against
    `pooling` over the reference states `rows` (encoder_states): max |difference| / std and cosine."""
    for text, got, (_, hidden) in zip(SENTENCES, llama_embeddings(path, SENTENCES), rows):
        expected = pooled(hidden, pooling)
        error = np.abs(got - expected).max() / expected.std()
        cosine = float(got @ expected / np.linalg.norm(got))
        print(f"{label}: max error / std {error:.1e}, 1 - cosine {1 - cosine:.1e}")
        assert error <= max_error and cosine >= min_cosine, (text, error, cosine)


def assert_token_states_match(path: Path, rows, tolerance: float, label: str) -> None:
    """Every token's state (pooling turned off) against the reference states: max |difference| / std."""
    import llama_cpp

    per_text = llama_embeddings(path, SENTENCES, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE)
    for text, got, (_, hidden) in zip(SENTENCES, per_text, rows):
        assert got.shape == hidden.shape, text
        error = np.abs(got - hidden).max() / hidden.std()
        print(f"{label} per token: max error / std {error:.1e}")
        assert error <= tolerance, (text, error)


def assert_tokenizes_as_transformers(path: Path, rows) -> None:
    """llama.cpp's token ids of each sentence (with the file's BOS/EOS settings) are transformers'."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        for text, (ids, _) in zip(SENTENCES, rows):
            assert llm.tokenize(text.encode(), add_bos=True, special=False) == ids, text
    finally:
        llm.close()


def jina_v3_with_task(native_dir: Path, published_dir: Path, task: str, model_dir: Path) -> Path:
    """`native_dir`'s JinaEmbeddingsV3Model with `published_dir`'s adapter of `task` merged into
    its weights as jina's own code applies it (modeling_lora.py's LoRAParametrization: the weight
    plus lora_alpha / r times B @ A for a linear layer, A @ B for an embedding, the task's slice of
    the stacked factors): what jina's encode(task=...) computes, for transformers to run."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((published_dir / "config.json").read_text())
    i = config["lora_adaptations"].index(task)
    published = load_file(published_dir / "model.safetensors")
    tensors = load_file(native_dir / "model.safetensors")
    for name in tensors:
        stem = "roberta." + name[:-len("weight")] + "parametrizations.weight."
        if stem + "original" not in published:
            continue
        a, b = (published[stem + f"0.lora_{f}"][i].double() for f in "AB")
        rank = a.shape[1] if "embeddings" in name else a.shape[0]
        update = a @ b if "embeddings" in name else b @ a
        tensors[name] = (published[stem + "original"].double() + config["lora_alpha"] / rank * update).to(torch.float32)
    shutil.copytree(native_dir, model_dir)
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    return model_dir
