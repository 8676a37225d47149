"""Gemma 4 (`Gemma4ForCausalLM`, and the language model of `Gemma4ForConditionalGeneration`), as
llama.cpp's `gemma4` architecture runs it (src/models/gemma4.cpp). Sources: transformers'
modeling_gemma4.py / configuration_gemma4.py, llama.cpp's loader and Gemma 4 converter.

Unlike Gemma 1-3, the norms are plain x * w (no offset from 1). What the file must say:
- layer kinds: `layer_types` as the sliding_window_pattern bool array; sliding layers have head
  size `head_dim`, full ones `global_head_dim` (key_length / key_length_swa), and, with
  attention_k_eq_v, `num_global_key_value_heads` (head_count_kv per layer); a full layer then has
  no v_proj and llama.cpp, like transformers, uses the key projection as values.
- rope: sliding layers the default rope over the whole head (rope.freq_base_swa); full layers
  "proportional" rope, which rotates only the first partial_rotary_factor of each half-head. GGML's
  NeoX rope rotates the first n_rot dimensions of a head, so it runs over the whole head with a
  rope_freqs tensor dividing the frequencies of the unrotated pairs by 1e30 (they stay put).
- per-layer embeddings (E2B/E4B: hidden_size_per_layer_input), KV sharing of the last
  num_kv_shared_layers layers, double-wide MLPs in those layers, layer_scalar, final soft-capping.
- the MoE block of 26B-A4B (enable_moe_block): router (RMS-normed input, scaled, softmax over
  experts, top-k renormalized, times a per-expert scale: llama.cpp's gemma4 graph), fused gate/up
  experts, and its own norms, beside the dense MLP.
Refused in one line: attention biases, bidirectional
text attention, a KV-sharing layout llama.cpp would read from other layers than transformers, and
rope variants llama.cpp does not run.
"""

from __future__ import annotations

import numpy as np

from ggufsmith.arch.base import Architecture, ArchKeys, HFConfig, LanguageModelOf
from ggufsmith.arch.common import FULL, SLIDING, layer_types, periodic_layer_types, reject, sliding_flags
from ggufsmith.arch.decoder import embeddings, in_block, norms
from ggufsmith.arch.gemma import GELU_TANH, SANDWICH_NORMS
from ggufsmith.arch.rope import ROPE_FREQS
from ggufsmith.arch.tensors import T
from ggufsmith.constants import GGUFValueType, Keys, arch_key
from ggufsmith.gguf_writer.metadata import Metadata
from ggufsmith.readers.lazy_tensor import LazyTensor

PLE = "n_pl > 0"  # per-layer embeddings present
MOE = "n_expert > 0"
# Frequency divisor of the pairs proportional rope leaves unrotated: their angle becomes ~0.
UNROTATED = 1e30

MULTIMODAL_GEMMA4 = LanguageModelOf(
    prefixes={"model.language_model.": "model."},
    skipped={"model.vision_tower.": "the vision tower", "model.embed_vision.": "the vision embedder",
             "model.audio_tower.": "the audio tower", "model.embed_audio.": "the audio embedder"},
)


