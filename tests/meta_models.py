"""Small random llamas in the Hugging Face layout and the Meta layout of the same weights (params.json,
consolidated.*.pth, tokenizer.model), derived as Meta's code lays them out: q/k rows in Meta's
interleaved rotary order, Meta's names, model-parallel ranks split as fairscale splits them.
Used by tests/test_meta_checkpoint.py and tests/test_damaged_meta.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from tests.damaged_inputs import EXAMPLE_MODEL

RANKS = 2
HIDDEN, HEADS, KV_HEADS, LAYERS = 128, 4, 2, 2
VOCAB = 2000  # the example model's SentencePiece tokenizer.model

# name -> (params.json, the Hugging Face config's differences, the axis the ranks split the embedding
# along, None for a single consolidated.safetensors)
LAYOUTS = {
    "llama2": ({"dim": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS, "n_kv_heads": KV_HEADS, "multiple_of": 32,
                "norm_eps": 1e-5, "vocab_size": -1},
               {"intermediate_size": 352, "max_position_embeddings": 4096,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
               1),
    # a shape no Meta release has: its factor (Llama 3.1's) must be given
    "llama3.1": ({"dim": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS, "n_kv_heads": KV_HEADS, "multiple_of": 64,
                  "ffn_dim_multiplier": 1.3, "norm_eps": 1e-5, "rope_theta": 500000.0, "use_scaled_rope": True,
                  "rope_scaling_factor": 8.0, "vocab_size": VOCAB},
                 {"intermediate_size": 448, "max_position_embeddings": 131072,
                  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}},
                 0),
    # Llama 3.2 1B's shape (dim 2048, 32 heads, 8 kv heads) in one block with a narrow feed-forward: its
    # params.json names no rope factor; the Hugging Face release's config.json has 32
    "llama3.2": ({"dim": 2048, "n_layers": 1, "n_heads": 32, "n_kv_heads": 8, "multiple_of": 64,
                  "ffn_dim_multiplier": 0.02, "norm_eps": 1e-5, "rope_theta": 500000.0, "use_scaled_rope": True,
                  "vocab_size": VOCAB},
                 {"hidden_size": 2048, "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "intermediate_size": 128, "max_position_embeddings": 131072,
                  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}},
                 0),
    # Mistral 7B's params.json: head_dim and hidden_dim given, a sliding window; one consolidated.safetensors
    "mistral": ({"dim": HIDDEN, "n_layers": LAYERS, "head_dim": HIDDEN // HEADS, "hidden_dim": 320, "n_heads": HEADS,
                 "n_kv_heads": KV_HEADS, "norm_eps": 1e-5, "sliding_window": 4096, "vocab_size": VOCAB,
                 "rope_theta": 1000000.0},
                {"intermediate_size": 320, "max_position_embeddings": 32768,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                None),
}


def make_hf_llama(folder: Path, config_changes: dict, vocab: int = VOCAB) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    shape = {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
             "num_key_value_heads": KV_HEADS}
    config = transformers.LlamaConfig(vocab_size=vocab, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2, **(shape | config_changes))
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):  # not all ones, so that a norm put in the wrong place shows
                parameter.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(EXAMPLE_MODEL / name, folder)
    return folder


def _to_meta_rotary(weight, n_head: int):
    """Hugging Face's q/k rows (each head: first half | second half) in Meta's order (pairs)."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def meta_tensors(hf_dir: Path, embedding_axis: int) -> dict[str, tuple[object, int | None]]:
    """Meta name -> (whole tensor, the axis model-parallel ranks split it along; None: copied)."""
    from safetensors.torch import load_file

    hf = load_file(hf_dir / "model.safetensors")
    config = json.loads((hf_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors = {"tok_embeddings.weight": (hf["model.embed_tokens.weight"], embedding_axis),
               "norm.weight": (hf["model.norm.weight"], None),
               "output.weight": (hf["lm_head.weight"], 0)}
    for i in range(config["num_hidden_layers"]):
        block = f"model.layers.{i}."
        tensors |= {
            f"layers.{i}.attention.wq.weight": (_to_meta_rotary(hf[block + "self_attn.q_proj.weight"], heads), 0),
            f"layers.{i}.attention.wk.weight": (_to_meta_rotary(hf[block + "self_attn.k_proj.weight"], kv_heads), 0),
            f"layers.{i}.attention.wv.weight": (hf[block + "self_attn.v_proj.weight"], 0),
            f"layers.{i}.attention.wo.weight": (hf[block + "self_attn.o_proj.weight"], 1),
            f"layers.{i}.feed_forward.w1.weight": (hf[block + "mlp.gate_proj.weight"], 0),
            f"layers.{i}.feed_forward.w2.weight": (hf[block + "mlp.down_proj.weight"], 1),
            f"layers.{i}.feed_forward.w3.weight": (hf[block + "mlp.up_proj.weight"], 0),
            f"layers.{i}.attention_norm.weight": (hf[block + "input_layernorm.weight"], None),
            f"layers.{i}.ffn_norm.weight": (hf[block + "post_attention_layernorm.weight"], None),
        }
    return tensors


def write_meta_folder(folder: Path, hf_dir: Path, params: dict, embedding_axis: int | None,
                      ranks: int = RANKS) -> Path:
    import torch

    folder.mkdir(parents=True)
    tensors = meta_tensors(hf_dir, embedding_axis)
    if embedding_axis is None:
        from safetensors.torch import save_file

        save_file({name: t.contiguous() for name, (t, _) in tensors.items()}, folder / "consolidated.safetensors")
        ranks = 0
    for rank in range(ranks):
        state = {name: (t if axis is None else t.chunk(ranks, dim=axis)[rank]).clone()
                 for name, (t, axis) in tensors.items()}
        torch.save(state, folder / f"consolidated.{rank:02d}.pth")
    (folder / "params.json").write_text(json.dumps(params))
    shutil.copy(hf_dir / "tokenizer.model", folder)
    return folder


def write_header_only_meta_folder(folder: Path, params: dict, intermediate: int) -> Path:
    """A Meta folder of `params` (one block) whose consolidated.safetensors declares every tensor at
    its full shape, in BF16, but holds no data (a sparse file): enough to plan the conversion of a
    release's shape without its gigabytes. `intermediate`: the feed-forward width of the release."""
    dim, heads, kv_heads, vocab = params["dim"], params["n_heads"], params["n_kv_heads"], params["vocab_size"]
    kv_rows = dim // heads * kv_heads
    shapes = {"tok_embeddings.weight": (vocab, dim), "norm.weight": (dim,), "output.weight": (vocab, dim)}
    for i in range(params["n_layers"]):
        shapes |= {f"layers.{i}.attention.wq.weight": (dim, dim), f"layers.{i}.attention.wk.weight": (kv_rows, dim),
                   f"layers.{i}.attention.wv.weight": (kv_rows, dim), f"layers.{i}.attention.wo.weight": (dim, dim),
                   f"layers.{i}.feed_forward.w1.weight": (intermediate, dim),
                   f"layers.{i}.feed_forward.w2.weight": (dim, intermediate),
                   f"layers.{i}.feed_forward.w3.weight": (intermediate, dim),
                   f"layers.{i}.attention_norm.weight": (dim,), f"layers.{i}.ffn_norm.weight": (dim,)}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    folder.mkdir(parents=True)
    with open(folder / "consolidated.safetensors", "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        f.truncate(8 + len(blob) + offset)
    (folder / "params.json").write_text(json.dumps(params))
    return folder
