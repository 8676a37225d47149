"""EuroBERT (`EuroBertModel`, and the encoder of `EuroBertForMaskedLM`) as llama.cpp's eurobert:
a Llama-layout encoder (RMSNorm before attention and MLP, rotary positions, SwiGLU MLP) with
bidirectional attention, a final norm and no language-model head, for llama.cpp's embedding tools.

llama.cpp's eurobert graph rotates NEOX pairs (HF's rotate_half), so q and k are stored as HF
stores them. It loads no biases and no rope scaling (its converter writes rope.scaling.type none):
a config with either is refused rather than converted to a file that computes something else.
The MaskedLM head (`lm_head`) is left out, as BERT's; the pooling comes from the
sentence-transformers folder, as for the other encoders.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys, HFConfig
from ggufsmith.arch.common import reject, sentence_transformers_folder
from ggufsmith.arch.decoder import LLAMA_NORMS, Decoder, attention, in_block, mlp, norms
from ggufsmith.arch.encoder import pooling_key, with_prefixes
from ggufsmith.arch.tensors import T
from ggufsmith.constants import Keys

# EuroBertModel saves its weights bare; EuroBertForMaskedLM under "model."
_ENCODER = {
    "embed_tokens.weight": T("token_embd.weight", "n_vocab", "n_embd"),
    "norm.weight": T("output_norm.weight", "n_embd"),
    **in_block({**norms(**LLAMA_NORMS), **attention(biases="none"), **mlp(biases="none", when=None)},
               hf_prefix="layers.{bid}."),
}


class EuroBert(Decoder):
    name = "eurobert"
    hf_classes = ("EuroBertModel", "EuroBertForMaskedLM")
    model_types = ("eurobert",)
    tokenizer_kind = None  # a byte-level BPE tokenizer.json (Llama 3's)
    tensor_names = with_prefixes(_ENCODER, "model.", "")
    ignored_tensors = (r"lm_head\.(weight|bias)",)  # EuroBertForMaskedLM's head: not part of the embeddings
    # EuroBertConfig's defaults, for config.json files that leave them out
    config_defaults = {"hidden_act": "silu", "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        reject(c, c.get_str("hidden_act") != "silu", f"hidden_act is {c.get_str('hidden_act')!r} (not SiLU)")
        for bias in ("attention_bias", "mlp_bias"):
            reject(c, c.get_bool(bias), f"{bias} is set (llama.cpp's eurobert loads no biases)")
        self.rope.require_unscaled()
        self.sentence_transformers = sentence_transformers_folder(c, self.name)

    def family_keys(self, keys: ArchKeys) -> None:
        keys.bool(Keys.Attention.CAUSAL, False)
        pooling_key(keys, self.sentence_transformers)