class Gemma4(Architecture):
    name = "gemma4"
    hf_classes = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
    model_types = ("gemma4", "gemma4_text")
    tokenizer_kind = "gemma4"
    language_model = MULTIMODAL_GEMMA4
    tied_output_head = r"lm_head\.weight"
    dim_names = ("has_kv", "has_v", "n_pl")  # see dims(); head_dim becomes per layer
    # Gemma4TextConfig's defaults for keys a config.json may leave out.
    config_defaults = {"head_dim": 256, "rms_norm_eps": 1e-6, "sliding_window": 512,
                "max_position_embeddings": 131_072, "hidden_size_per_layer_input": 256,
                "vocab_size_per_layer_input": 262_144, "num_kv_shared_layers": 0}
    tensor_names = {
        **embeddings(),
        "model.embed_tokens_per_layer.weight": T("per_layer_token_embd.weight", "n_vocab", "n_layer * n_pl", when=PLE),
        "model.per_layer_model_projection.weight": T("per_layer_model_proj.weight", "n_layer * n_pl", "n_embd", when=PLE),
        "model.per_layer_projection_norm.weight": T("per_layer_proj_norm.weight", "n_pl", when=PLE),
        **in_block({
            **norms(**SANDWICH_NORMS),
            "self_attn.q_proj.weight": T("attn_q.weight", "n_head * head_dim", "n_embd"),
            "self_attn.k_proj.weight": T("attn_k.weight", "n_head_kv * head_dim", "n_embd", when="has_kv"),
            "self_attn.v_proj.weight": T("attn_v.weight", "n_head_kv * head_dim", "n_embd", when="has_v"),
            "self_attn.o_proj.weight": T("attn_output.weight", "n_embd", "n_head * head_dim"),
            "self_attn.q_norm.weight": T("attn_q_norm.weight", "head_dim"),
            "self_attn.k_norm.weight": T("attn_k_norm.weight", "head_dim", when="has_kv"),
            "mlp.gate_proj.weight": T("ffn_gate.weight", "n_ff", "n_embd"),
            "mlp.up_proj.weight": T("ffn_up.weight", "n_ff", "n_embd"),
            "mlp.down_proj.weight": T("ffn_down.weight", "n_embd", "n_ff"),
            "layer_scalar": T("layer_output_scale.weight", 1, optional=True),
            # The MoE block (26B-A4B) beside the dense MLP: router, experts (gate and up fused, gate
            # first, as llama.cpp splits them), per-expert output scale, and its three norms.
            "router.proj.weight": T("ffn_gate_inp.weight", "n_expert", "n_embd", when=MOE),
            "router.scale": T("ffn_gate_inp.scale", "n_embd", when=MOE),
            "router.per_expert_scale": T("ffn_down_exps.scale", "n_expert", when=MOE),
            "experts.gate_up_proj": T("ffn_gate_up_exps.weight", "n_expert", "n_ff_exp * 2", "n_embd", when=MOE),
            "experts.down_proj": T("ffn_down_exps.weight", "n_expert", "n_embd", "n_ff_exp", when=MOE),
            "pre_feedforward_layernorm_2.weight": T("pre_ffw_norm_2.weight", "n_embd", when=MOE),
            "post_feedforward_layernorm_1.weight": T("post_ffw_norm_1.weight", "n_embd", when=MOE),
            "post_feedforward_layernorm_2.weight": T("post_ffw_norm_2.weight", "n_embd", when=MOE),
            "per_layer_input_gate.weight": T("inp_gate.weight", "n_pl", "n_embd", when=PLE),
            "per_layer_projection.weight": T("proj.weight", "n_embd", "n_pl", when=PLE),
            "post_per_layer_input_norm.weight": T("post_norm.weight", "n_embd", when=PLE),
        }),
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.config
        self.n_layer = c.get_int("num_hidden_layers", min=1)
        self.n_head = c.get_int("num_attention_heads", min=1)
        self.n_head_kv = c.get_int("num_key_value_heads", default=self.n_head, min=1)
        self.head_dim = c.get_int("head_dim", min=1)
        self.k_eq_v = c.get_bool("attention_k_eq_v", default=False)
        self.layer_types = self._layer_types()
        self.head_dims, self.kv_heads = self._per_layer_heads()
        full_dims = {d for d, t in zip(self.head_dims, self.layer_types) if t == FULL}
        reject(c, len(full_dims) != 1 or any(d != self.head_dim for d, t in zip(self.head_dims, self.layer_types) if t == SLIDING),
               "the layers of one kind have different head sizes (llama.cpp has one for full, one for sliding layers)")
        self.head_dim_full = full_dims.pop()
        self.n_kv_shared = c.get_int("num_kv_shared_layers", max=self.n_layer - 2)
        self.n_pl = c.get_int("hidden_size_per_layer_input", default=0) or 0
        self._refuse_what_llamacpp_runs_differently()

    def _layer_types(self) -> list[str]:
        types = layer_types(self.config, periodic_layer_types(self.n_layer, 6))  # transformers' default: every sixth full
        return [*types[:-1], FULL]  # transformers forces the last layer to full attention

    def _per_layer_heads(self) -> tuple[list[int], list[int]]:
        """Each layer's head size and key/value head count: per_layer_config's overrides (as
        transformers 5 saves them), else global_head_dim / num_global_key_value_heads for the full
        layers (the latter only with attention_k_eq_v, as in transformers)."""
        c = self.config
        if "per_layer_config" in c:
            overrides = c.sub("per_layer_config")
            layers = [overrides.sub(str(i)) if str(i) in overrides else None for i in range(self.n_layer)]
            head_dims = [o.get_int("head_dim", default=self.head_dim, min=2) if o else self.head_dim for o in layers]
            kv_heads = [o.get_int("num_key_value_heads", default=self.n_head_kv, min=1) if o else self.n_head_kv for o in layers]
            return head_dims, kv_heads
        global_dim = c.get_int("global_head_dim", default=512, min=2)
        global_kv = (c.get_int("num_global_key_value_heads", default=None, min=1) if self.k_eq_v else None) or self.n_head_kv
        full = [t == FULL for t in self.layer_types]
        return ([global_dim if f else self.head_dim for f in full], [global_kv if f else self.n_head_kv for f in full])

    def _refuse_what_llamacpp_runs_differently(self) -> None:
        c = self.config
        reject(c, c.get_bool("attention_bias", default=False), "attention_bias is set")
        reject(c, c.get("use_bidirectional_attention", default=None) == "all", "use_bidirectional_attention is 'all'")
        activation = c.get_str("hidden_activation", default=GELU_TANH)
        reject(c, activation != GELU_TANH, f"hidden_activation is {activation!r} (llama.cpp runs {GELU_TANH})")
        reject(c, self.n_pl > 0 and c.get_int("vocab_size_per_layer_input") != c.get_int("vocab_size"),
               "vocab_size_per_layer_input differs from vocab_size (llama.cpp indexes both tables by token)")
        if self.n_kv_shared:
            # llama.cpp: a shared layer reads the KV of layer first_shared - 2 (sliding) or - 1 (full);
            # transformers: of the last unshared layer of its kind. They agree only on this layout.
            first_shared = self.n_layer - self.n_kv_shared
            reject(c, self.layer_types[first_shared - 2: first_shared] != [SLIDING, FULL],
                   "num_kv_shared_layers is set but the last unshared layers are not sliding then full "
                   "(llama.cpp would share other layers' keys and values)")
        sliding, full = self._rope(SLIDING), self._rope(FULL)
        reject(c, sliding.get("rope_type", "default") != "default", "the sliding layers' rope_type is not 'default'")
        reject(c, full.get("rope_type", "default") not in ("default", "proportional"),
               "the full layers' rope_type is neither 'default' nor 'proportional'")
        reject(c, float(full.get("factor", 1.0)) != 1.0, "the full layers' rope has a scaling factor")

    def _rope(self, kind: str) -> dict:
        """rope_parameters[kind], with transformers' defaults for Gemma 4."""
        defaults = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
        rope = self.config.get_dict("rope_parameters", default=defaults)
        section = self.config.sub("rope_parameters", rope)
        return section.get_dict(kind) if kind in section else defaults[kind]

    def _has_kv(self, bid: int) -> bool:
        return bid < self.n_layer - self.n_kv_shared

    def _n_ff(self) -> list[int]:
        n_ff = self.config.get_int("intermediate_size", min=1)
        double = self.config.get_bool("use_double_wide_mlp", default=False)
        return [n_ff * 2 if double and not self._has_kv(i) else n_ff for i in range(self.n_layer)]

    def metadata(self) -> Metadata:
        c = self.config
        metadata = Metadata()
        keys = ArchKeys(metadata, self.name)

        def array(template: str, values: list, element: GGUFValueType) -> None:
            metadata.add(arch_key(template, self.name), values, GGUFValueType.ARRAY, element)

        def per_layer(template: str, values: list[int]) -> None:  # one number when every layer has the same
            if len(set(values)) == 1:
                keys.u32(template, values[0])
            else:
                array(template, values, GGUFValueType.UINT32)

        keys.u32(Keys.LLM.CONTEXT_LENGTH, c.get_int("max_position_embeddings", min=1))
        keys.u32(Keys.LLM.EMBEDDING_LENGTH, c.get_int("hidden_size", min=1))
        keys.u32(Keys.LLM.BLOCK_COUNT, self.n_layer)
        per_layer(Keys.LLM.FEED_FORWARD_LENGTH, self._n_ff())
        keys.u32(Keys.Attention.HEAD_COUNT, self.n_head)
        per_layer(Keys.Attention.HEAD_COUNT_KV, self.kv_heads)
        keys.f32(Keys.Attention.LAYERNORM_RMS_EPS, c.get_float("rms_norm_eps", min=0))
        keys.u32(Keys.Attention.KEY_LENGTH, self.head_dim_full)
        keys.u32(Keys.Attention.VALUE_LENGTH, self.head_dim_full)
        keys.u32(Keys.Attention.KEY_LENGTH_SWA, self.head_dim)
        keys.u32(Keys.Attention.VALUE_LENGTH_SWA, self.head_dim)
        keys.u32(Keys.Attention.SLIDING_WINDOW, c.get_int("sliding_window", min=1))
        array(Keys.Attention.SLIDING_WINDOW_PATTERN, sliding_flags(self.layer_types), GGUFValueType.BOOL)
        keys.u32(Keys.Attention.SHARED_KV_LAYERS, self.n_kv_shared)
        keys.u32(Keys.LLM.EMBEDDING_LENGTH_PER_LAYER_INPUT, self.n_pl)
        keys.f32(Keys.Rope.FREQ_BASE, float(self._rope(FULL).get("rope_theta", 1_000_000.0)))
        keys.f32(Keys.Rope.FREQ_BASE_SWA, float(self._rope(SLIDING).get("rope_theta", 10_000.0)))
        keys.u32(Keys.Rope.DIMENSION_COUNT, self.head_dim_full)  # the whole head, see rope_freqs
        keys.u32(Keys.Rope.DIMENSION_COUNT_SWA, self.head_dim)
        keys.f32(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, c.get_float("final_logit_softcapping", default=None, min=0) or None)
        if c.get_bool("enable_moe_block", default=False):
            n_expert = c.get_int("num_experts", min=1)
            keys.u32(Keys.LLM.EXPERT_COUNT, n_expert)
            keys.u32(Keys.LLM.EXPERT_USED_COUNT, c.get_int("top_k_experts", min=1, max=n_expert))
            keys.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, c.get_int("moe_intermediate_size", min=1))
        return metadata

    def dims(self) -> dict:
        full = [t == FULL for t in self.layer_types]
        return {
            "head_dim": self.head_dims,
            "has_kv": [self._has_kv(i) for i in range(self.n_layer)],
            "has_v": [self._has_kv(i) and not (self.k_eq_v and f) for i, f in enumerate(full)],
            "n_pl": self.n_pl,
        }

    def extra_tensors(self) -> dict[str, LazyTensor]:
        """Proportional rope of the full layers as frequency divisors: 1 for the rotated pairs,
        UNROTATED for the rest (see the module docstring)."""
        full = self._rope(FULL)
        fraction = float(full.get("partial_rotary_factor", 1.0)) if full.get("rope_type") == "proportional" else 1.0
        rotated = int(fraction * self.head_dim_full // 2)
        factors = np.full(self.head_dim_full // 2, UNROTATED, dtype=np.float32)
        factors[:rotated] = 1.0
        return {ROPE_FREQS: LazyTensor.from_array(factors, source=f"{self.config.label} rope_parameters.full_attention")}
