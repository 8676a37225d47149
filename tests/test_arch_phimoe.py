"""PhiMoE (Phi-3.5-MoE) converted by ggufsmith, in both expert layouts, against llama.cpp and
transformers.

llama.cpp's phimoe graph computes two things otherwise than transformers' PhimoeForCausalLM (the
file is written as llama.cpp's converter writes it, see docs/architectures.md):
- its norms are RMSNorms plus the bias, where transformers' are LayerNorms (the mean subtracted);
- it weights the top-2 experts by a softmax over all router logits renormalized over the two, where
  transformers' SparseMixer (eval mode) gives each of the two the softmax over only the experts
  whose logits are within a relative 2 x router_jitter_noise of it (for most tokens 1 and 1).
So the logits are compared with transformers' forward with exactly those two swapped for what
llama.cpp computes (`as_llamacpp_computes`, a patch of the loaded modules, nothing else): every
tensor, key and layout still has to be right for them to match. A separate test states the gap to
unpatched transformers (measured 4.9 std at f32; 2.7 from the norms alone, 3.8 from the routing
alone), the number docs/architectures.md gives. Tolerances as in tests/test_arch_moe.py.
"""

from __future__ import annotations

import json
import shutil

import pytest

import ggufsmith
from tests.decoder_reference import reference_convert
from tests.family_models import build_model, llamacpp_logits, prompt_ids, relative_error
from tests.llamacpp_reference import TOKENIZER_KEY_DIFFERENCES, assert_same_file
from tests.test_arch_dense import KEY_DIFFERENCES, PHI3_DIFFERENCES, PHI3_END, train_phi3_tokenizer
from tests.moe_harness import TOLERANCE, conversions, logits_error
from tests.test_arch_moe import ATTENTION, LAYOUTS

llama_cpp = pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

# Phi-3's tokenizer (Phi-3.5-MoE's; llama.cpp's converter reads its tokenizer.model). llama.cpp's
# phimoe requires the attention output's and the head's biases (as Phi-3.5-MoE has them).
PHIMOE = dict(ATTENTION, bos_token_id=1, eos_token_id=PHI3_END, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, attention_bias=True,
              lm_head_bias=True, original_max_position_embeddings=512)  # which llama.cpp's converter requires
# Phi-3.5-MoE's LongRoPE: per-pair short/long divisors and the cos/sin scale short_mscale (= long_mscale),
# within original_max_position_embeddings (the context llama.cpp is given is 256: the short factors).
LONGROPE = dict(PHIMOE, max_position_embeddings=1024, original_max_position_embeddings=None, rope_parameters={
    "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 256,
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8], "long_factor": [1.5, 2, 3, 4, 6, 8, 10, 12],
    "short_mscale": 1.2, "long_mscale": 1.2})
VARIANTS = {("phimoe", layout): PHIMOE for layout in LAYOUTS} | {("phimoe-longrope", "per-expert"): LONGROPE}


def as_llamacpp_computes(model) -> None:
    """Make a loaded PhimoeForCausalLM compute what llama.cpp's phimoe graph does: RMSNorm plus bias
    in place of each LayerNorm, and the top-2 experts weighted by the softmax over all experts
    renormalized over the two, in place of SparseMixer."""

    def rms_norm_plus_bias(norm):
        return lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight + norm.bias

    def softmax_top_k(router):
        def forward(hidden):
            logits = torch.nn.functional.linear(hidden, router.weight)
            weights, chosen = torch.topk(torch.softmax(logits.float(), dim=-1), router.top_k, dim=-1)
            return logits, weights / weights.sum(dim=-1, keepdim=True), chosen
        return forward

    patched = {"norms": 0, "routers": 0}
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.forward = rms_norm_plus_bias(module)
            patched["norms"] += 1
        elif type(module).__name__ == "PhimoeTopKRouter":
            module.forward = softmax_top_k(module)
            patched["routers"] += 1
    n_layer = model.config.num_hidden_layers
    assert patched == {"norms": 2 * n_layer + 1, "routers": n_layer}, patched  # the patch found its targets


def transformers_logits(model_dir, ids, *, patched: bool):
    model = transformers.PhimoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if patched:
        as_llamacpp_computes(model)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("phimoe")
    out = {}
    for (kind, layout), fields in VARIANTS.items():
        model_dir = root / f"{kind}-{layout}"
        train_phi3_tokenizer(model_dir)
        build_model("PhimoeConfig", "PhimoeForCausalLM", model_dir, fused_experts=layout == "fused", **fields)
        out[kind, layout] = model_dir, prompt_ids(model_dir)
    return out


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return conversions(models, tmp_path_factory.mktemp("phimoe-gguf"))


@pytest.mark.parametrize("outtype", list(TOLERANCE))
@pytest.mark.parametrize("kind, layout", list(VARIANTS))
def test_logits_match_transformers_computing_as_llamacpp(models, converted, kind, layout, outtype):
    model_dir, ids = models[kind, layout]
    expected = transformers_logits(model_dir, ids, patched=True)
    error = logits_error(llamacpp_logits(converted(kind, layout, outtype), ids), expected, outtype)
    print(f"{kind} {layout} {outtype}: error {error:.2e} std")
    assert error <= TOLERANCE[outtype], f"{kind} {layout} {outtype}: error {error:.2e} of the logits' std"


def test_llamacpp_differs_from_transformers(models, converted):
    """The gap docs/architectures.md states: llama.cpp's phimoe on our f32 file against unpatched
    transformers (measured 4.9 std; the same file is within 4e-6 of the patched forward)."""
    model_dir, ids = models["phimoe", "per-expert"]
    expected = transformers_logits(model_dir, ids, patched=False)
    gap = relative_error(llamacpp_logits(converted("phimoe", "per-expert", "f32"), ids), expected)
    print(f"phimoe: llama.cpp vs transformers {gap:.2f} std")
    assert 2.0 < gap < 6.0


def test_conversion_warns(models, tmp_path, caplog):
    ggufsmith.convert(models["phimoe", "per-expert"][0], tmp_path / "out.gguf", outtype="f32")
    warnings = [r.getMessage() for r in caplog.records if "llama.cpp's phimoe" in r.getMessage()]
    assert len(warnings) == 1 and "differ from transformers" in warnings[0]


# as for Phi-3 (tests/test_arch_dense.py: same tokenizer), and:
PHIMOE_KEY_DIFFERENCES = KEY_DIFFERENCES | TOKENIZER_KEY_DIFFERENCES | PHI3_DIFFERENCES | {
    "phimoe.rope.scaling.attn_factor": "Phi-3.5-MoE's short_mscale, which transformers scales cos and sin by; the "
                                       "reference computes Phi-3's sqrt(1 + ln(s) / ln(original context)) instead",
}


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("kind", ["phimoe", "phimoe-longrope"])
def test_same_file_as_convert_hf_to_gguf(models, kind, outtype, tmp_path):
    """llama.cpp's converter knows the class by the name the published config.json uses
    (PhiMoEForCausalLM; transformers saves PhimoeForCausalLM): both convert that copy."""
    published = tmp_path / kind
    shutil.copytree(models[kind, "per-expert"][0], published)
    config = json.loads((published / "config.json").read_text())
    (published / "config.json").write_text(json.dumps(config | {"architectures": ["PhiMoEForCausalLM"]}))
    ggufsmith.convert(published, tmp_path / "ours.gguf", outtype=outtype)
    theirs = reference_convert(published, tmp_path / "theirs.gguf", outtype)
    assert_same_file(tmp_path / "ours.gguf", theirs, PHIMOE_KEY_DIFFERENCES)
