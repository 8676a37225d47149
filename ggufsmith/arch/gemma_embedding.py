"""EmbeddingGemma (google/embeddinggemma-300m): a Gemma 3 text model (`Gemma3TextModel`) with
bidirectional attention, in a sentence-transformers folder whose mean pooling is followed by two
Dense projections (768 -> 3072 -> 768, no bias, no activation) and Normalize.

llama.cpp's gemma-embedding graph is gemma3's (the same tensors and keys: see gemma.py) without the
causal mask: full layers attend to every token, sliding ones to those at most sliding_window / 2
away on either side, as transformers' bidirectional window (which halves config.json's value on
load) does. After pooling it applies `dense_2` then `dense_3` (plain matrix products, sizes in
{arch}.dense_2_feat_in/out and dense_3_feat_in/out), taken here from the Dense modules' folders.
Refused in one line: Dense modules llama.cpp cannot run that way (another count than two, a bias,
an activation, sizes that do not lead from the model's width back to it).
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys, HFConfig
from ggufsmith.arch.common import SLIDING, sentence_transformers_folder
from ggufsmith.arch.decoder import attention, embeddings, in_block, mlp, norms
from ggufsmith.arch.encoder import pooling_key
from ggufsmith.arch.gemma import SANDWICH_NORMS, Gemma3
from ggufsmith.constants import Keys
from ggufsmith.errors import ConversionError
from ggufsmith.readers.lazy_tensor import LazyTensor
from ggufsmith.readers.sentence_transformers import IDENTITY

_BLOCK = {**norms(**SANDWICH_NORMS), **attention(biases="none", qk_norm=True), **mlp(biases="none")}


class GemmaEmbedding(Gemma3):
    name = "gemma-embedding"
    hf_classes = ("Gemma3TextModel",)
    model_types = ()  # gemma3_text is the causal model's too: claimed by class only
    language_model = None
    bidirectional = True
    layers_of_27b = 0  # llama.cpp's gemma-embedding always scales queries by 1/sqrt(head_dim)
    # Gemma3TextModel saves its tensors without the "model." of Gemma3ForCausalLM.
    tensor_names = {**{hf: spec for prefix in ("", "model.") for hf, spec in embeddings(prefix).items()},
                    **in_block(_BLOCK, hf_prefix="layers.{bid}."), **in_block(_BLOCK)}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.sentence_transformers = sentence_transformers_folder(self.config, self.name, supported=("Dense",))
        self.dense = self.sentence_transformers.dense_modules() if self.sentence_transformers else []
        if not self.dense:
            return
        where = self.sentence_transformers.modules_path
        n_embd = self.config.get_int("hidden_size", min=1)
        shapes = [(d.in_features, d.out_features) for d in self.dense]
        if len(self.dense) != 2 or shapes[0][0] != n_embd or shapes[1] != (shapes[0][1], n_embd):
            raise ConversionError(f"{where}: Dense modules of (in, out) features {shapes}; llama.cpp's {self.name} "
                                  f"applies exactly two, from the model's width {n_embd} back to it")
        for d in self.dense:
            if d.bias is not None or d.activation != IDENTITY:
                raise ConversionError(f"{d.folder}: a Dense module with {'a bias' if d.bias is not None else d.activation}"
                                      f", which llama.cpp's {self.name} does not apply (only the matrix product)")

    def family_keys(self, keys: ArchKeys) -> None:
        super().family_keys(keys)
        if SLIDING not in self.swa_layer_types():
            keys.u32(Keys.Attention.SLIDING_WINDOW, self.config.get_int("sliding_window", min=1))  # llama.cpp needs it
        pooling_key(keys, self.sentence_transformers)
        for (feat_in, feat_out), d in zip(((Keys.LLM.DENSE_2_FEAT_IN, Keys.LLM.DENSE_2_FEAT_OUT),
                                           (Keys.LLM.DENSE_3_FEAT_IN, Keys.LLM.DENSE_3_FEAT_OUT)), self.dense):
            keys.u32(feat_in, d.in_features)
            keys.u32(feat_out, d.out_features)

    def extra_tensors(self) -> dict[str, LazyTensor]:
        return {**super().extra_tensors(), **{f"dense_{i + 2}.weight": d.weight for i, d in enumerate(self.dense)}}
