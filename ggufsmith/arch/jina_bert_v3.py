"""jina-embeddings-v3 (transformers' `JinaEmbeddingsV3Model`, and the checkpoint jina publishes for
its own code: an `XLMRobertaModel` config with rotary positions and task LoRA adapters) as
llama.cpp's jina-bert-v3.

The bert graph with XLM-RoBERTa's tokenizer and token types, rotary attention (NEOX pairs: HF's
rotate_half, so the weights are stored as they are) in place of a position table, and one fused
q/k/v projection (`mixer.Wqkv`, rows q then k then v, as llama.cpp's attn_qkv). The pooler is not
part of the embeddings. jina's published checkpoint holds every linear and embedding weight as a
parametrization (`...parametrizations.weight.original`) with five task adapters stacked beside it
(`...parametrizations.weight.0.lora_A/B`: retrieval.query, retrieval.passage, separation,
classification, text-matching). The base weights make the model's file, which computes the model
without a task adapter (transformers' JinaEmbeddingsV3Model, jina's encode(task=None)); each task's
adapter is written to a GGUF adapter file of its own beside it, `lora-<task>-<file>`, as llama.cpp's
converter does (readers/jina_task_adapters.py, converters/task_adapters.py), for llama.cpp's --lora.
"""

from __future__ import annotations

from ggufsmith.arch.base import ArchKeys, HFConfig
from ggufsmith.arch.bert import Bert, is_jina_v3
from ggufsmith.arch.encoder import bert_attention, bert_embeddings, bert_mlp, with_prefixes
from ggufsmith.arch.rope import Rope
from ggufsmith.constants import Keys
from ggufsmith.errors import ConversionError
from ggufsmith.gguf_writer.metadata import Metadata

_LAYER = "encoder.layers.{bid}."
_NAMES = {
    **bert_embeddings("emb_ln"),
    **bert_attention(_LAYER, "mixer.Wqkv", "mixer.out_proj", "norm1", qkv_rows="n_embd + 2 * n_head_kv * head_dim"),
    **bert_mlp(_LAYER, "mlp.fc1", "mlp.fc2", "norm2"),
}
_PARAMETRIZED = ".parametrizations.weight.original"  # jina's published name of a weight with adapters


class JinaBertV3(Bert):
    name = "jina-bert-v3"
    # XLMRobertaLoRA: jina's own class, in the config of a copy saved from its remote code
    hf_classes = ("JinaEmbeddingsV3Model", "XLMRobertaLoRA")
    model_types = ("jina_embeddings_v3",)
    tensor_names = with_prefixes(_NAMES, "roberta.", "") | with_prefixes(
        {hf[:-len(".weight")] + _PARAMETRIZED: entry for hf, entry in _NAMES.items() if hf.endswith(".weight")},
        "roberta.", "")
    ignored_tensors = (
        r"(roberta\.)?pooler\.dense\..*",  # the pooler (and its adapters): not part of the embeddings
        r".*\.parametrizations\.weight\.0\.lora_[AB]",  # the task adapters: files of their own
    )
    # JinaEmbeddingsV3Config's defaults (its rope_theta too, read below).
    config_defaults = {"type_vocab_size": 1, "layer_norm_eps": 1e-5, "hidden_act": "gelu",
                       "position_embedding_type": "rotary"}
    position_embedding = "rotary"
    has_output_head = False  # embeddings only: its task adapters may change the token embeddings

    @classmethod
    def claims(cls, config: HFConfig) -> bool:
        return any(a in cls.hf_classes for a in config.architectures) or is_jina_v3(config)

    def metadata(self) -> Metadata:
        metadata = super().metadata()
        rope = Rope(self.config, "rotary_emb_base")
        rope.require_unscaled()
        if rope.theta is None:
            raise ConversionError(f"{self.config.path}: no rotary base frequency (rope_parameters.rope_theta "
                                  "or rotary_emb_base); add the model's")
        ArchKeys(metadata, self.name).f32(Keys.Rope.FREQ_BASE, rope.theta)
        return metadata
