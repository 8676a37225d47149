"""DeepSeek V2 / V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`; Kimi K2 ships a V3 config):
multi-head latent attention (MLA) and a mixture of experts with shared experts after leading dense
blocks. llama.cpp's `deepseek2`.

MLA: queries come from a low-rank pair (q_a_proj, its RMSNorm, q_b_proj; or a plain q_proj when
q_lora_rank is null, as in V2-Lite), keys and values from one compressed latent (kv_a_proj_with_mqa:
kv_lora_rank latent rows, then qk_rope_head_dim rows of a key part shared by all heads, which alone
is rotated), expanded per head by kv_b_proj: for each head, qk_nope_head_dim key rows then
v_head_dim value rows. llama.cpp's MLA path multiplies the queries into the latent space instead of
expanding the keys, so kv_b_proj is split into attn_k_b (per head, its key rows transposed:
(n_head, kv_lora_rank, qk_nope)) and attn_v_b (per head, its value rows: (n_head, v_head_dim,
kv_lora_rank)); the file then describes one key/value head of kv_lora_rank + qk_rope_head_dim
(key_length) and kv_lora_rank (value_length), the per-head sizes going to key/value_length_mla.

Rope: GGML's normal rope (pairs). DeepSeek's own code and transformers' V2 rotate interleaved pairs
too; transformers' V3 with rope_interleave false rotates halves, so the rotated rows of q and of the
shared key are reordered. Yarn: llama.cpp scales the attention by transformers' mscale_all_dim
factor (squared) from rope.scaling.yarn_log_multiplier, stored as 0.1 x mscale_all_dim as llama.cpp's
converter does; it assumes the cos/sin factor of transformers (mscale / mscale_all_dim) is 1.

Routing (decoder.routing_keys, shared with glm4moe and dots1): softmax (V2) or sigmoid (V3, GLM-4.5) scores, the
selection bias `e_score_correction_bias` (exp_probs_b), groups of experts of which the best
topk_group (by the sum of their two best scores) are searched, renormalization (norm_topk_prob) and
routed_scaling_factor. Multi-token-prediction layers (num_nextn_predict_layers) are left out with a
one-line notice, as llama.cpp's converter does.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping

import numpy as np

from ggufsmith.arch.base import ArchKeys, MappedTensor
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import ROUTER, Decoder, embeddings, in_block, norms, routing_keys, sparse_blocks, sparse_dims
from ggufsmith.arch.tensors import Dim, Split, T
from ggufsmith.constants import GGUFValueType, Keys, arch_key
from ggufsmith.errors import ConversionError
from ggufsmith.readers.config import HFConfig
from ggufsmith.readers.lazy_tensor import LazyTensor

log = logging.getLogger(__name__)

Q_LORA = "q_lora_rank > 0"


# transformers' defaults for the keys a config.json may leave out, per class (V2 and V3 differ).
V2_DEFAULTS = {"first_k_dense_replace": 0, "q_lora_rank": 1536, "kv_lora_rank": 512, "n_shared_experts": 2,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "routed_scaling_factor": 1.0,
               "topk_method": "greedy", "norm_topk_prob": False, "moe_intermediate_size": 1407, "n_routed_experts": 64}
V3_DEFAULTS = {"first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512, "n_shared_experts": 1,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "routed_scaling_factor": 2.5,
               "n_group": 8, "topk_group": 4, "norm_topk_prob": True, "moe_intermediate_size": 2048,
               "n_routed_experts": 256, "num_experts_per_tok": 8, "rope_interleave": True}


class Deepseek2(Decoder):
    name = "deepseek2"
    hf_classes = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
    model_types = ("deepseek_v2", "deepseek_v3", "kimi_k2")
    tensor_names = {
        **embeddings(),
        **in_block({
            **norms(input_layernorm="attn_norm", post_attention_layernorm="ffn_norm"),
            "self_attn.q_a_proj.weight": T("attn_q_a.weight", "q_lora_rank", "n_embd", when=Q_LORA),
            "self_attn.q_a_layernorm.weight": T("attn_q_a_norm.weight", "q_lora_rank", when=Q_LORA),
            "self_attn.q_b_proj.weight": T("attn_q_b.weight", "n_head * head_dim_k_mla", "q_lora_rank", when=Q_LORA),
            "self_attn.q_proj.weight": T("attn_q.weight", "n_head * head_dim_k_mla", "n_embd", when="q_lora_rank == 0"),
            "self_attn.kv_a_proj_with_mqa.weight": T("attn_kv_a_mqa.weight", "kv_lora_rank + n_rot", "n_embd"),
            "self_attn.kv_a_layernorm.weight": T("attn_kv_a_norm.weight", "kv_lora_rank"),
            "self_attn.kv_b_proj.weight": Split(T("attn_k_b.weight", "n_head", "kv_lora_rank", "head_dim_k_mla - n_rot"),
                                                T("attn_v_b.weight", "n_head", "head_dim_v_mla", "kv_lora_rank")),
            "self_attn.o_proj.weight": T("attn_output.weight", "n_embd", "n_head * head_dim_v_mla"),
            **sparse_blocks(),
        }),
    }
    f32_tensors = ROUTER
    yarn_handled = ("mscale", "mscale_all_dim")  # see _yarn_keys
    dim_names = ("q_lora_rank", "kv_lora_rank", "head_dim_k_mla", "head_dim_v_mla", "n_layer_dense_lead")

    def __init__(self, config: HFConfig) -> None:
        self.v3 = "DeepseekV3ForCausalLM" in config.architectures or (
            not config.architectures and config.model_type in ("deepseek_v3", "kimi_k2"))
        self.config_defaults = V3_DEFAULTS if self.v3 else V2_DEFAULTS
        super().__init__(config)
        c = self.config
        reject(config, c.get_bool("attention_bias", default=False), "attention_bias is set (llama.cpp's MLA has no biases)")
        self.n_layer = c.get_int("num_hidden_layers", min=1)
        self.q_lora_rank = c.get_int("q_lora_rank", default=None, min=1) or 0  # null: a plain q_proj
        self.kv_lora_rank = c.get_int("kv_lora_rank", min=1)
        self.nope = c.get_int("qk_nope_head_dim", min=1)
        self.rot = c.get_int("qk_rope_head_dim", min=2)
        self.v_dim = c.get_int("v_head_dim", min=1)
        self.n_nextn = c.get_int("num_nextn_predict_layers", default=0, min=0)
        # transformers' V2 and DeepSeek's own code rotate interleaved pairs; V3 may rotate halves.
        self.rotates_halves = self.v3 and not c.get_bool("rope_interleave")
        if not self.v3 and c.get_str("topk_method") == "group_limited_greedy":
            log.warning("%s: topk_method group_limited_greedy ranks groups by their best score; llama.cpp "
                        "ranks them by the sum of their two best, so a few tokens may be routed differently",
                        config.path)

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        # MLA as llama.cpp runs it: one key/value head holding the latent (and the shared rotated key).
        keys.metadata.replace(arch_key(Keys.Attention.HEAD_COUNT_KV, self.name), 1, GGUFValueType.UINT32)
        keys.u32(Keys.Attention.Q_LORA_RANK, self.q_lora_rank)
        keys.u32(Keys.Attention.KV_LORA_RANK, self.kv_lora_rank)
        for key, value in ((Keys.Attention.KEY_LENGTH, self.kv_lora_rank + self.rot),
                           (Keys.Attention.VALUE_LENGTH, self.kv_lora_rank)):
            keys.metadata.replace(arch_key(key, self.name), value, GGUFValueType.UINT32)
        keys.u32(Keys.Attention.KEY_LENGTH_MLA, self.nope + self.rot)
        keys.u32(Keys.Attention.VALUE_LENGTH_MLA, self.v_dim)
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.rot)
        routing_keys(keys, c, scoring="sigmoid" if self.v3 else "softmax",
                     grouped=self.v3 or c.get_str("topk_method") == "group_limited_greedy")
        self._yarn_keys(keys)

    def _yarn_keys(self, keys: ArchKeys) -> None:
        rope = self.rope
        if rope.type != "yarn":
            return
        p = rope.params
        factor = p.get_float("factor", min=0)
        mscale = p.get_float("mscale", default=None) or 0.0
        all_dims = p.get_float("mscale_all_dim", default=None) or 0.0
        if all_dims:
            keys.f32(Keys.Rope.SCALING_YARN_LOG_MUL, 0.1 * all_dims)

        def yarn_mscale(scale: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

        # transformers scales cos/sin by this; llama.cpp's deepseek2 by 1 once mscale_all_dim is set.
        cos_sin = p.get_float("attention_factor", default=None) or (
            yarn_mscale(mscale) / yarn_mscale(all_dims) if mscale and all_dims else yarn_mscale(1.0))
        if factor > 1 and (not all_dims or abs(cos_sin - 1.0) > 1e-6):
            log.warning("%s: yarn with mscale %s and mscale_all_dim %s: llama.cpp's deepseek2 scales the "
                        "attention as if both were equal; its logits will differ from transformers'",
                        p.label, mscale or None, all_dims or None)

    def dims(self) -> dict:
        origin = self.config.label
        return {
            "q_lora_rank": Dim(self.q_lora_rank, f"{origin} q_lora_rank"),
            "kv_lora_rank": Dim(self.kv_lora_rank, f"{origin} kv_lora_rank"),
            "head_dim_k_mla": Dim(self.nope + self.rot, f"{origin} qk_nope_head_dim + qk_rope_head_dim"),
            "head_dim_v_mla": Dim(self.v_dim, f"{origin} v_head_dim"),
            **sparse_dims(self.config),
        }

    def map_tensors(self, source: Mapping[str, LazyTensor]) -> list[MappedTensor]:
        """Everything but the multi-token-prediction layers (blocks num_hidden_layers and after),
        which llama.cpp's deepseek2 does not run; they are named in one notice."""
        first, last = self.n_layer, self.n_layer + self.n_nextn
        kept = {name: tensor for name, tensor in source.items() if not first <= _block(name) < last}
        if len(kept) < len(source):
            self._skipped_notice = (f"{self.config.path}: left out the multi-token-prediction layer(s) "
                                    f"{', '.join(map(str, range(first, last)))} ({len(source) - len(kept)} tensors), "
                                    "which llama.cpp's deepseek2 does not run")
        return super().map_tensors(kept)

    def split_tensor(self, entry: Split, tensor: LazyTensor) -> list[LazyTensor]:
        if not entry.parts[0].name.endswith("attn_k_b.weight"):
            return super().split_tensor(entry, tensor)
        return mla_kv_b(tensor, self.config.get_int("num_attention_heads"), self.nope, self.v_dim)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if not self.rotates_halves:
            return tensor
        if name.endswith((".attn_q_b.weight", ".attn_q.weight")):
            return rotated_rows_to_pairs(tensor, self.config.get_int("num_attention_heads"), self.rot)
        if name.endswith(".attn_kv_a_mqa.weight"):
            return rotated_rows_to_pairs(tensor, 1, self.rot)
        return tensor


