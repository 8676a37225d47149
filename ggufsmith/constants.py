"""Every number and name of the GGUF format that the rest of ggufsmith refers to.

One module so that no key string, type id or block size is spelled twice in the code base.
Sources: the GGUF spec (the contract) and llama.cpp's loader where the spec is silent or differs;
each such difference is marked with "llama.cpp:".
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3  # the only version we write; the reader also accepts 1 and 2
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_MAX_DIMS = 4
# The spec says names are at most 64 bytes; ggml stores them in char[64] with a NUL, so 63 fit.
GGUF_MAX_TENSOR_NAME_BYTES = 63
GGUF_MAX_KEY_BYTES = 65535
# Arrays of arrays may nest; deeper than this is treated as hostile (no real writer goes past 2).
GGUF_MAX_ARRAY_DEPTH = 8
QK_K = 256  # super-block size of the k-quants
GGML_QUANTIZATION_VERSION = 2  # what llama.cpp writes into general.quantization_version


class GGMLType(IntEnum):
    """Tensor data types (enum ggml_type). Ids 4 and 5 were removed from ggml."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    # Not in the spec, but written by current llama.cpp; known so that real files can be read.
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


class TypeLayout(NamedTuple):
    block_size: int  # elements per block
    type_size: int  # bytes per block


