"""Tiny Nomic BERT encoders (nomic-embed-text v1.5 and v2-moe shapes) in sentence-transformers folders.

Dense ("nomic-bert"): a random-weight transformers NomicBertModel, saved by transformers
(config.json in transformers' keys; transformers names the tensors as nomic's code does: emb_ln,
attn.Wqkv, mlp.fc11 ...), or the same weights beside a config.json in the keys of nomic's
remote code, as the Hub checkpoints ship it (n_embd, rotary_emb_base, activation_function ...).

MoE ("nomic-bert-moe", v2-moe): transformers has no class for it, so the reference is transformers'
NomicBertModel (embeddings, rotary attention, post-norms) with its modules swapped for what
nomic's remote code (contrastors' modeling_hf_nomic_bert.py) has in v2-moe: attention and MLP
biases, a GELU MLP (fc1, fc2) in the even layers, and in the odd layers a softmax router over all
experts whose top-k probabilities (not renormalized) weight GELU experts stored megablocks-style
(w1 and w2 both (n_experts * n_inner, n_embd)), plus the experts' shared output bias. The
weights are saved under nomic's names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from tests.bert_models import redraw_weights

HIDDEN, HEADS, INNER = 64, 4, 128


def nomic_config(vocab_size: int, *, moe: bool, layers: int) -> dict:
    """config.json in the keys of nomic's remote code, with the values llama.cpp's converter expects."""
    return {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert",
        "activation_function": "gelu" if moe else "swiglu", "causal": False, "prenorm": False,
        "n_embd": HIDDEN, "n_head": HEADS, "n_inner": INNER, "n_layer": layers, "vocab_size": vocab_size,
        # v1.5: rope reaching 8192, trained on 2048; v2-moe: 2048 and 2048 (llama.cpp writes 512)
        "n_positions": 2048 if moe else 8192, "max_trained_positions": 2048,
        "layer_norm_epsilon": 1e-12, "type_vocab_size": 1 if moe else 2, "pad_token_id": 1 if moe else 0,
        "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
        "qkv_proj_bias": moe, "mlp_fc1_bias": moe, "mlp_fc2_bias": moe,
        **({"moe_every_n_layers": 2, "num_experts": 4, "moe_top_k": 2} if moe else {}),
    }


def copy_with_transformers_keys(model_dir: Path, copy_dir: Path) -> Path:
    """A copy of a folder whose nomic config.json also has transformers' names for the sizes.

    For llama.cpp's converter: it reads config.json through transformers' AutoConfig, which (in
    transformers 5) knows nomic_bert and fills in NomicBertConfig's defaults (hidden_size 768, 12
    layers, 12 heads, head_dim 64 ...) for the keys nomic's config leaves out, and the converter then
    prefers them to n_embd, n_layer ...: right for the published models, whose sizes those defaults
    are, wrong for a tiny one."""
    shutil.copytree(model_dir, copy_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config |= {"hidden_size": config["n_embd"], "num_hidden_layers": config["n_layer"],
               "num_attention_heads": config["n_head"], "intermediate_size": config["n_inner"]}
    (copy_dir / "config.json").write_text(json.dumps(config, indent=1))
    return copy_dir


def build_nomic_dense(hf_dir: Path, nomic_dir: Path, seed: int = 0):
    """The dense model (tokenizer already in hf_dir) saved by transformers in hf_dir, and with
    nomic's config.json in nomic_dir (tokenizer and sentence-transformers files copied)."""
    import transformers

    vocab_size = len(transformers.AutoTokenizer.from_pretrained(hf_dir)) + 3
    config = transformers.NomicBertConfig(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=3,
                                          num_attention_heads=HEADS, intermediate_size=INNER, type_vocab_size=2)
    torch.manual_seed(seed)
    model = redraw_weights(transformers.NomicBertModel(config).eval())
    model.save_pretrained(hf_dir)
    shutil.copytree(hf_dir, nomic_dir)
    (nomic_dir / "config.json").write_text(json.dumps(nomic_config(vocab_size, moe=False, layers=3), indent=1))
    return model


