"""RWKV-4 (RwkvForCausalLM): the keys and tensors the GGUF spec lists for `rwkv`.

No GGML runtime loads RWKV-4 from GGUF yet (llama.cpp runs rwkv6 and rwkv7 only), so the names
follow llama.cpp's rwkv6 names wherever a tensor means the same thing there, and get their own name
where it does not (see docs/architectures-other.md for the table):

  * token-shift mixes: RWKV-4's time_mix_k weighs the *current* token,
    x_k = mix * x + (1 - mix) * x_prev, while rwkv6's time_mix_lerp_k weighs the previous one.
    Ours are stored as they are, as `time_mix_shift_{k,v,r}` / `channel_mix_shift_{k,r}`,
    squeezed from (1, 1, n_embd) to (n_embd,).
  * time_decay is stored as trained (the decay per step is exp(-exp(w))), as rwkv6 does.
  * like llama.cpp's rwkv6 (and transformers in inference mode), the attention output and
    channel-mix value weights of block i are divided by 2 ** (i // rescale_every) and
    `rwkv.rescale_every_n_layers` is written; a runtime halves the residual stream after every
    rescale_every blocks. Division by a power of two is exact in float.
"""

from __future__ import annotations

from ggufsmith.arch.base import Architecture, ArchKeys
from ggufsmith.arch.decoder import in_block
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.tokenizer.rwkv_world import has_rwkv_world_vocab
from ggufsmith.gguf_writer.metadata import Metadata

RWKV_ARCHITECTURE_VERSION = 4  # the only value the spec allows

_RESCALED = (".time_mix_output.weight", ".channel_mix_value.weight")
_SQUEEZED = ("_shift_k.weight", "_shift_v.weight", "_shift_r.weight")


class Rwkv(Architecture):
    name = "rwkv"
    hf_classes = ("RwkvForCausalLM",)
    model_types = ("rwkv",)
    tokenizer_kind = None  # tokenizer.json (GPT-NeoX BPE, the Pile models) or the world vocabulary
    tensor_names = {
        "rwkv.embeddings.weight": T("token_embd.weight", "n_vocab", "n_embd"),
        "rwkv.blocks.0.pre_ln.weight": T("token_embd_norm.weight", "n_embd"),
        "rwkv.blocks.0.pre_ln.bias": T("token_embd_norm.bias", "n_embd"),
        "rwkv.ln_out.weight": T("output_norm.weight", "n_embd"),
        "rwkv.ln_out.bias": T("output_norm.bias", "n_embd"),
        "head.weight": T("output.weight", "n_vocab", "n_embd"),
        **in_block({
            "ln1.weight": T("attn_norm.weight", "n_embd"),
            "ln1.bias": T("attn_norm.bias", "n_embd"),
            "ln2.weight": T("attn_norm_2.weight", "n_embd"),
            "ln2.bias": T("attn_norm_2.bias", "n_embd"),
            "attention.time_decay": T("time_mix_decay.weight", "n_att"),
            "attention.time_first": T("time_mix_first.weight", "n_att"),
            "attention.time_mix_key": T("time_mix_shift_k.weight", "n_embd"),
            "attention.time_mix_value": T("time_mix_shift_v.weight", "n_embd"),
            "attention.time_mix_receptance": T("time_mix_shift_r.weight", "n_embd"),
            "attention.key.weight": T("time_mix_key.weight", "n_att", "n_embd"),
            "attention.value.weight": T("time_mix_value.weight", "n_att", "n_embd"),
            "attention.receptance.weight": T("time_mix_receptance.weight", "n_att", "n_embd"),
            "attention.output.weight": T("time_mix_output.weight", "n_embd", "n_att"),
            "feed_forward.time_mix_key": T("channel_mix_shift_k.weight", "n_embd"),
            "feed_forward.time_mix_receptance": T("channel_mix_shift_r.weight", "n_embd"),
            "feed_forward.key.weight": T("channel_mix_key.weight", "n_ff", "n_embd"),
            "feed_forward.receptance.weight": T("channel_mix_receptance.weight", "n_embd", "n_embd"),
            "feed_forward.value.weight": T("channel_mix_value.weight", "n_embd", "n_ff"),
        }, hf_prefix="rwkv.blocks.{bid}."),
    }
    # The per-channel vectors are 1-D after squeezing and so F32 anyway; time_first and
    # time_decay feed an exp(), where quantization error would be amplified.
    f32_tensors = (r"blk\.\d+\.time_mix_(decay|first)\.weight",)

    def __init__(self, config) -> None:
        super().__init__(config)
        if has_rwkv_world_vocab(config.path.parent):
            self.tokenizer_kind = "rwkv"  # the world vocabulary, exported by tokenizer.rwkv_world

    def dims(self) -> dict[str, int]:
        # the attention width, which RWKV-4 allows to differ from the hidden size
        return {"n_att": self.config.get_int("attention_hidden_size", "hidden_size", min=1)}

    def metadata(self) -> Metadata:
        c = self.config
        hidden = c.get_int("hidden_size", min=1)
        m = Metadata()
        keys = ArchKeys(m, self.name)
        keys.u32(Keys.RWKV.ARCHITECTURE_VERSION, RWKV_ARCHITECTURE_VERSION)
        # The spec types these uint64 (no llama.cpp reader for rwkv4 insists on uint32).
        keys.u64(Keys.LLM.CONTEXT_LENGTH, c.get_int("context_length", min=1))
        keys.u64(Keys.LLM.BLOCK_COUNT, c.get_int("num_hidden_layers", min=1))
        keys.u64(Keys.LLM.EMBEDDING_LENGTH, hidden)
        keys.u64(Keys.LLM.FEED_FORWARD_LENGTH, c.get_int("intermediate_size", default=4 * hidden, min=1))
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get_float("layer_norm_epsilon", default=1e-5, min=0))
        keys.u32(Keys.RWKV.RESCALE_EVERY_N_LAYERS, self._rescale_every())
        return m

    def _rescale_every(self) -> int:
        return self.config.get_int("rescale_every", default=0)

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith(_SQUEEZED):
            return tensor.reshape(tensor.shape[-1])
        every = self._rescale_every()
        if every > 0 and name.endswith(_RESCALED):
            divisor = 2 ** (int(name.split(".")[1]) // every)
            if divisor > 1:
                return tensor.map(lambda w: w / w.dtype.type(divisor))
        return tensor
