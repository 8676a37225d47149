"""The conversion pipeline, checked with independent readers: gguf-py's GGUFReader and dequantizer,
gguf-py's own model-metadata heuristics, torch's dtype conversions of the HF weights.

The architecture is a test-only plugin (tests/pipeline_toy_plugin.py) so that these tests exercise
the pipeline alone; end-to-end runs through llama.cpp live with the llama plugin's tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ggufsmith
from ggufsmith.constants import GGMLType
from ggufsmith.quantize import dequantize, supported_types

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_toy_plugin import ToyLlama  # noqa: E402
from terminal import run_on_terminal  # noqa: E402

gguf = pytest.importorskip("gguf")
REPO = Path(__file__).resolve().parent.parent
CLI_WITH_TOY = (
    "import sys; sys.path.insert(0, 'tests'); import pipeline_toy_plugin as p; p.register(); "
    "from ggufsmith.cli import main; sys.exit(main(sys.argv[1:]))"
)

HIDDEN, FF, VOCAB, LAYERS = 64, 80, 1280, 2  # FF=80: ffn_down rows are no multiple of 32 (fallback)


def _toy_state(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.5).to(dtype)

    state = {"model.embed_tokens.weight": w(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": w(HIDDEN),
            p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": w(32, HIDDEN),
            p + "self_attn.v_proj.weight": w(32, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
            p + "post_attention_layernorm.weight": w(HIDDEN),
            p + "mlp.gate_proj.weight": w(FF, HIDDEN),
            p + "mlp.up_proj.weight": w(FF, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, FF),
            p + "mlp.router.weight": w(4, HIDDEN),  # llama.cpp keeps routers F32
            p + "extra.weight": w(8, HIDDEN),  # the plugin asks for F32
        })
    state["model.norm.weight"] = w(HIDDEN)
    state["lm_head.weight"] = w(VOCAB, HIDDEN)
    return state


def _save_toy(model_dir: Path, dtype: torch.dtype, shards: int = 2) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    model_dir.mkdir(parents=True, exist_ok=True)
    state = _toy_state(dtype)
    config = {"architectures": ["ToyLlamaForCausalLM"], "model_type": "toyllama", "hidden_size": HIDDEN,
              "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "_name_or_path": "SomeOrg/Toy-Llama-7B-Chat-v1.1"}
    (model_dir / "config.json").write_text(json.dumps(config))
    names = list(state)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * len(names) // shards:(i + 1) * len(names) // shards]
        save_file({n: state[n].contiguous() for n in part}, model_dir / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return state


@pytest.fixture(scope="module")
def toy_bf16(tmp_path_factory):
    """The toy checkpoint in bf16 with a small trained SentencePiece tokenizer (padded to VOCAB)."""
    from tokenizer_helpers import train_sentencepiece

    model_dir = tmp_path_factory.mktemp("toy") / "toy-bf16"
    state = _save_toy(model_dir, torch.bfloat16)
    train_sentencepiece(model_dir, vocab_size=1000)
    return model_dir, state


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "mlp.router": "ffn_gate_inp", "extra": "extra",
}


def _gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, bid, rest = hf.split(".", 3)
    return f"blk.{bid}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def _read(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return fields, {t.name: t for t in reader.tensors}


def _expected_type(gguf_name: str, shape, outtype: GGMLType) -> GGMLType:
    """llama.cpp's rules, spelled out independently of ggufsmith's code for the toy model."""
    if len(shape) == 1 or "ffn_gate_inp" in gguf_name or ".extra." in gguf_name:
        return GGMLType.F32
    block = {GGMLType.Q8_0: 32, GGMLType.Q3_K: 256, GGMLType.Q4_K: 256, GGMLType.Q5_K: 256}.get(outtype, 1)
    if shape[-1] % block == 0:
        return outtype
    if outtype == GGMLType.Q3_K and shape[-1] % 32 == 0:
        return GGMLType.Q4_0
    if outtype == GGMLType.Q4_K and shape[-1] % 32 == 0:
        return GGMLType.Q5_0
    if outtype == GGMLType.Q5_K and shape[-1] % 32 == 0:
        return GGMLType.Q5_1
    return GGMLType.F16


# the plain output types (every weight that type); preset names (q4_0, q6_k, q4_k_m...) are
# tested against llama.cpp's quantizer in test_requantize_*.py
@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0", "q3_k", "q4_k", "q5_k"])
def test_converted_tensors_match_the_hf_weights(tmp_path, toy_bf16, outtype):
    model_dir, state = toy_bf16
    target = GGMLType[outtype.upper()]
    if target not in supported_types():
        pytest.skip(f"{outtype} quantizer not on this branch")
    out = tmp_path / "toy.gguf"
    plan = ggufsmith.convert(model_dir, out, outtype, arch=ToyLlama, with_tokenizer=False)
    fields, tensors = _read(out)
    assert sorted(tensors) == sorted(_gguf_name(n) for n in state)  # every tensor once
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    shard_of = [index[n] for n in state for t in tensors if t == _gguf_name(n)]
    order = [next(index[n] for n in state if _gguf_name(n) == t) for t in tensors]
    assert order == sorted(shard_of)  # shards in order, as llama.cpp reads them
    for hf_name, weight in state.items():
        t = tensors[_gguf_name(hf_name)]
        expected_type = _expected_type(t.name, weight.shape, target)
        assert GGMLType(int(t.tensor_type)) == expected_type, t.name
        assert tuple(int(d) for d in reversed(t.shape)) == tuple(weight.shape)
        raw = np.asarray(t.data)
        ours = dequantize(raw.reshape(-1).view(np.uint8), expected_type, tuple(weight.shape))
        theirs = gguf.quants.dequantize(raw.view(np.uint8) if raw.dtype != np.uint8 else raw, gguf.GGMLQuantizationType(int(t.tensor_type)))
        np.testing.assert_array_equal(ours, np.asarray(theirs, dtype=np.float32).reshape(weight.shape), err_msg=t.name)
        exact = {GGMLType.F32: weight.float(), GGMLType.F16: weight.float().half().float(),
                 GGMLType.BF16: weight.float()}.get(expected_type)
        if exact is not None:
            np.testing.assert_array_equal(ours, exact.numpy(), err_msg=t.name)
        else:  # block quantization: the error of each 32-value block is bounded by a fraction of its range
            ref = weight.float().numpy().reshape(-1, 32)
            tol = {GGMLType.Q8_0: 0.01, GGMLType.Q6_K: 0.05, GGMLType.Q5_0: 0.07, GGMLType.Q5_1: 0.07,
                   GGMLType.Q4_0: 0.13, GGMLType.Q4_K: 0.13, GGMLType.Q5_K: 0.07, GGMLType.Q3_K: 0.3}[expected_type]
            err = np.abs(ours.reshape(-1, 32) - ref).max(axis=1)
            assert (err <= tol * np.abs(ref).max(axis=1) + 1e-6).all(), t.name
    assert fields["general.architecture"] == "toyllama"
    assert fields["general.file_type"] == int(plan.file_type)
    assert fields["general.quantization_version"] == 2
    assert fields["toyllama.block_count"] == LAYERS


def test_fallbacks_are_planned_and_reported(toy_bf16, capsys):
    model_dir, _ = toy_bf16
    plan = ggufsmith.convert(model_dir, "unused.gguf", "q4_k", arch=ToyLlama, dry_run=True, with_tokenizer=False)
    by_name = {t.name: t for t in plan.tensors}
    assert by_name["blk.0.ffn_down.weight"].ggml_type == GGMLType.F16  # rows of 80: no 32-block type fits
    assert by_name["blk.0.ffn_up.weight"].ggml_type == GGMLType.Q5_0  # llama-quantize's Q4_K fallback
    assert "rows of 80" in by_name["blk.0.ffn_down.weight"].note
    assert {t.name for t in plan.fallbacks} == {n for n, t in by_name.items() if len(t.shape) == 2 and "gate_inp" not in n and "extra" not in n}
    assert not Path("unused.gguf").exists()


def test_general_metadata_agrees_with_gguf_py_heuristics(tmp_path):
    """gguf-py's Metadata.load is what convert_hf_to_gguf.py uses for general.*; ours must agree."""
    model_dir = tmp_path / "checkpoint-dir"
    _save_toy(model_dir, torch.float16, shards=1)
    (model_dir / "README.md").write_text(
        "---\nlicense: apache-2.0\nlanguage:\n- en\n- no\ntags:\n- text-generation\npipeline_tag: text-generation\n"
        "base_model: SomeOrg/Base-Llama-7B-v1\ndatasets:\n- someone/some-data\n---\n# Toy\n"
    )
    (model_dir / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "top_p": 0.9, "top_k": 40,
                                                                   "repetition_penalty": 1.1}))
    plan = ggufsmith.convert(model_dir, tmp_path / "x.gguf", "f16", arch=ToyLlama, dry_run=True, with_tokenizer=False)
    ours = {k: v.plain() for k, v in plan.metadata.items()}

    n_params = sum(int(np.prod(t.shape)) for t in plan.tensors)
    ref = _reference_metadata(model_dir, n_params)
    G = "general."
    expected = {G + "name": ref["name"], G + "organization": ref["organization"], G + "basename": ref["basename"],
                G + "finetune": ref["finetune"], G + "version": ref["version"],
                # convert_hf_to_gguf.py counts the parameters when the name gives no plausible size
                G + "size_label": ref["size_label"] or ref["counted_size_label"],
                G + "license": ref["license"], G + "tags": ref["tags"], G + "languages": ref["languages"],
                G + "base_model.count": len(ref["base_models"]), G + "base_model.0.name": ref["base_models"][0]["name"],
                G + "base_model.0.organization": ref["base_models"][0]["organization"],
                G + "base_model.0.repo_url": ref["base_models"][0]["repo_url"],
                G + "dataset.count": len(ref["datasets"]), G + "dataset.0.name": ref["datasets"][0]["name"],
                G + "sampling.temp": ref["sampling_temp"], G + "sampling.top_k": ref["sampling_top_k"],
                G + "sampling.top_p": ref["sampling_top_p"], G + "sampling.penalty_repeat": ref["sampling_penalty_repeat"]}
    for key, value in expected.items():
        assert value is not None, key
        got = ours.get(key)
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-6), key
        else:
            assert got == value, key
    assert ours["general.type"] == "model"


