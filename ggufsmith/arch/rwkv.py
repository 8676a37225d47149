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
        "rwkv.embeddings.weight": "token_embd.weight",
        "rwkv.blocks.0.pre_ln.weight": "token_embd_norm.weight",
        "rwkv.blocks.0.pre_ln.bias": "token_embd_norm.bias",
        "rwkv.ln_out.weight": "output_norm.weight",
        "rwkv.ln_out.bias": "output_norm.bias",
        "head.weight": "output.weight",
        "rwkv.blocks.{bid}.ln1.weight": "blk.{bid}.attn_norm.weight",
        "rwkv.blocks.{bid}.ln1.bias": "blk.{bid}.attn_norm.bias",
        "rwkv.blocks.{bid}.ln2.weight": "blk.{bid}.attn_norm_2.weight",
        "rwkv.blocks.{bid}.ln2.bias": "blk.{bid}.attn_norm_2.bias",
        "rwkv.blocks.{bid}.attention.time_decay": "blk.{bid}.time_mix_decay.weight",
        "rwkv.blocks.{bid}.attention.time_first": "blk.{bid}.time_mix_first.weight",
        "rwkv.blocks.{bid}.attention.time_mix_key": "blk.{bid}.time_mix_shift_k.weight",
        "rwkv.blocks.{bid}.attention.time_mix_value": "blk.{bid}.time_mix_shift_v.weight",
        "rwkv.blocks.{bid}.attention.time_mix_receptance": "blk.{bid}.time_mix_shift_r.weight",
        "rwkv.blocks.{bid}.attention.key.weight": "blk.{bid}.time_mix_key.weight",
        "rwkv.blocks.{bid}.attention.value.weight": "blk.{bid}.time_mix_value.weight",
        "rwkv.blocks.{bid}.attention.receptance.weight": "blk.{bid}.time_mix_receptance.weight",
        "rwkv.blocks.{bid}.attention.output.weight": "blk.{bid}.time_mix_output.weight",
        "rwkv.blocks.{bid}.feed_forward.time_mix_key": "blk.{bid}.channel_mix_shift_k.weight",
        "rwkv.blocks.{bid}.feed_forward.time_mix_receptance": "blk.{bid}.channel_mix_shift_r.weight",
        "rwkv.blocks.{bid}.feed_forward.key.weight": "blk.{bid}.channel_mix_key.weight",
        "rwkv.blocks.{bid}.feed_forward.receptance.weight": "blk.{bid}.channel_mix_receptance.weight",
        "rwkv.blocks.{bid}.feed_forward.value.weight": "blk.{bid}.channel_mix_value.weight",
    }
    # The per-channel vectors are 1-D after squeezing and so F32 anyway; time_first and
    # time_decay feed an exp(), where quantization error would be amplified.
    f32_tensors = (r"blk\.\d+\.time_mix_(decay|first)\.weight",)

    def __init__(self, config) -> None:
        super().__init__(config)
        if has_rwkv_world_vocab(config.path.parent):
            self.tokenizer_kind = "rwkv"  # the world vocabulary, exported by tokenizer.rwkv_world

    def metadata(self) -> Metadata:
        c = self.config
        hidden = c.get("hidden_size")
        m = Metadata()
        keys = ArchKeys(m, self.name)
        keys.u32(Keys.RWKV.ARCHITECTURE_VERSION, RWKV_ARCHITECTURE_VERSION)
        # The spec types these uint64 (no llama.cpp reader for rwkv4 insists on uint32).
        keys.u64(Keys.LLM.CONTEXT_LENGTH, c.get("context_length"))
        keys.u64(Keys.LLM.BLOCK_COUNT, c.get("num_hidden_layers"))
        keys.u64(Keys.LLM.EMBEDDING_LENGTH, hidden)
        keys.u64(Keys.LLM.FEED_FORWARD_LENGTH, c.get("intermediate_size", default=4 * hidden))
        keys.f32(Keys.Attention.LAYERNORM_EPS, c.get("layer_norm_epsilon", default=1e-5))
        keys.u32(Keys.RWKV.RESCALE_EVERY_N_LAYERS, self._rescale_every())
        return m

    def _rescale_every(self) -> int:
        return int(self.config.get("rescale_every", default=0))

    def transform(self, name: str, tensor: LazyTensor) -> LazyTensor:
        if name.endswith(_SQUEEZED):
            return tensor.reshape(tensor.shape[-1])
        every = self._rescale_every()
        if every > 0 and name.endswith(_RESCALED):
            divisor = 2 ** (int(name.split(".")[1]) // every)
            if divisor > 1:
                return tensor.map(lambda w: w / w.dtype.type(divisor))
        return tensor
