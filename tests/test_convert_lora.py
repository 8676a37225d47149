"""PEFT LoRA adapters converted by `ggufsmith convert-lora`, applied by llama.cpp (llama-cpp-python's
`lora_path`, scale 1) on the base model converted by ggufsmith, give the logits of transformers'
model with the adapter merged in (PEFT merge_and_unload); and the files equal those of llama.cpp's
convert_lora_to_gguf.py where it converts the same adapter.

Models: small random llama (GQA: the q/k rotary permutation applies to lora_B), qwen2 (q/k/v
biases, no permutation), gemma (GeGLU, tied embeddings, norms stored as offsets), each with an
adapter on q, k, v, o, gate, up and down, and phi3 (q, k and v fused in one qkv_proj, gate and up
in one gate_up_proj, as llama.cpp loads them), with an adapter on those fused layers; made by peft with random non-zero factors
(init_lora_weights=False); and a llama adapter with what llama.cpp's scale alpha / r does not
express by itself: rsLoRA (alpha / sqrt(r)), a rank_pattern and an alpha_pattern, and the token
embeddings and output head adapted too.

Tolerances, max |llama.cpp - transformers| / std(transformers' logits), base model in F32:
  f32: 1e-3 (llama, qwen2, phi3; measured 5e-6 to 7e-6), 1e-2 for gemma (measured 3e-3: llama.cpp
       computes GELU through a float16 table, the bound of the base model's own test); the
       adapter's factors are stored exactly.
  f16: 2e-2: the factors rounded to float16 (relative 2^-11) on top of the f32 error; measured
       4.2e-3 to 6.1e-3.
Without the adapter llama.cpp's logits are about 5 standard deviations away (more than 100 times
any tolerance, checked), so a dropped or misplaced tensor cannot pass.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from tests.damaged_inputs import CLI_CODE, REPO, run_cli
from tests.family_models import build_model, llamacpp_logits, relative_error
from tests.gemma_models import build_model as build_gemma
from tests.llamacpp_reference import (assert_same_file, gguf_contents, reference_lora_conversions,
                                      reference_lora_default_outputs)
from tests.tokenizer_helpers import train_bpe, train_sentencepiece

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.slow

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOLERANCE = {"f32": 1e-3, "f16": 2e-2}
GELU_F32_TOLERANCE = 1e-2
PROMPT = [1] + [(17 * i) % 580 + 10 for i in range(24)]
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# name -> (model class, tokenizer, config fields (None: tests/gemma_models.py's "gemma"))
MODELS = {
    "llama": ("LlamaForCausalLM", "sentencepiece", dict(COMMON, vocab_size=1200, tie_word_embeddings=False)),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", dict(COMMON, vocab_size=608, tie_word_embeddings=False)),
    "gemma": ("GemmaForCausalLM", "sentencepiece", None),
    # fused in the checkpoint already: qkv_proj and gate_up_proj, adapted as one each
    "phi3": ("Phi3ForCausalLM", "phi3", dict(COMMON, vocab_size=608, tie_word_embeddings=False)),
}
TARGETS_OF = {"phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}
# The llama adapter whose scales differ per module, with the embeddings and the head adapted.
SCALED = dict(use_rslora=True, rank_pattern={"v_proj": 4}, alpha_pattern={"down_proj": 5},
              target_modules=[*TARGETS, "embed_tokens", "lm_head"])


def make_adapter(model_dir: Path, model_class: str, adapter_dir: Path, seed: int = 1, targets=TARGETS,
                 **lora) -> np.ndarray:
    """Save a peft LoRA adapter with random factors for the model in model_dir; returns the logits
    of the model with the adapter merged in, over PROMPT."""
    model = getattr(transformers, model_class).from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    options = dict(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False) | lora
    peft_model = peft.get_peft_model(model, peft.LoraConfig(**options))
    peft_model.save_pretrained(adapter_dir)
    merged = peft_model.merge_and_unload().eval()
    with torch.no_grad():
        return merged(torch.tensor([PROMPT])).logits[0].float().numpy()


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """name -> (base folder, adapter folder, merged model's logits, base GGUF (f32))."""
    root = tmp_path_factory.mktemp("lora")
    out = {}
    for name, (model_class, tokenizer, fields) in MODELS.items():
        base = root / name
        if tokenizer == "sentencepiece":
            train_sentencepiece(base)
        elif tokenizer == "phi3":  # llama.cpp looks Phi-3's chat tokens up in its vocabulary
            from tests.test_arch_dense import train_phi3_tokenizer

            train_phi3_tokenizer(base)
        else:
            train_bpe(base, tokenizer, vocab_size=600)
        if fields is None:
            build_gemma("gemma", base)
        else:
            build_model(fields_class(model_class), model_class, base, **fields)
        adapter = root / f"{name}-adapter"
        # loaded by a relative name, which peft writes into the adapter's model card as its base_model,
        # as it writes a Hub id (an absolute path there: see the report on general_metadata)
        with contextlib.chdir(root):
            logits = make_adapter(Path(name), model_class, adapter, targets=TARGETS_OF.get(name, TARGETS))
        base_gguf = root / f"{name}-f32.gguf"
        ggufsmith.convert(base, base_gguf, outtype="f32")
        out[name] = base, adapter, logits, base_gguf
    return out


def fields_class(model_class: str) -> str:
    return model_class.replace("ForCausalLM", "Config")


@pytest.fixture(scope="session")
def converted(models, tmp_path_factory):
    """convert(name, outtype): our GGUF adapter of models[name], made once."""
    root = tmp_path_factory.mktemp("lora-gguf")
    cache = {}

    def convert(name: str, outtype: str) -> Path:
        if (name, outtype) not in cache:
            base, adapter, _, _ = models[name]
            cache[name, outtype] = root / f"{name}-lora-{outtype}.gguf"
            ggufsmith.convert_lora(adapter, cache[name, outtype], outtype, base)
        return cache[name, outtype]

    return convert


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_llamacpp_applies_the_adapter_as_merged(models, converted, name, outtype):
    _, _, expected, base_gguf = models[name]
    tolerance = GELU_F32_TOLERANCE if name == "gemma" and outtype == "f32" else TOLERANCE[outtype]
    got = llamacpp_logits(base_gguf, PROMPT, lora_path=converted(name, outtype))
    assert relative_error(got, expected) < tolerance
    without = llamacpp_logits(base_gguf, PROMPT)
    assert relative_error(without, expected) > 100 * tolerance  # the adapter matters


def test_cli_writes_the_file_the_api_writes(models, converted, tmp_path):
    base, adapter, _, _ = models["llama"]
    out = tmp_path / "adapter.gguf"
    proc = run_cli("convert-lora", adapter, out, "--base", base, "--outtype", "f16")
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stderr and f"{out}" in proc.stderr
    assert out.read_bytes() == converted("llama", "f16").read_bytes()
    dry = run_cli("convert-lora", adapter, tmp_path / "dry.gguf", "--base", base, "--dry-run")
    assert dry.returncode == 0 and "blk.0.attn_q.weight.lora_b" in dry.stdout
    assert not (tmp_path / "dry.gguf").exists()


def test_output_named_as_convert_lora_to_gguf_names_it(models, tmp_path):
    """Without OUT, the file goes into the adapter's folder under the name convert_lora_to_gguf.py gives
    it there without --outfile (<name>-<TYPE>-LoRA.gguf, from the adapter's folder name and model card),
    and is that script's file; an existing folder as OUT gets the same name; {ftype} in OUT is the type."""
    base, adapter, _, _ = models["llama"]
    theirs_dir, ours_dir = tmp_path / "reference" / adapter.name, tmp_path / "ours" / adapter.name
    shutil.copytree(adapter, theirs_dir)
    shutil.copytree(adapter, ours_dir)
    [theirs] = reference_lora_default_outputs(theirs_dir, base, "f16")
    assert theirs.name.endswith("-F16-LoRA.gguf")
    proc = run_cli("convert-lora", ours_dir, "--base", base, "--outtype", "f16")
    assert proc.returncode == 0, proc.stderr
    ours = ours_dir / theirs.name
    assert f"wrote {ours}" in proc.stderr
    assert_same_file(ours, theirs, KEY_DIFFERENCES)

    into = tmp_path / "into"
    into.mkdir()
    dry = run_cli("convert-lora", adapter, into, "--base", base, "--outtype", "f16", "--dry-run")
    assert dry.returncode == 0 and f"would write {into / theirs.name}" in dry.stderr
    assert list(into.iterdir()) == []
    proc = run_cli("convert-lora", adapter, into, "--base", base, "--outtype", "f16")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in into.iterdir()] == [theirs.name]

    proc = run_cli("convert-lora", adapter, into / "adapter-{ftype}.gguf", "--base", base, "--outtype", "auto")
    assert proc.returncode == 0, proc.stderr
    assert (into / "adapter-f16.gguf").read_bytes() == ours.read_bytes()  # float32 factors: auto is f16