@pytest.mark.parametrize("base_model", ["/tmp/pytest-of-root/run/checkpoints/Base-Llama-7B-v1", "./outputs/Base-Llama-7B-v1",
                                        "C:\\runs\\Base-Llama-7B-v1", "~/models/Base-Llama-7B-v1/"])
def test_a_base_model_given_as_a_local_folder_is_named_but_not_linked(tmp_path, base_model):
    """A fine-tune's card written on the trainer's machine names its base by a path: the folder's
    name is the base model's name; no organization made of path parts, no huggingface.co link."""
    model_dir = tmp_path / "checkpoint-dir"
    _save_toy(model_dir, torch.float16, shards=1)
    (model_dir / "README.md").write_text(f"---\nbase_model: {json.dumps(base_model)}\n---\n")
    plan = ggufsmith.convert(model_dir, tmp_path / "x.gguf", "f16", arch=ToyLlama, dry_run=True, with_tokenizer=False)
    ours = {k: v.plain() for k, v in plan.metadata.items()}
    assert ours["general.base_model.count"] == 1
    assert ours["general.base_model.0.name"] == "Base Llama 7B v1"
    assert "general.base_model.0.organization" not in ours and "general.base_model.0.repo_url" not in ours


def _reference_metadata(model_dir: Path, n_params: int) -> dict:
    """gguf-py's Metadata.load, from the same llama.cpp as the reference converter (run apart)."""
    from llamacpp_reference import reference_env

    code = (
        "import json, sys, dataclasses; from pathlib import Path; import gguf\n"
        "from gguf.metadata import Metadata\n"
        "n = int(sys.argv[2]); m = Metadata.load(None, Path(sys.argv[1]), None, n)\n"
        "d = dataclasses.asdict(m); d['counted_size_label'] = gguf.size_label(n, n, 0, 0)\n"
        "print(json.dumps(d))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(model_dir), str(n_params)], capture_output=True,
                          text=True, env=reference_env(), check=True)
    return json.loads(proc.stdout)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI_WITH_TOY, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def test_cli_dry_run_prints_the_plan_and_writes_nothing(tmp_path, toy_bf16):
    model_dir, state = toy_bf16
    out = tmp_path / "x.gguf"
    proc = _cli("convert", "--arch", "toyllama", str(model_dir), str(out), "--outtype", "q8_0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
    lines = proc.stdout.splitlines()
    row = next(line for line in lines if line.startswith("model.layers.1.mlp.down_proj.weight"))
    assert row.split()[:5] == ["model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight", "64x80", "F16",
                               str(64 * 80 * 2)]
    assert "fallback Q8_0 -> F16" in row
    row = next(line for line in lines if line.startswith("lm_head.weight"))
    assert row.split()[:5] == ["lm_head.weight", "output.weight", f"{VOCAB}x{HIDDEN}", "Q8_0", str(VOCAB * HIDDEN // 32 * 34)]
    assert len([line for line in lines if line.startswith("model.") or line.startswith("lm_head")]) == len(state)


def test_cli_progress_and_quiet(tmp_path, toy_bf16):
    model_dir, _ = toy_bf16
    status, stderr = run_on_terminal([sys.executable, "-c", CLI_WITH_TOY, "convert", "--arch", "toyllama", str(model_dir),
                                      str(tmp_path / "a.gguf"), "--outtype", "f16"], REPO)
    assert status == 0, stderr
    assert "a.gguf: 100%" in stderr and "B/s" in stderr  # tqdm's byte bar, on a terminal's stderr
    piped = _cli("convert", "--arch", "toyllama", str(model_dir), str(tmp_path / "c.gguf"), "--outtype", "f16")
    assert piped.returncode == 0 and "%" not in piped.stderr and "wrote" in piped.stderr  # no bar in a pipe or log
    assert "blk.0.ffn_down.weight" not in piped.stdout
    quiet = _cli("convert", "--arch", "toyllama", str(model_dir), str(tmp_path / "b.gguf"), "--outtype", "f16", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    fields, _ = _read(tmp_path / "a.gguf")
    assert fields["tokenizer.ggml.model"] == "llama" and len(fields["tokenizer.ggml.tokens"]) == VOCAB
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "c.gguf"]


def test_error_mid_conversion_leaves_nothing(tmp_path, toy_bf16):
    model_dir, _ = toy_bf16

    class Failing(ToyLlama):
        def transform(self, name, tensor):
            if name == "blk.1.ffn_up.weight":
                def boom(a):
                    raise ggufsmith.GgufsmithError("simulated failure")
                return tensor.map(boom)
            return tensor

    out = tmp_path / "x.gguf"
    with pytest.raises(ggufsmith.GgufsmithError, match="blk.1.ffn_up.weight.*simulated failure"):
        ggufsmith.convert(model_dir, out, "q8_0", arch=Failing, with_tokenizer=False)
    assert list(tmp_path.iterdir()) == []


def test_unknown_outtype_and_architecture_are_one_line_errors(tmp_path, toy_bf16):
    model_dir, _ = toy_bf16
    proc = _cli("convert", str(model_dir), str(tmp_path / "x.gguf"), "--arch", "nonesuch")
    assert proc.returncode == 1 and "unknown architecture 'nonesuch'" in proc.stderr and "toyllama" in proc.stderr
    proc = _cli("convert", str(tmp_path / "missing"), str(tmp_path / "x.gguf"))
    assert proc.returncode == 1 and str(tmp_path / "missing") in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_ctrl_c_mid_conversion_leaves_no_file(tmp_path, toy_bf16):
    """SIGINT while a ~200 MB model converts: exit 130, neither the .gguf nor a temporary file remains."""
    from safetensors.numpy import save_file

    model_dir = tmp_path / "big"
    model_dir.mkdir()
    rng = np.random.default_rng(0)
    block = rng.standard_normal((1024, 1024), dtype=np.float32)
    state = {"model.embed_tokens.weight": block}
    for i in range(48):
        state[f"model.layers.{i}.mlp.up_proj.weight"] = block
    save_file(state, model_dir / "model.safetensors")
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["ToyLlamaForCausalLM"], "hidden_size": 1024,
                                                      "num_hidden_layers": 48, "vocab_size": VOCAB}))
    for name in ("tokenizer.model", "tokenizer_config.json"):
        (model_dir / name).write_bytes((toy_bf16[0] / name).read_bytes())
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", CLI_WITH_TOY, "convert", str(model_dir), str(out_dir / "big.gguf"),
                             "--outtype", "q8_0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(p.name.endswith(".tmp") and p.stat().st_size > 10**6 for p in out_dir.iterdir()):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert list(out_dir.iterdir()) == []
    assert os.listdir(out_dir) == []