# Bytes per block follow from the block structs in ggml-common.h.
GGML_TYPE_LAYOUT: dict[GGMLType, TypeLayout] = {
    GGMLType.F32: TypeLayout(1, 4),
    GGMLType.F16: TypeLayout(1, 2),
    GGMLType.Q4_0: TypeLayout(32, 2 + 16),
    GGMLType.Q4_1: TypeLayout(32, 2 + 2 + 16),
    GGMLType.Q5_0: TypeLayout(32, 2 + 4 + 16),
    GGMLType.Q5_1: TypeLayout(32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: TypeLayout(32, 2 + 32),
    GGMLType.Q8_1: TypeLayout(32, 2 + 2 + 32),  # gguf-py says 40 (an old float layout); ggml says 36
    GGMLType.Q2_K: TypeLayout(QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    GGMLType.Q3_K: TypeLayout(QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    GGMLType.Q4_K: TypeLayout(QK_K, 2 + 2 + QK_K // 2 + 12),
    GGMLType.Q5_K: TypeLayout(QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    GGMLType.Q6_K: TypeLayout(QK_K, 2 + QK_K // 16 + 3 * QK_K // 4),
    GGMLType.Q8_K: TypeLayout(QK_K, 4 + QK_K + QK_K // 8),
    GGMLType.IQ2_XXS: TypeLayout(QK_K, 2 + QK_K // 4),
    GGMLType.IQ2_XS: TypeLayout(QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType.IQ3_XXS: TypeLayout(QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ1_S: TypeLayout(QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ4_NL: TypeLayout(32, 2 + 16),
    GGMLType.IQ3_S: TypeLayout(QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ2_S: TypeLayout(QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ4_XS: TypeLayout(QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GGMLType.I8: TypeLayout(1, 1),
    GGMLType.I16: TypeLayout(1, 2),
    GGMLType.I32: TypeLayout(1, 4),
    GGMLType.I64: TypeLayout(1, 8),
    GGMLType.F64: TypeLayout(1, 8),
    GGMLType.IQ1_M: TypeLayout(QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType.BF16: TypeLayout(1, 2),
    GGMLType.TQ1_0: TypeLayout(QK_K, 2 + QK_K // 64 + (QK_K - QK_K // 16) // 5),
    GGMLType.TQ2_0: TypeLayout(QK_K, 2 + 64),
    GGMLType.MXFP4: TypeLayout(32, 1 + 16),
    GGMLType.NVFP4: TypeLayout(64, 4 + 32),
    GGMLType.Q1_0: TypeLayout(128, 2 + 16),
    GGMLType.Q2_0: TypeLayout(64, 2 + 64 // 4),
}


def tensor_nbytes(ggml_type: GGMLType, n_elements: int, row_length: int | None = None) -> int:
    """Bytes that `n_elements` of `ggml_type` occupy. Rows must be whole blocks."""
    layout = GGML_TYPE_LAYOUT[GGMLType(ggml_type)]
    row_length = n_elements if row_length is None else row_length
    if row_length % layout.block_size or n_elements % layout.block_size:
        raise ValueError(
            f"{GGMLType(ggml_type).name} needs rows of a multiple of {layout.block_size} elements, got {row_length}"
        )
    return n_elements // layout.block_size * layout.type_size


# numpy dtypes (without byte order) of the types whose data are plain elements, not blocks: these
# can be byte-swapped for big-endian files. BF16 is kept as its raw 16 bits.
GGML_ELEMENT_DTYPE: dict[GGMLType, str] = {
    GGMLType.F32: "f4",
    GGMLType.F16: "f2",
    GGMLType.BF16: "u2",
    GGMLType.F64: "f8",
    GGMLType.I8: "i1",
    GGMLType.I16: "i2",
    GGMLType.I32: "i4",
    GGMLType.I64: "i8",
}


class GGUFValueType(IntEnum):
    """Metadata value types (enum gguf_metadata_value_type)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


GGUF_INTEGER_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})

# struct format characters (without byte order) of the fixed-size value types.
GGUF_VALUE_STRUCT: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class FileType(IntEnum):
    """Values of general.file_type (llama.cpp's enum llama_ftype; ids it retired are absent)."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38
    MOSTLY_NVFP4 = 39
    MOSTLY_Q1_0 = 40
    MOSTLY_Q2_0 = 41
    GUESSED = 1024


class ExpertGatingFunc(IntEnum):
    """Values of {arch}.expert_gating_func: how a MoE router's logits become expert scores
    (llama.cpp's llama_expert_gating_func_type)."""

    SOFTMAX = 1
    SIGMOID = 2
    SOFTMAX_WEIGHT = 3
    SQRT_SOFTPLUS = 4


class PoolingType(IntEnum):
    """Values of {arch}.pooling_type: how llama.cpp turns per-token embeddings into one per sequence
    (llama.cpp's llama_pooling_type)."""

    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4


class TokenType(IntEnum):
    """Values of tokenizer.ggml.token_type."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Keys:
    """Standard metadata keys. Templates take the architecture: `Keys.LLM.CONTEXT_LENGTH.format(arch="llama")`,
    or use `arch_key(Keys.LLM.CONTEXT_LENGTH, "llama")`."""

    class General:
        TYPE = "general.type"
        ARCHITECTURE = "general.architecture"
        QUANTIZATION_VERSION = "general.quantization_version"
        ALIGNMENT = "general.alignment"
        FILE_TYPE = "general.file_type"
        NAME = "general.name"
        AUTHOR = "general.author"
        VERSION = "general.version"
        ORGANIZATION = "general.organization"
        BASENAME = "general.basename"
        FINETUNE = "general.finetune"
        DESCRIPTION = "general.description"
        QUANTIZED_BY = "general.quantized_by"
        SIZE_LABEL = "general.size_label"
        LICENSE = "general.license"
        LICENSE_NAME = "general.license.name"
        LICENSE_LINK = "general.license.link"
        URL = "general.url"
        DOI = "general.doi"
        UUID = "general.uuid"
        REPO_URL = "general.repo_url"
        SOURCE_URL = "general.source.url"
        SOURCE_DOI = "general.source.doi"
        SOURCE_UUID = "general.source.uuid"
        SOURCE_REPO_URL = "general.source.repo_url"
        BASE_MODEL_COUNT = "general.base_model.count"
        BASE_MODEL_NAME = "general.base_model.{id}.name"
        BASE_MODEL_AUTHOR = "general.base_model.{id}.author"
        BASE_MODEL_VERSION = "general.base_model.{id}.version"
        BASE_MODEL_ORGANIZATION = "general.base_model.{id}.organization"
        BASE_MODEL_URL = "general.base_model.{id}.url"
        BASE_MODEL_DOI = "general.base_model.{id}.doi"
        BASE_MODEL_UUID = "general.base_model.{id}.uuid"
        BASE_MODEL_REPO_URL = "general.base_model.{id}.repo_url"
        TAGS = "general.tags"
        LANGUAGES = "general.languages"
        DATASETS = "general.datasets"
        BASE_MODEL_DESCRIPTION = "general.base_model.{id}.description"
        DATASET_COUNT = "general.dataset.count"
        DATASET_NAME = "general.dataset.{id}.name"
        DATASET_AUTHOR = "general.dataset.{id}.author"
        DATASET_VERSION = "general.dataset.{id}.version"
        DATASET_ORGANIZATION = "general.dataset.{id}.organization"
        DATASET_DESCRIPTION = "general.dataset.{id}.description"
        DATASET_URL = "general.dataset.{id}.url"
        DATASET_DOI = "general.dataset.{id}.doi"
        DATASET_UUID = "general.dataset.{id}.uuid"
        DATASET_REPO_URL = "general.dataset.{id}.repo_url"
        # Recommended sampling settings, from generation_config.json.
        SAMPLING_SEQUENCE = "general.sampling.sequence"
        SAMPLING_TOP_K = "general.sampling.top_k"
        SAMPLING_TOP_P = "general.sampling.top_p"
        SAMPLING_MIN_P = "general.sampling.min_p"
        SAMPLING_XTC_PROBABILITY = "general.sampling.xtc_probability"
        SAMPLING_XTC_THRESHOLD = "general.sampling.xtc_threshold"
        SAMPLING_TEMP = "general.sampling.temp"
        SAMPLING_PENALTY_LAST_N = "general.sampling.penalty_last_n"
        SAMPLING_PENALTY_REPEAT = "general.sampling.penalty_repeat"
        SAMPLING_MIROSTAT = "general.sampling.mirostat"
        SAMPLING_MIROSTAT_TAU = "general.sampling.mirostat_tau"
        SAMPLING_MIROSTAT_ETA = "general.sampling.mirostat_eta"

    class LLM:
        VOCAB_SIZE = "{arch}.vocab_size"
        CONTEXT_LENGTH = "{arch}.context_length"
        EMBEDDING_LENGTH = "{arch}.embedding_length"
        BLOCK_COUNT = "{arch}.block_count"
        FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
        EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
        USE_PARALLEL_RESIDUAL = "{arch}.use_parallel_residual"
        TENSOR_DATA_LAYOUT = "{arch}.tensor_data_layout"
        EXPERT_COUNT = "{arch}.expert_count"
        EXPERT_USED_COUNT = "{arch}.expert_used_count"
        LOGIT_SCALE = "{arch}.logit_scale"
        DECODER_START_TOKEN_ID = "{arch}.decoder_start_token_id"
        DECODER_BLOCK_COUNT = "{arch}.decoder_block_count"  # T5's (Whisper's is decoder.block_count)
        # Keys of the newer families, as llama.cpp's llama-arch.cpp names them.
        EMBEDDING_LENGTH_OUT = "{arch}.embedding_length_out"
        EMBEDDING_LENGTH_PER_LAYER_INPUT = "{arch}.embedding_length_per_layer_input"
        LEADING_DENSE_BLOCK_COUNT = "{arch}.leading_dense_block_count"
        EXPERT_SHARED_FEED_FORWARD_LENGTH = "{arch}.expert_shared_feed_forward_length"
        EXPERT_SHARED_COUNT = "{arch}.expert_shared_count"
        EXPERT_GROUP_COUNT = "{arch}.expert_group_count"
        EXPERT_GROUP_USED_COUNT = "{arch}.expert_group_used_count"
        EXPERT_WEIGHTS_SCALE = "{arch}.expert_weights_scale"
        EXPERT_WEIGHTS_NORM = "{arch}.expert_weights_norm"
        EXPERT_GATING_FUNC = "{arch}.expert_gating_func"
        MOE_EVERY_N_LAYERS = "{arch}.moe_every_n_layers"
        INTERLEAVE_MOE_LAYER_STEP = "{arch}.interleave_moe_layer_step"
        NEXTN_PREDICT_LAYERS = "{arch}.nextn_predict_layers"
        MOE_LATENT_SIZE = "{arch}.moe_latent_size"
        SWIGLU_CLAMP_EXP = "{arch}.swiglu_clamp_exp"
        SWIGLU_CLAMP_SHEXP = "{arch}.swiglu_clamp_shexp"
        POOLING_TYPE = "{arch}.pooling_type"
        HIDDEN_ACT = "{arch}.hidden_activation"
        ATTN_LOGIT_SOFTCAPPING = "{arch}.attn_logit_softcapping"
        ROUTER_LOGIT_SOFTCAPPING = "{arch}.router_logit_softcapping"
        FINAL_LOGIT_SOFTCAPPING = "{arch}.final_logit_softcapping"
        SWIN_NORM = "{arch}.swin_norm"
        RESIDUAL_SCALE = "{arch}.residual_scale"
        EMBEDDING_SCALE = "{arch}.embedding_scale"
        TOKEN_SHIFT_COUNT = "{arch}.token_shift_count"
        FULL_ATTENTION_INTERVAL = "{arch}.full_attention_interval"
        DENSE_2_FEAT_IN = "{arch}.dense_2_feat_in"
        DENSE_2_FEAT_OUT = "{arch}.dense_2_feat_out"
        DENSE_3_FEAT_IN = "{arch}.dense_3_feat_in"
        DENSE_3_FEAT_OUT = "{arch}.dense_3_feat_out"
        SHORTCONV_L_CACHE = "{arch}.shortconv.l_cache"
        CLASSIFIER_OUTPUT_LABELS = "{arch}.classifier.output_labels"

    class Attention:
        HEAD_COUNT = "{arch}.attention.head_count"
        HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
        MAX_ALIBI_BIAS = "{arch}.attention.max_alibi_bias"
        CLAMP_KQV = "{arch}.attention.clamp_kqv"
        KEY_LENGTH = "{arch}.attention.key_length"
        VALUE_LENGTH = "{arch}.attention.value_length"
        LAYERNORM_EPS = "{arch}.attention.layer_norm_epsilon"
        LAYERNORM_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
        REL_BUCKETS_COUNT = "{arch}.attention.relative_buckets_count"
        CAUSAL = "{arch}.attention.causal"
        SLIDING_WINDOW = "{arch}.attention.sliding_window"
        SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"
        GROUP_NORM_EPS = "{arch}.attention.group_norm_epsilon"
        GROUP_NORM_GROUPS = "{arch}.attention.group_norm_groups"
        Q_LORA_RANK = "{arch}.attention.q_lora_rank"
        KV_LORA_RANK = "{arch}.attention.kv_lora_rank"
        SCALE = "{arch}.attention.scale"
        OUTPUT_SCALE = "{arch}.attention.output_scale"
        TEMPERATURE_LENGTH = "{arch}.attention.temperature_length"
        TEMPERATURE_SCALE = "{arch}.attention.temperature_scale"
        KEY_LENGTH_MLA = "{arch}.attention.key_length_mla"
        VALUE_LENGTH_MLA = "{arch}.attention.value_length_mla"
        KEY_LENGTH_SWA = "{arch}.attention.key_length_swa"
        VALUE_LENGTH_SWA = "{arch}.attention.value_length_swa"
        SHARED_KV_LAYERS = "{arch}.attention.shared_kv_layers"
        RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"
        ROPE_PATTERN = "{arch}.attention.rope_pattern"
        INDEXER_TYPES = "{arch}.attention.indexer.types"
        # Spec names for mpt and falcon that llama.cpp does not read (it reads the two above).
        ALIBI_BIAS_MAX = "{arch}.attention.alibi_bias_max"
        CLIP_KQV = "{arch}.attention.clip_kqv"
        USE_NORM = "{arch}.attention.use_norm"

    class Rope:
        DIMENSION_COUNT = "{arch}.rope.dimension_count"
        DIMENSION_COUNT_SWA = "{arch}.rope.dimension_count_swa"
        DIMENSION_SECTIONS = "{arch}.rope.dimension_sections"
        FREQ_BASE_SWA = "{arch}.rope.freq_base_swa"
        SCALING_ALPHA = "{arch}.rope.scaling.alpha"
        FREQ_BASE = "{arch}.rope.freq_base"
        SCALE = "{arch}.rope.scale"
        SCALE_LINEAR = "{arch}.rope.scale_linear"
        SCALING_TYPE = "{arch}.rope.scaling.type"
        SCALING_FACTOR = "{arch}.rope.scaling.factor"
        SCALING_ATTN_FACTOR = "{arch}.rope.scaling.attn_factor"
        SCALING_ORIG_CTX_LEN = "{arch}.rope.scaling.original_context_length"
        SCALING_FINETUNED = "{arch}.rope.scaling.finetuned"
        SCALING_YARN_LOG_MUL = "{arch}.rope.scaling.yarn_log_multiplier"
        SCALING_YARN_BETA_FAST = "{arch}.rope.scaling.yarn_beta_fast"
        SCALING_YARN_BETA_SLOW = "{arch}.rope.scaling.yarn_beta_slow"
        SCALING_YARN_EXT_FACTOR = "{arch}.rope.scaling.yarn_ext_factor"
        SCALING_YARN_ATTN_FACTOR = "{arch}.rope.scaling.yarn_attn_factor"

    class SSM:
        CONV_KERNEL = "{arch}.ssm.conv_kernel"
        INNER_SIZE = "{arch}.ssm.inner_size"
        STATE_SIZE = "{arch}.ssm.state_size"
        TIME_STEP_RANK = "{arch}.ssm.time_step_rank"
        GROUP_COUNT = "{arch}.ssm.group_count"
        DT_B_C_RMS = "{arch}.ssm.dt_b_c_rms"

    class RWKV:
        ARCHITECTURE_VERSION = "{arch}.architecture_version"
        RESCALE_EVERY_N_LAYERS = "{arch}.rescale_every_n_layers"

    class XIELU:
        """Apertus' xIELU activation, one value per block; llama.cpp's names carry no architecture."""
        ALPHA_N = "xielu.alpha_n"
        ALPHA_P = "xielu.alpha_p"
        BETA = "xielu.beta"
        EPS = "xielu.eps"

    class Whisper:
        ENCODER_CONTEXT_LENGTH = "{arch}.encoder.context_length"
        ENCODER_EMBEDDING_LENGTH = "{arch}.encoder.embedding_length"
        ENCODER_BLOCK_COUNT = "{arch}.encoder.block_count"
        ENCODER_MELS_COUNT = "{arch}.encoder.mels_count"
        ENCODER_HEAD_COUNT = "{arch}.encoder.attention.head_count"
        DECODER_CONTEXT_LENGTH = "{arch}.decoder.context_length"
        DECODER_EMBEDDING_LENGTH = "{arch}.decoder.embedding_length"
        DECODER_BLOCK_COUNT = "{arch}.decoder.block_count"
        DECODER_HEAD_COUNT = "{arch}.decoder.attention.head_count"
        # Not in the spec; the fc1/fc2 widths, named like [llm].feed_forward_length.
        ENCODER_FEED_FORWARD_LENGTH = "{arch}.encoder.feed_forward_length"
        DECODER_FEED_FORWARD_LENGTH = "{arch}.decoder.feed_forward_length"

    class Tokenizer:
        MODEL = "tokenizer.ggml.model"
        PRE = "tokenizer.ggml.pre"
        TOKENS = "tokenizer.ggml.tokens"
        TOKEN_TYPE = "tokenizer.ggml.token_type"
        TOKEN_TYPE_COUNT = "tokenizer.ggml.token_type_count"
        SCORES = "tokenizer.ggml.scores"
        MERGES = "tokenizer.ggml.merges"
        ADDED_TOKENS = "tokenizer.ggml.added_tokens"
        BOS_ID = "tokenizer.ggml.bos_token_id"
        EOS_ID = "tokenizer.ggml.eos_token_id"
        EOT_ID = "tokenizer.ggml.eot_token_id"
        EOM_ID = "tokenizer.ggml.eom_token_id"
        UNK_ID = "tokenizer.ggml.unknown_token_id"
        # llama.cpp: reads the misspelled "seperator"; the spec's "separator" is ignored by it.
        SEP_ID = "tokenizer.ggml.seperator_token_id"
        PAD_ID = "tokenizer.ggml.padding_token_id"
        MASK_ID = "tokenizer.ggml.mask_token_id"
        CLS_ID = "tokenizer.ggml.cls_token_id"
        FIM_PRE_ID = "tokenizer.ggml.fim_pre_token_id"
        FIM_SUF_ID = "tokenizer.ggml.fim_suf_token_id"
        FIM_MID_ID = "tokenizer.ggml.fim_mid_token_id"
        FIM_PAD_ID = "tokenizer.ggml.fim_pad_token_id"
        FIM_REP_ID = "tokenizer.ggml.fim_rep_token_id"
        FIM_SEP_ID = "tokenizer.ggml.fim_sep_token_id"
        ADD_BOS = "tokenizer.ggml.add_bos_token"
        ADD_EOS = "tokenizer.ggml.add_eos_token"
        ADD_SEP = "tokenizer.ggml.add_sep_token"
        # WordPiece (tokenizer.ggml.model "bert"): BertNormalizer's options; llama.cpp defaults both
        # to true, and strip_accents to the value of lowercase when only lowercase is given.
        NORMALIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
        NORMALIZER_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"
        ADD_PREFIX = "tokenizer.ggml.add_space_prefix"
        REMOVE_EXTRA_WS = "tokenizer.ggml.remove_extra_whitespaces"
        PRECOMPILED_CHARSMAP = "tokenizer.ggml.precompiled_charsmap"
        HF_JSON = "tokenizer.huggingface.json"
        RWKV_WORLD = "tokenizer.rwkv.world"
        CHAT_TEMPLATE = "tokenizer.chat_template"
        CHAT_TEMPLATE_NAMED = "tokenizer.chat_template.{name}"
        CHAT_TEMPLATES = "tokenizer.chat_templates"

    class Adapter:
        """Keys of a LoRA adapter file (general.type = "adapter"), as llama.cpp's llama_adapter_lora reads them."""
        TYPE = "adapter.type"  # "lora"
        LORA_ALPHA = "adapter.lora.alpha"  # float32; llama.cpp scales each pair by alpha / its rank
        LORA_TASK_NAME = "adapter.lora.task_name"  # one task adapter of a multi-task model (jina-embeddings-v3)
        LORA_PROMPT_PREFIX = "adapter.lora.prompt_prefix"  # the instruction the task's texts are prefixed with

    class Split:
        NO = "split.no"
        COUNT = "split.count"
        TENSORS_COUNT = "split.tensors.count"

    class Imatrix:
        CHUNK_COUNT = "imatrix.chunk_count"
        CHUNK_SIZE = "imatrix.chunk_size"
        DATASETS = "imatrix.datasets"


def arch_key(template: str, arch: str) -> str:
    """Fill the architecture into a key template such as Keys.LLM.CONTEXT_LENGTH."""
    return template.format(arch=arch)


# Keys llama.cpp reads as one value per block when they are arrays (get_key_or_arr and get_arr with
# block_count entries, src/llama-model.cpp and src/models/*.cpp of llama.cpp 0.3.36): an array whose
# length is not block_count makes the model fail to load, so --prune-layers drops pruned blocks' entries.
PER_LAYER_KEYS = (
    Keys.LLM.FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_USED_COUNT,
    Keys.LLM.SWIGLU_CLAMP_EXP, Keys.LLM.SWIGLU_CLAMP_SHEXP,
    Keys.Attention.HEAD_COUNT, Keys.Attention.HEAD_COUNT_KV, Keys.Attention.SLIDING_WINDOW_PATTERN,
    Keys.Attention.RECURRENT_LAYERS, Keys.Attention.ROPE_PATTERN, Keys.Attention.INDEXER_TYPES,
    Keys.XIELU.ALPHA_N, Keys.XIELU.ALPHA_P, Keys.XIELU.BETA, Keys.XIELU.EPS,
)