def build_nomic_moe(model_dir: Path, seed: int = 0):
    """The v2-moe-shaped reference model (a torch module; tokenizer already in model_dir), saved
    under nomic's names with nomic's config.json; returns the model."""
    import transformers
    from safetensors.torch import save_file

    vocab_size = len(transformers.AutoTokenizer.from_pretrained(model_dir)) + 3
    spec = nomic_config(vocab_size, moe=True, layers=4)
    config = transformers.NomicBertConfig(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=4,
                                          num_attention_heads=HEADS, intermediate_size=INNER, type_vocab_size=1,
                                          pad_token_id=1)
    model = transformers.NomicBertModel(config).eval()
    for i, layer in enumerate(model.layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(layer.self_attn, proj, nn.Linear(HIDDEN, HIDDEN, bias=True))
        layer.mlp = _MoeMlp(spec["num_experts"], spec["moe_top_k"]) if i % spec["moe_every_n_layers"] == 1 \
            else _GeluMlp()
    torch.manual_seed(seed)
    redraw_weights(model)
    with torch.no_grad():
        for layer in model.layers:
            if isinstance(layer.mlp, _MoeMlp):
                layer.mlp.experts.bias.zero_()  # as nomic initializes it; llama.cpp's graph has no such term
    save_file(_nomic_names(model.state_dict()), str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps(spec, indent=1))
    return model


# transformers' module names -> nomic's (the renaming transformers' NomicBertModel does on saving)
_RENAMES = (("layers.", "encoder.layers."), ("embeddings.LayerNorm", "emb_ln"), ("self_attn.o_proj", "attn.out_proj"),
            ("post_attention_layernorm", "norm1"), ("post_mlp_layernorm", "norm2"))


def _nomic_names(state: dict) -> dict:
    """The state dict under nomic's names, q/k/v joined into Wqkv."""
    out = {}
    for name, tensor in state.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            tensor = torch.cat([state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
            name = name.replace("self_attn.q_proj", "attn.Wqkv")
        for old, new in _RENAMES:
            if name.startswith(old) or f".{old}" in name:
                name = name.replace(old, new, 1)
        out[name] = tensor.contiguous()
    return out


class _GeluMlp(nn.Module):
    """The even layers' MLP of v2-moe (biases, GELU)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(HIDDEN, INNER), nn.Linear(INNER, HIDDEN)
        self.act = nn.functional.gelu  # see use_ggml_gelu_in_moe

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _MoeMlp(nn.Module):
    """The odd layers' experts of v2-moe, under nomic's module names (router.layer, experts.mlp.w1 ...)."""

    def __init__(self, experts: int, top_k: int):
        super().__init__()
        self.n_experts, self.top_k = experts, top_k
        self.router = nn.Module()
        self.router.layer = nn.Linear(HIDDEN, experts, bias=False)
        self.experts = nn.Module()
        self.experts.mlp = nn.Module()
        self.experts.mlp.w1 = nn.Parameter(torch.empty(experts * INNER, HIDDEN))
        self.experts.mlp.w2 = nn.Parameter(torch.empty(experts * INNER, HIDDEN))
        self.experts.bias = nn.Parameter(torch.zeros(HIDDEN))
        self.act = nn.functional.gelu

    def forward(self, x):
        probs = self.router.layer(x).softmax(dim=-1, dtype=torch.float32)
        top_weights, top_experts = torch.topk(probs, self.top_k, dim=-1)
        w1 = self.experts.mlp.w1.view(self.n_experts, INNER, HIDDEN)
        w2 = self.experts.mlp.w2.view(self.n_experts, INNER, HIDDEN)
        out = torch.zeros_like(x)
        for slot in range(self.top_k):
            chosen = top_experts[..., slot]
            hidden = self.act(torch.einsum("...d,...fd->...f", x, w1[chosen]))
            out = out + top_weights[..., slot, None] * torch.einsum("...f,...fd->...d", hidden, w2[chosen])
        return out + self.experts.bias


def use_ggml_gelu_in_moe(model, gelu) -> int:
    """Swap the GELU of the MoE model's MLPs and experts for `gelu`; returns how many were swapped."""
    modules = [m for m in model.modules() if isinstance(m, (_GeluMlp, _MoeMlp))]
    for module in modules:
        module.act = gelu
    return len(modules)