@pytest.mark.slow
def test_memory_stays_bounded_by_slices_not_tensors(tmp_path, toy_bf16):
    """Two 128 MiB float32 tensors convert with a peak RSS well under one tensor's size."""
    from safetensors.numpy import save_file

    model_dir = tmp_path / "wide"
    model_dir.mkdir()
    big = np.random.default_rng(0).standard_normal((8192, 4096), dtype=np.float32)
    save_file({"model.embed_tokens.weight": big, "lm_head.weight": big}, model_dir / "model.safetensors")
    del big
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["ToyLlamaForCausalLM"], "hidden_size": 4096,
                                                      "num_hidden_layers": 0, "vocab_size": VOCAB}))
    for name in ("tokenizer.model", "tokenizer_config.json"):
        (model_dir / name).write_bytes((toy_bf16[0] / name).read_bytes())
    code = (
        "import resource, sys; sys.path.insert(0, 'tests'); import pipeline_toy_plugin as p; p.register()\n"
        "from ggufsmith.cli import main\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "assert main(sys.argv[1:]) == 0\n"
        "print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, "convert", str(model_dir), str(tmp_path / "wide.gguf"),
                           "--outtype", "f16", "--quiet"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    before_kib, peak_kib = map(int, proc.stdout.split())
    # Loading one tensor whole would add 128 MiB (float32) + 64 MiB (f16) on top of the imports.
    assert (peak_kib - before_kib) / 1024 < 100, (before_kib, peak_kib)


def test_bf16_to_f16_shortcut_equals_numpy_for_every_bf16_value():
    """The integer bf16 -> f16 path against numpy's float32 -> float16 cast, for all 65536 patterns."""
    from ggufsmith.converters.pipeline import bf16_bits_to_f16_bits

    bits = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(over="ignore"):
        expected = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float16).view(np.uint16)
    got = bf16_bits_to_f16_bits(bits.reshape(256, 256)).view(np.uint16)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_stacked_experts_stream_in_slices_across_expert_boundaries(tmp_path, monkeypatch, outtype):
    """Expert tensors are stacked into one GGUF tensor; slices that straddle two experts must give
    exactly np.stack of the experts."""
    from safetensors.torch import save_file

    import ggufsmith.converters.pipeline as pipeline
    from ggufsmith.readers.checkpoint import open_checkpoint
    from ggufsmith.readers.lazy_tensor import RowSlicedTensor

    g = torch.Generator().manual_seed(1)
    experts = [torch.randn(10, 64, generator=g).to(torch.bfloat16) for _ in range(4)]
    save_file({f"model.layers.0.experts.{i}.up.weight": e for i, e in enumerate(experts)}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["ToyLlamaForCausalLM"], "hidden_size": 64,
                                                      "num_hidden_layers": 1}))
    with open_checkpoint(tmp_path) as ckpt:
        (mapped,) = ToyLlama(ckpt.config).map_tensors(ckpt.tensors)
        assert isinstance(mapped.tensor, RowSlicedTensor) and mapped.tensor.shape == (4, 10, 64)
    monkeypatch.setattr(pipeline, "SLICE_ELEMENTS", 7 * 64)  # slices of 7 rows over experts of 10
    out = tmp_path / "x.gguf"
    ggufsmith.convert(tmp_path, out, outtype, arch=ToyLlama, with_tokenizer=False)
    _, tensors = _read(out)
    t = tensors["blk.0.ffn_up_exps.weight"]
    stacked = torch.stack(experts).float()
    expected_type = GGMLType[outtype.upper()]
    assert GGMLType(int(t.tensor_type)) == expected_type
    ours = dequantize(np.asarray(t.data).reshape(-1).view(np.uint8), expected_type, (4, 10, 64))
    if outtype == "q8_0":
        reference = gguf.quants.quantize(stacked.numpy(), gguf.GGMLQuantizationType.Q8_0)
        np.testing.assert_array_equal(ours, gguf.quants.dequantize(reference, gguf.GGMLQuantizationType.Q8_0))
    else:
        np.testing.assert_array_equal(ours, (stacked.half().float() if outtype == "f16" else stacked).numpy())


