"""ERNIE 4.5 dense (`Ernie4_5ForCausalLM`): a llama-layout decoder whose rope already rotates
adjacent pairs (GGML's normal rope: no permutation), with a SentencePiece tokenizer. Some
checkpoints name the model `ernie.` instead of `model.`; both are read. ERNIE 4.5 MoE: see its class."""

from __future__ import annotations

from typing import Any

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.common import reject
from ggufsmith.arch.decoder import DENSE, ROUTER, SPARSE, Decoder, experts, in_block, llama_decoder, mlp, shared_expert
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.config import HFConfig


class Ernie4_5(Decoder):
    name = "ernie4_5"
    hf_classes = ("Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM")
    model_types = ("ernie4_5",)
    tensor_names = {
        **llama_decoder(o_bias="optional", mlp_biases="none"),
        **{hf.replace("model.", "ernie.", 1): spec for hf, spec in llama_decoder(o_bias="optional", mlp_biases="none").items()
           if hf.startswith("model.")},
    }


class Ernie4_5Moe(Decoder):
    """ERNIE 4.5 MoE (`Ernie4_5_MoeForCausalLM`): the dense model's decoder whose blocks from
    moe_layer_start_index on have a routed mixture of experts (softmax scores; a per-expert bias,
    `moe_statics.e_score_correction_bias`, that only chooses: llama.cpp's exp_probs_b; the chosen
    scores renormalized) beside moe_num_shared_experts shared experts fused in one MLP.
    llama.cpp loads experts in every block from the first sparse one on, so a config whose sparse
    blocks are interleaved with dense ones (moe_layer_interval > 1) or stop before the last block
    is refused, as is use_bias (llama.cpp reads no MLP or output biases). Multi-token-prediction layers (`mtp_*`) are left out, as llama.cpp's converter does."""

    name = "ernie4_5-moe"
    hf_classes = ("Ernie4_5_MoeForCausalLM",)
    model_types = ("ernie4_5_moe",)
    tensor_names = {
        **{hf: spec for hf, spec in llama_decoder(mlp_biases="none").items() if ".mlp." not in hf},
        **in_block({
            **mlp(biases="none", when=DENSE),
            **experts(when=SPARSE),
            # (1, n_expert) in the checkpoint: kept as it is (ggml's {n_expert, 1} is the vector llama.cpp reads)
            "mlp.moe_statics.e_score_correction_bias": T("exp_probs_b.bias", 1, "n_expert", when=SPARSE),
            "mlp.gate.moe_statics.e_score_correction_bias": T("exp_probs_b.bias", 1, "n_expert", when=SPARSE),
            **shared_expert("mlp.shared_experts.", when=f"{SPARSE} and n_ff_shexp > 0"),
        }),
    }
    f32_tensors = ROUTER
    ignored_tensors = (*Decoder.ignored_tensors, r"model\.mtp_.*")

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        n_layer = c.get_int("num_hidden_layers", min=1)
        self.n_dense = c.get_int("moe_layer_start_index", default=0)
        reject(c, c.get_bool("use_bias", default=False), "use_bias is set (biases on the MLPs and the output head)")
        reject(c, c.get_int("moe_layer_interval", default=1, min=1) != 1, "moe_layer_interval is above 1")
        reject(c, c.get_int("moe_layer_end_index", default=-1, min=-1) not in (-1, n_layer - 1),
               "moe_layer_end_index ends the sparse blocks before the last block")

    def dims(self) -> dict[str, Any]:
        return {"n_layer_dense_lead": self.n_dense}

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        n_shared = c.get_int("moe_num_shared_experts", default=0)
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("moe_num_experts", min=1))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("moe_k", min=1))
        keys.u32(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, 1)
        keys.u32(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, self.n_dense)
        keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
        keys.u32(Keys.LLM.EXPERT_SHARED_COUNT, n_shared)
        keys.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1) * n_shared or None)
