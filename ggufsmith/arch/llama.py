"""The llama family: Llama 1-3, Mistral and Mixtral (the same decoder; Mixtral swaps the MLP for
experts). Sources: the HF modeling code for the checkpoint layout, llama.cpp's loader
(src/models/llama.cpp, llama_model_base::load_hparams) for the keys and tensors it reads."""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig
from ggufsmith.arch.decoder import in_block, llama_decoder
from ggufsmith.arch.rope import Rope, rotary_halves_to_pairs
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor

MOE = "n_expert > 0"


class Llama(Architecture):
    name = "llama"
    hf_classes = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
    model_types = ("llama", "mistral", "mixtral")
    tokenizer_kind = None  # tokenizer.model (SentencePiece, llama 1-2, mistral) or tokenizer.json (BPE, llama 3)
    tensor_names = {
        **llama_decoder(),
        # Mixtral: the router, and w1/w3/w2 (gate/up/down) of each expert, stacked per block.
        **in_block({
            "block_sparse_moe.gate.weight": T("ffn_gate_inp.weight", "n_expert", "n_embd", when=MOE),
            "block_sparse_moe.experts.{xid}.w1.weight": T("ffn_gate_exps.weight", "n_expert", "n_ff_exp", "n_embd", when=MOE),
            "block_sparse_moe.experts.{xid}.w3.weight": T("ffn_up_exps.weight", "n_expert", "n_ff_exp", "n_embd", when=MOE),
            "block_sparse_moe.experts.{xid}.w2.weight": T("ffn_down_exps.weight", "n_expert", "n_embd", "n_ff_exp", when=MOE),
        }),
    }
    # Old checkpoints store the rotary frequencies; they follow from the config.
    ignored_tensors = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)
    # The router is tiny and decides which experts run: llama.cpp keeps it F32 whatever the outtype.
    f32_tensors = (r"blk\.\d+\.ffn_gate_inp\.weight",)

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.n_head = config.get_int("num_attention_heads", min=1)
        self.n_head_kv = config.get_int("num_key_value_heads", default=self.n_head, min=1)
        self.head_dim = config.get_int("head_dim", default=None, min=1) or config.get_int("hidden_size", min=1) // self.n_head
        self.rope = Rope(config)
        # Tied embeddings: save_pretrained stores no lm_head, so there is no `output` tensor and
        # llama.cpp reads token_embd in its place. An lm_head stored anyway is kept: transformers
        # (5.x) uses it rather than tying when its values differ from the embeddings.

    def metadata(self) -> Metadata:
        c = self.config
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)
        keys.u32(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", min=1))
        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("max_position_embeddings", default=None))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get_int("hidden_size", min=1))
        keys.u32(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("intermediate_size", min=1))
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_head)
        keys.u32(Keys.Attention.HEAD_COUNT_KV, self.n_head_kv)
        keys.f32(Keys.Rope.FREQ_BASE, self.rope.theta)
        keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, c.get_float("rms_norm_eps", min=0))
        keys.u32(Keys.LLM.EXPERT_COUNT, c.get_int("num_local_experts", default=None, min=1))
        keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("num_experts_per_tok", min=1) if "num_local_experts" in c else None)
        if "head_dim" in c:
            keys.u32(Keys.Attention.KEY_LENGTH, self.head_dim)
            keys.u32(Keys.Attention.VALUE_LENGTH, self.head_dim)
        keys.u32(Keys.LLM.VOCAB_SIZE, c.get_int("vocab_size", min=1))
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.head_dim)
        self.rope.write_scaling_keys(keys)
        return metadata

    def extra_tensors(self) -> dict[str, LazyTensor]:
        return self.rope.rope_freqs(self.head_dim)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith(("attn_q.weight", "attn_q.bias")):
            return rotary_halves_to_pairs(tensor, self.n_head)
        if name.endswith(("attn_k.weight", "attn_k.bias")):
            return rotary_halves_to_pairs(tensor, self.n_head_kv)
        return tensor