def test_keys_llama_cpp_reads(converted):
    keys, tensors = gguf_contents(converted("llama", "f32"))
    assert keys["general.type"] == "adapter" and keys["adapter.type"] == "lora"
    assert keys["general.architecture"] == "llama"
    assert keys["adapter.lora.alpha"] == 16.0
    # numpy order: lora_a (r, in), lora_b (out, r)
    assert tensors["blk.0.attn_k.weight.lora_a"][0] == (64, 8)  # gguf-py gives ggml's order: (in, r)
    assert tensors["blk.0.attn_k.weight.lora_b"][0] == (8, 32)


# Keys ggufsmith writes otherwise than convert_lora_to_gguf.py, with the reason: none. (Both name the
# adapter after its folder and take base_model and tags from its model card, as for a model.)
KEY_DIFFERENCES: dict[str, str] = {}


@pytest.fixture(scope="session")
def reference(models, tmp_path_factory):
    """convert_lora_to_gguf.py's files, made once per model for the outtypes compared."""
    root = tmp_path_factory.mktemp("lora-reference")
    cache = {}

    def get(name: str) -> dict[str, Path]:
        if name not in cache:
            base, adapter, _, _ = models[name]
            cache[name] = reference_lora_conversions(adapter, base, root / name, COMPARED)
        return cache[name]

    return get


