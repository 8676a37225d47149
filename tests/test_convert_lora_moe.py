"""LoRA adapters on the experts of a mixture-of-experts model, converted by `ggufsmith convert-lora`
and applied by llama.cpp (llama-cpp-python's `lora_path`, scale 1) on the base model converted by
ggufsmith, give the logits of transformers' model with the adapter merged in (PEFT merge_and_unload).

The models: a small random Mixtral and Qwen3-MoE (2 layers, 4 experts, 2 used per token) as
transformers 5 holds them, experts fused into 3-D parameters (`mlp.experts.gate_up_proj` (E, 2F, D),
`down_proj` (E, D, F)).
The adapters, made by peft with random non-zero factors (init_lora_weights=False):
  - `target_parameters` on both expert stacks (peft's ParamWrapper: one lora_A (E * r, in) and one
    lora_B (out, r * E) per parameter, two wrappers nested on one module) and `target_modules` on
    the attention projections, with a rank_pattern and an alpha_pattern on the experts so that
    their scale differs from the file's alpha / r; llama.cpp applies the gate_up LoRA as two,
    ffn_gate_exps and ffn_up_exps, each (E, r, D) / (E, F, r);
  - the same update as per-expert linear LoRAs (`block_sparse_moe.experts.N.w1/w3/w2`), the layout
    of adapters trained on transformers 4's Mixtral, whose experts were nn.Linear modules (peft
    cannot make it on transformers 5, which has no such modules): written here from the first
    adapter's factors, and also converted by llama.cpp's convert_lora_to_gguf.py, which gives the
    same file.

Tolerances, max |llama.cpp - transformers| / std(transformers' logits), base model in F32, as in
tests/test_convert_lora.py: adapter f32 1e-3 (measured 9.4e-6 Mixtral, 2.8e-6 Qwen3-MoE, 9.4e-6
per-expert), f16 2e-2 (measured 8.2e-3 and 2.6e-3: the factors rounded to float16; the routing
stays the same for these prompts and seeds). Without the expert LoRAs (the attention's alone
merged) the logits are 2.2 (Mixtral) and 1.04 (Qwen3-MoE) standard deviations away, more than 100
times the f32 tolerance: a dropped, misplaced or mis-scaled expert tensor cannot pass.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

import ggufsmith
from tests.family_models import build_model, llamacpp_logits, relative_error
from tests.llamacpp_reference import assert_same_file, gguf_contents, reference_lora_conversions
from tests.tokenizer_helpers import train_bpe, train_sentencepiece

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.slow

TOLERANCE = {"f32": 1e-3, "f16": 2e-2}
PROMPT = [1] + [(17 * i) % 580 + 10 for i in range(24)]
EXPERTS = 4
FF = 48  # the experts' intermediate size
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
             num_experts_per_tok=2)
# kind -> (config class, model class, tokenizer, config fields)
MODELS = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "sentencepiece",
                dict(SMALL, vocab_size=1200, intermediate_size=FF, num_local_experts=EXPERTS)),
    # q/k norms, head_dim apart from hidden / heads, experts sized by moe_intermediate_size
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen2",
                 dict(SMALL, vocab_size=608, intermediate_size=96, moe_intermediate_size=FF, num_experts=EXPERTS,
                      head_dim=24, norm_topk_prob=True)),
}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERT_STACKS = ["experts.gate_up_proj", "experts.down_proj"]
LORA = dict(r=4, lora_alpha=8, init_lora_weights=False, target_modules=ATTENTION, target_parameters=EXPERT_STACKS,
            rank_pattern={"gate_up_proj": 6}, alpha_pattern={"down_proj": 3})
# transformers 4's per-expert names of the fused stacks' parts: gate_up_proj -> w1 (gate), w3 (up); down_proj -> w2
PER_EXPERT = {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}


def merged_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0].float().numpy()


@pytest.fixture(scope="session")
def moe_models(tmp_path_factory):
    """moe_models(kind): (base folder, its F32 GGUF, the peft adapter folder, the merged model's
    logits, the logits of the base with the attention's LoRAs alone merged), made once per kind."""
    root = tmp_path_factory.mktemp("lora-moe")
    cache = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = make_moe_model(root, kind)
        return cache[kind]

    return get


def make_moe_model(root: Path, kind: str):
    config_class, model_class, tokenizer, fields = MODELS[kind]
    base = root / kind
    if tokenizer == "sentencepiece":
        train_sentencepiece(base)
    else:
        train_bpe(base, tokenizer, vocab_size=600)
    build_model(config_class, model_class, base, **fields)
    adapter = root / f"{kind}-adapter"
    model_type = getattr(transformers, model_class)
    with contextlib.chdir(root):  # a relative base_model in the adapter's model card, as in test_convert_lora
        model = model_type.from_pretrained(Path(base.name), dtype=torch.float32)
        torch.manual_seed(3)
        peft_model = peft.get_peft_model(model, peft.LoraConfig(**LORA))
        peft_model.save_pretrained(adapter)
        expected = merged_logits(peft_model.merge_and_unload().eval())
        model = model_type.from_pretrained(Path(base.name), dtype=torch.float32)
        peft_model = peft.PeftModel.from_pretrained(model, adapter)
        for module in peft_model.modules():  # zero the experts' updates, keep the attention's
            if type(module).__name__ == "ParamWrapper":
                torch.nn.init.zeros_(module.lora_B["default"].weight)
        without_experts = merged_logits(peft_model.merge_and_unload().eval())
    base_gguf = root / f"{kind}-f32.gguf"
    ggufsmith.convert(base, base_gguf, outtype="f32")
    return base, base_gguf, adapter, expected, without_experts


@pytest.fixture(scope="session")
def mixtral(moe_models):
    return moe_models("mixtral")


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_fused_expert_lora_as_merged(moe_models, tmp_path, kind, outtype):
    """target_parameters on experts.gate_up_proj / down_proj (two ParamWrappers on one module, each
    at its own rank and alpha) beside attention LoRAs: llama.cpp applies the file as the merged model."""
    base, base_gguf, adapter, expected, without_experts = moe_models(kind)
    out = tmp_path / "moe-lora.gguf"
    ggufsmith.convert_lora(adapter, out, outtype, base)
    keys, tensors = gguf_contents(out)
    assert keys["adapter.lora.alpha"] == 8.0
    # gguf-py's (ggml's) order: lora_a (in, r, E), lora_b (r, out, E); gate_up's rank 6, split in two
    assert tensors["blk.0.ffn_gate_exps.weight.lora_a"][0] == (64, 6, EXPERTS)
    assert tensors["blk.0.ffn_up_exps.weight.lora_b"][0] == (6, FF, EXPERTS)
    assert tensors["blk.1.ffn_down_exps.weight.lora_a"][0] == (FF, 4, EXPERTS)
    assert tensors["blk.1.ffn_down_exps.weight.lora_b"][0] == (4, 64, EXPERTS)
    got = llamacpp_logits(base_gguf, PROMPT, lora_path=out)
    assert relative_error(got, expected) < TOLERANCE[outtype]
    # the experts' LoRAs matter: without them (attention alone) the logits are far off
    assert relative_error(without_experts, expected) > 100 * TOLERANCE["f32"]
    assert relative_error(llamacpp_logits(base_gguf, PROMPT), expected) > 100 * TOLERANCE["f32"]


def per_expert_adapter(adapter: Path, out: Path) -> Path:
    """The fused adapter's update as per-expert linear LoRAs (transformers 4's Mixtral layout):
    expert e's A is rows e*r..(e+1)*r of the ParamWrapper's lora_A, its B the columns k*E + e of
    lora_B (peft's ParamWrapper.get_delta_weight); gate_up's B rows split in gate (w1) and up (w3).
    Each expert module gets its stack's rank and alpha, as rank/alpha patterns on w1/w3 and w2."""
    tensors = safetensors_torch.load_file(adapter / "adapter_model.safetensors")
    config = json.loads((adapter / "adapter_config.json").read_text())
    written = {}
    for name, tensor in tensors.items():
        if ".experts." not in name:
            written[name] = tensor
            continue
        if not name.endswith("lora_A.weight"):
            continue
        module = name.removesuffix(".lora_A.weight")
        parameter = "gate_up_proj" if module.endswith(".base_layer") else "down_proj"  # the first registered innermost
        prefix = module.removesuffix(".base_layer").removesuffix(".mlp.experts")
        lora_a, lora_b = tensor, tensors[f"{module}.lora_B.weight"]
        rank = lora_a.shape[0] // EXPERTS
        for e in range(EXPERTS):
            a = lora_a[e * rank:(e + 1) * rank]
            b = lora_b.reshape(lora_b.shape[0], rank, EXPERTS)[:, :, e]
            for part, b_part in zip(PER_EXPERT[parameter], b.chunk(len(PER_EXPERT[parameter]))):
                target = f"{prefix}.block_sparse_moe.experts.{e}.{part}"
                written[f"{target}.lora_A.weight"] = a.clone()
                written[f"{target}.lora_B.weight"] = b_part.clone()
    out.mkdir()
    safetensors_torch.save_file(written, out / "adapter_model.safetensors")
    config |= dict(target_parameters=None, target_modules=[*ATTENTION, "w1", "w2", "w3"],
                   rank_pattern={"w1": 6, "w3": 6}, alpha_pattern={"w2": 3})
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session")
def per_expert(mixtral, tmp_path_factory):
    _, _, adapter, _, _ = mixtral
    return per_expert_adapter(adapter, tmp_path_factory.mktemp("lora-moe-per-expert") / "adapter")


def test_per_expert_lora_as_merged(mixtral, per_expert, tmp_path):
    """experts.N.w1/w2/w3 LoRAs, stacked per layer into ffn_*_exps' lora_a / lora_b: llama.cpp gives
    the merged model's logits, and the file is the fused adapter's, tensor for tensor."""
    base, base_gguf, fused, expected, _ = mixtral
    out = tmp_path / "per-expert.gguf"
    ggufsmith.convert_lora(per_expert, out, "f32", base)
    assert relative_error(llamacpp_logits(base_gguf, PROMPT, lora_path=out), expected) < TOLERANCE["f32"]
    from_fused = tmp_path / "fused.gguf"
    ggufsmith.convert_lora(fused, from_fused, "f32", base)
    (_, ours), (_, theirs) = gguf_contents(out), gguf_contents(from_fused)
    assert ours == theirs  # same tensors, shapes, types and bytes: one update, two layouts


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_per_expert_lora_same_file_as_convert_lora_to_gguf(mixtral, per_expert, tmp_path, outtype):
    """llama.cpp's convert_lora_to_gguf.py converts the per-expert adapter too (it stacks the
    experts' factors into one lora_a / lora_b per stack): with the experts at one alpha (the
    reference ignores alpha_pattern) the files are the same, keys, tensors and bytes. Each stack's
    own rank (rank_pattern: gate/up 6, down 4) needs nothing: llama.cpp reads r from each lora_b."""
    base, _, _, _, _ = mixtral
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "adapter_model.safetensors").write_bytes((per_expert / "adapter_model.safetensors").read_bytes())
    config = json.loads((per_expert / "adapter_config.json").read_text()) | dict(alpha_pattern={})
    (plain / "adapter_config.json").write_text(json.dumps(config))
    ours = tmp_path / "ours.gguf"
    ggufsmith.convert_lora(plain, ours, outtype, base)
    theirs = reference_lora_conversions(plain, base, tmp_path / "reference", (outtype,))[outtype]
    assert_same_file(ours, theirs, {})