def test_transposed_expert_stacks_stream_in_slices(tmp_path, monkeypatch):
    """Llama 4's expert stacks (E, hidden, 2F), transposed and split into gate and up, stay
    row-sliceable: every range of rows equals numpy's transpose, as stored (bf16 bits) and widened,
    and no read of the checkpoint exceeds a block of rows."""
    from safetensors.torch import save_file

    import ggufsmith.readers.lazy_tensor as lazy_tensor
    from ggufsmith.readers.checkpoint import open_checkpoint
    from ggufsmith.readers.lazy_tensor import RowSlicedTensor

    stack = torch.randn(3, 8, 10, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)  # (E, hidden, 2F)
    save_file({"gate_up_proj": stack}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(lazy_tensor, "_BLOCK_ELEMENTS", 3 * 10)  # blocks of 3 of a matrix's 8 rows
    expected = np.swapaxes(stack.float().numpy(), -1, -2)  # (E, 2F, hidden)
    with open_checkpoint(tmp_path) as ckpt:
        source = ckpt.tensors["gate_up_proj"]
        widest = []
        counted = dataclasses.replace(source, rows_loader=lambda a, b: widest.append(b - a) or source.load_rows(a, b))
        gate, up = counted.swap_last_axes().split(2, -2)
        for part, rows in ((gate, expected[:, :5]), (up, expected[:, 5:])):
            assert isinstance(part, RowSlicedTensor) and part.shape == (3, 5, 8)
            flat = rows.reshape(-1, 8)
            for start in range(16):
                for stop in range(start, 16):
                    np.testing.assert_array_equal(part.load_rows(start, stop), flat[start:stop])
                    bits = part.load_stored_rows(start, stop)
                    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32), flat[start:stop])
    assert max(widest) <= 3