COMPARED = ("f32", "f16", "bf16", "q8_0")


@pytest.mark.parametrize("outtype", COMPARED)
@pytest.mark.parametrize("name", list(MODELS))
def test_same_file_as_convert_lora_to_gguf(converted, reference, name, outtype):
    """Same keys, values, tensor names, order, shapes, types and bytes (q8_0: lora_b's rows of r = 8
    values fall back to F16 in both)."""
    ours = converted(name, outtype)
    assert_same_file(ours, reference(name)[outtype], KEY_DIFFERENCES)
    if outtype == "q8_0":
        _, tensors = gguf_contents(ours)
        assert tensors["blk.0.attn_output.weight.lora_b"][1] == 1  # F16
        assert tensors["blk.0.attn_output.weight.lora_a"][1] == 8  # Q8_0


@pytest.fixture(scope="session")
def scaled_adapter(models, tmp_path_factory):
    base, _, _, base_gguf = models["llama"]
    adapter = tmp_path_factory.mktemp("lora-scaled") / "adapter"
    with contextlib.chdir(base.parent):  # a relative base_model in the model card, as in `models`
        logits = make_adapter(Path(base.name), "LlamaForCausalLM", adapter, seed=2, **SCALED)
    return base, adapter, logits, base_gguf


def test_rslora_patterns_and_embeddings_as_merged(scaled_adapter, tmp_path):
    """rsLoRA's alpha / sqrt(r), a module of another rank and one of another alpha, the token
    embeddings (lora_a looked up by token) and the output head: llama.cpp gives the merged model's
    logits. The file's alpha is lora_alpha * sqrt(r); the modules whose scale differs from
    alpha / r under it carry the difference in lora_b."""
    base, adapter, expected, base_gguf = scaled_adapter
    out = tmp_path / "scaled.gguf"
    ggufsmith.convert_lora(adapter, out, "f32", base)
    got = llamacpp_logits(base_gguf, PROMPT, lora_path=out)
    assert relative_error(got, expected) < TOLERANCE["f32"]
    keys, tensors = gguf_contents(out)
    assert keys["adapter.lora.alpha"] == pytest.approx(16 * math.sqrt(8), rel=1e-6)
    assert tensors["blk.0.attn_v.weight.lora_b"][0] == (4, 32)  # rank_pattern's r
    assert tensors["token_embd.weight.lora_a"][0] == (8, 1200)  # ggml order: (r, vocab)
    assert tensors["token_embd.weight.lora_b"][0] == (8, 64)
    assert "output.weight.lora_a" in tensors