def _block(name: str) -> int:
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def mla_kv_b(tensor: LazyTensor, n_head: int, nope: int, v_dim: int) -> list[LazyTensor]:
    """kv_b_proj (n_head x (nope + v_dim), kv_lora_rank) -> attn_k_b (n_head, kv_lora_rank, nope),
    each head's key rows transposed, and attn_v_b (n_head, v_dim, kv_lora_rank), its value rows."""
    rows, rank = tensor.shape
    if rows != n_head * (nope + v_dim):
        raise ConversionError(f"{tensor.source}: {rows} rows, but num_attention_heads x (qk_nope_head_dim + v_head_dim) "
                              f"= {n_head} x ({nope} + {v_dim}); config.json does not describe this checkpoint")

    def heads(a: np.ndarray) -> np.ndarray:
        return a.reshape(n_head, nope + v_dim, rank)

    keys = tensor.map(lambda a: np.ascontiguousarray(heads(a)[:, :nope].transpose(0, 2, 1)), shape=(n_head, rank, nope))
    values = tensor.map(lambda a: np.ascontiguousarray(heads(a)[:, nope:]), shape=(n_head, v_dim, rank))
    return [keys, values]


def rotated_rows_to_pairs(tensor: LazyTensor, n_head: int, n_rot: int) -> LazyTensor:
    """In each of n_head blocks of rows, the last n_rot (the rotated part) from rotate-half order
    to GGML's pairs (h0, s0, h1, s1, ...)."""
    rows = tensor.shape[0]
    width = rows // n_head

    def reorder(a: np.ndarray) -> np.ndarray:
        out = a.reshape(n_head, width, -1).copy()
        rotated = out[:, width - n_rot:]
        out[:, width - n_rot:] = rotated.reshape(n_head, 2, n_rot // 2, -1).swapaxes(1, 2).reshape(n_head, n_rot, -1)
        return out.reshape(a.shape)

    return tensor.map(reorder)
