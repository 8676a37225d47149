"""MiniMax-M2 (`MiniMaxM2ForCausalLM`): a Mixtral-layout mixture of experts in every block, with
llama.cpp's `minimax-m2` graph.

What the family changes from Mixtral: RMSNorms of the queries and keys over each whole projection
(all heads together: widths n_head x head_dim and n_head_kv x head_dim, not head_dim), rope on the
first `rotary_dim` dimensions of each head only (NeoX halves, as transformers rotates them: no
permutation), and sigmoid routing: the top-k experts are chosen by sigmoid score plus a selection
bias (`e_score_correction_bias`, llama.cpp's exp_probs_b) and weighted by their sigmoid scores
renormalized to sum to one, which llama.cpp's graph always does. Experts are intermediate_size wide
(expert_feed_forward_length, as llama.cpp's converter writes it).
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import KV_ROWS, Q_ROWS, ROUTER, Decoder, in_block, llama_decoder, mixtral_experts
from ggufsmith.arch.tensors import T
from ggufsmith.constants import ExpertGatingFunc, Keys
from ggufsmith.readers.config import HFConfig

SELECTION_BIAS = T("exp_probs_b.bias", "n_expert")


class MiniMaxM2(Decoder):
    name = "minimax-m2"
    hf_classes = ("MiniMaxM2ForCausalLM",)
    model_types = ("minimax_m2",)
    tensor_names = {
        **llama_decoder(attention_biases="none", dense_mlp=False),
        "lm_head.weight": T("output.weight", "n_vocab", "n_embd"),  # llama.cpp's minimax-m2 requires it
        **in_block({
            "self_attn.q_norm.weight": T("attn_q_norm.weight", Q_ROWS),
            "self_attn.k_norm.weight": T("attn_k_norm.weight", KV_ROWS),
            **mixtral_experts(),
            # the original checkpoints' name, and transformers 5's
            "block_sparse_moe.e_score_correction_bias": SELECTION_BIAS,
            "mlp.e_score_correction_bias": SELECTION_BIAS,
        }),
    }
    f32_tensors = ROUTER

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        # transformers' MiniMax-M2 always routes by sigmoid; a config asking otherwise is another model
        reject(config, config.get_str("scoring_func", default="sigmoid") != "sigmoid",
               "scoring_func is not 'sigmoid' (llama.cpp's minimax-m2 and transformers route by sigmoid)")

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        n_expert = c.get_int("num_local_experts", "num_experts", min=1)
        keys.u32(Keys.LLM.EXPERT_COUNT, n_expert)
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", min=1, max=n_expert))
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("intermediate_size", min=1))
        keys.u32(Keys.LLM.EXPERT_GATING_FUNC, int(ExpertGatingFunc.SIGMOID))
        # The published config.json says rotary_dim; transformers 5 saves partial_rotary_factor.
        rotary_dim = c.get_int("rotary_dim", default=None, min=2, max=self.head_dim)
        keys.u32(Keys.Rope.DIMENSION_COUNT, rotary_dim or int(self.rope.partial_rotary_factor() * self.head_dim))