def test_base_found_in_the_hugging_face_cache(models, converted, tmp_path):
    """Without --base, base_model_name_or_path names a repository id found in the local Hugging Face
    cache (HF_HUB_CACHE); only its config.json is there. --base with the id finds it there too."""
    base, adapter, _, _ = models["llama"]
    cache = tmp_path / "hub"
    snapshot = cache / "models--tiny-org--tiny-llama" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(base / "config.json", snapshot / "config.json")
    (cache / "models--tiny-org--tiny-llama" / "refs").mkdir()
    (cache / "models--tiny-org--tiny-llama" / "refs" / "main").write_text("0" * 40)
    moved = tmp_path / adapter.name  # the adapter's name is its folder's
    shutil.copytree(adapter, moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": "tiny-org/tiny-llama"}))
    out = tmp_path / "adapter.gguf"
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    for args in ([moved], [adapter, "--base", "tiny-org/tiny-llama"]):  # from the adapter config, or --base ID
        out.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-c", CLI_CODE, "convert-lora", *map(str, args), str(out)],
                              capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert out.read_bytes() == converted("llama", "f16").read_bytes()


def test_adapter_model_bin_reads_as_safetensors(models, converted, tmp_path):
    """adapter_model.bin (torch.load with weights_only) gives the same file as adapter_model.safetensors."""
    from safetensors.torch import load_file

    base, adapter, _, _ = models["qwen2"]
    moved = tmp_path / adapter.name
    shutil.copytree(adapter, moved)
    torch.save(load_file(moved / "adapter_model.safetensors"), moved / "adapter_model.bin")
    (moved / "adapter_model.safetensors").unlink()
    out = tmp_path / "adapter.gguf"
    ggufsmith.convert_lora(moved, out, "f16", base)
    assert out.read_bytes() == converted("qwen2", "f16").read_bytes()


def test_download_fetches_only_the_base_config(models, tmp_path, monkeypatch):
    """--download asks the Hub for the base model's config.json alone (not gigabytes of weights an
    adapter's conversion never reads)."""
    import huggingface_hub

    base, adapter, _, _ = models["llama"]
    asked = []

    def snapshot_download(repo_id, **options):  # stands in for the network, records the request
        asked.append((repo_id, options))
        if options.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        return str(base)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    ggufsmith.convert_lora(adapter, tmp_path / "out.gguf", "f16", "tiny-org/not-cached", download=True)
    assert [(repo, options.get("allow_patterns")) for repo, options in asked] == [("tiny-org/not-cached", ["config.json"])]


def test_scaled_adapter_against_convert_lora_to_gguf(scaled_adapter, tmp_path):
    """Where convert_lora_to_gguf.py converts the rsLoRA / rank_pattern / alpha_pattern adapter too,
    the files differ in adapter.lora.alpha (the reference writes lora_alpha as it is, ignoring
    use_rslora) and in the lora_b of the modules whose scale differs (the reference ignores
    alpha_pattern): every other tensor has the same bytes, and llama.cpp applies the reference's
    file at the wrong scale where it applies ours as the merged model."""
    base, adapter, expected, base_gguf = scaled_adapter
    ours = tmp_path / "ours.gguf"
    ggufsmith.convert_lora(adapter, ours, "f32", base)
    theirs = reference_lora_conversions(adapter, base, tmp_path / "reference", ("f32",))["f32"]
    (our_keys, our_tensors), (their_keys, their_tensors) = gguf_contents(ours), gguf_contents(theirs)
    assert {k for k in our_keys if our_keys[k] != their_keys.get(k)} == {"adapter.lora.alpha"}
    assert their_keys["adapter.lora.alpha"] == 16.0
    assert list(our_tensors) == list(their_tensors)
    rescaled = {name for name in our_tensors if our_tensors[name] != their_tensors[name]}
    assert rescaled == {f"blk.{i}.{t}.weight.lora_b" for i in range(2) for t in ("attn_v", "ffn_down")}
    assert relative_error(llamacpp_logits(base_gguf, PROMPT, lora_path=theirs), expected) > 0.1
