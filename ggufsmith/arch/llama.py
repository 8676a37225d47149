"""The llama family: Llama 1-3, Mistral and Mixtral (the same decoder; Mixtral swaps the MLP for
experts). Sources: the HF modeling code for the checkpoint layout, llama.cpp's loader
(src/models/llama.cpp) for the keys and tensors it reads."""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys
from ggufsmith.arch.decoder import ROUTER, Decoder, in_block, llama_decoder, mixtral_experts
from ggufsmith.arch.rope import rotary_halves_to_pairs
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor

MOE = "n_expert > 0"


class Llama(Decoder):
    name = "llama"
    # Ministral (transformers' MinistralForCausalLM: Mistral with per-layer sliding windows) is not in
    # llama.cpp's converter; Ministral-8B itself is published as MistralForCausalLM, which it maps here.
    hf_classes = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "MinistralForCausalLM")
    model_types = ("llama", "mistral", "mixtral", "ministral")
    tokenizer_kind = None  # tokenizer.model (SentencePiece, llama 1-2, mistral) or tokenizer.json (BPE, llama 3)
    tensor_names = {
        **llama_decoder(),
        # Mixtral: the router and the experts' gate/up/down, as the original checkpoints store them
        # (block_sparse_moe.gate, experts.{xid}.w1/w3/w2) and as transformers 5 saves them
        # (mlp.gate, the fused mlp.experts.gate_up_proj / down_proj).
        **in_block(mixtral_experts(when=MOE)),
    }
    f32_tensors = ROUTER
    # Tied embeddings: save_pretrained stores no lm_head, so there is no `output` tensor and
    # llama.cpp reads token_embd in its place. An lm_head stored anyway is kept: transformers
    # (5.x) uses it rather than tying when its values differ from the embeddings.

    def family_keys(self, keys: ArchKeys) -> None:
        c = self.config
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("num_local_experts", default=None, min=1))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", min=1) if "num_local_experts" in c else None)
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.head_dim)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        # llama.cpp's llama uses GGML's normal rope on rows HF rotates by halves
        if name.endswith(("attn_q.weight", "attn_q.bias")):
            return rotary_halves_to_pairs(tensor, self.n_head)
        if name.endswith(("attn_k.weight", "attn_k.bias")):
            return rotary_halves_to_pairs(tensor, self.n_head_kv)
        return tensor
