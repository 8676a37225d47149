"""Compute an importance matrix the way llama.cpp's `llama-imatrix` does, with transformers.

`llama-imatrix` (tools/imatrix/imatrix.cpp) runs the model over calibration text and, for every
matrix multiplication whose weight is a `blk.*` tensor, adds the squares of the activations that
enter the weight (one sum per input column, i.e. per element of the GGUF tensor's ne0) and counts
the activation rows (tokens). For MoE expert tensors the sums and counts are kept per expert, over
the tokens routed to that expert only. The text is tokenized once (BOS in front when the vocabulary
adds one), cut into consecutive chunks of `chunk_size` tokens (the remainder is dropped), the first
token of every chunk is replaced by BOS, and each chunk is evaluated on its own from an empty
context; every token of a chunk counts. `output.weight` is skipped unless asked for
(--process-output), as in llama-imatrix.

Here the same statistics come from forward pre-hooks on the transformers model in float32: on every
module holding a 2-D `weight` (nn.Linear, MoE routers, GPT-2's transposed Conv1D) and on fused
expert modules (3-D `gate_up_proj` / `down_proj`). The hooked parameter's checkpoint name is found
with transformers' own key renaming (transformers >= 5 renames and fuses some checkpoint tensors on
load), and its GGUF name with the architecture plugin's tensor table, so the names are those the
converter writes. The activation width is checked against ne0 of the GGUF tensor, which is the
input dimension whatever the checkpoint layout (rotary permutations reorder rows, not columns).

Multi-head latent attention (DeepSeek V2/V3: kv_b_proj split into attn_k_b and attn_v_b) is the one
place where llama.cpp's graph multiplies other activations than the checkpoint's: it moves the
queries into the latent space instead of expanding the keys. attn_k_b (n_head matrices) gets each
head's unrotated query part, attn_v_b each head's attention output over the normed latent, and
llama-imatrix keeps per-head sums with one token count, as for any 3-D weight of a plain MUL_MAT.
The attention probabilities that output needs come from transformers' eager attention, so such a
model is run with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufsmith.converters.workers import resolve_workers
from ggufsmith.errors import ConversionError

DEFAULT_CHUNK_SIZE = 512


@dataclass
class _Target:
    """One GGUF weight whose input activations are collected."""

    gguf_name: str
    row_length: int  # ne0 of the GGUF tensor: the input features
    n_matrices: int  # experts stacked in the tensor, else 1
    expert: int | None  # the expert this checkpoint tensor is, for per-expert checkpoint tensors


@dataclass
class Accumulator:
    """Sums of squared activations and row counts per GGUF weight, as llama-imatrix keeps them."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)  # (n_matrices, row_length) float64
    counts: dict[str, np.ndarray] = field(default_factory=dict)  # (n_matrices,) int64

    def add(self, target: _Target, matrix: int, rows):
        """Add the activation rows (torch, (n, row_length)) entering matrix `matrix` of `target`."""
        self._check_width(target, rows)
        self._start(target, target.n_matrices)
        rows = rows.reshape(-1, target.row_length)
        if rows.shape[0] == 0:
            return
        self.sums[target.gguf_name][matrix] += self._squares(target, rows)
        self.counts[target.gguf_name][matrix] += rows.shape[0]

    def add_per_matrix(self, target: _Target, rows):
        """Add activations (torch, (n, n_matrices, row_length)) entering each matrix of a 3-D weight
        that every row passes through (attention heads, not routed experts): per-matrix sums, one
        count of n, as llama-imatrix keeps for a 3-D weight of a plain MUL_MAT."""
        self._check_width(target, rows)
        self._start(target, 1)
        rows = rows.reshape(-1, target.n_matrices, target.row_length)
        self.sums[target.gguf_name] += self._squares(target, rows)
        self.counts[target.gguf_name][0] += rows.shape[0]

    @staticmethod
    def _check_width(target: _Target, rows) -> None:
        if rows.shape[-1] != target.row_length:
            raise ConversionError(
                f"{target.gguf_name}: the model feeds it {rows.shape[-1]} input features, the GGUF tensor has "
                f"{target.row_length} columns; this architecture's layout is not supported by ggufsmith imatrix"
            )

    def _start(self, target: _Target, n_counts: int) -> None:
        if target.gguf_name not in self.sums:
            self.sums[target.gguf_name] = np.zeros((target.n_matrices, target.row_length), dtype=np.float64)
            self.counts[target.gguf_name] = np.zeros(n_counts, dtype=np.int64)

    @staticmethod
    def _squares(target: _Target, rows) -> np.ndarray:
        squares = rows.double().square().sum(dim=0).numpy()
        if not np.all(np.isfinite(squares)):
            raise ConversionError(f"{target.gguf_name}: non-finite activations; the model or the text gives inf/NaN")
        return squares

    def entries(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """name -> (sums float32[nmat * ne0], counts float32[nmat]): write_imatrix's input."""
        return {
            name: (self.sums[name].astype(np.float32).reshape(-1), self.counts[name].astype(np.float32))
            for name in sorted(self.sums)
        }


@dataclass
class ImatrixResult:
    accumulator: Accumulator
    chunk_count: int
    chunk_size: int
    n_tokens: int  # of the whole tokenized text
    not_collected: list[str]  # blk.* matrices of the GGUF the model never fed (e.g. unused experts' tensors)

    def entries(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return self.accumulator.entries()


def tokenize_calibration(tokenizer, text: str) -> tuple[list[int], int | None]:
    """The text's token ids and the BOS id to put in front of each chunk (None: the vocabulary adds none).

    Special-token text in the file stays plain text, as llama-imatrix tokenizes it (parse_special off)."""
    try:
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    except TypeError:  # tokenizers without split_special_tokens
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos]
    if adds_bos:
        ids = [bos, *ids]  # llama.cpp's tokenizer adds BOS to the whole text too
    return list(ids), bos if adds_bos else None


def split_chunks(ids: list[int], chunk_size: int, bos: int | None, max_chunks: int | None) -> list[list[int]]:
    """Consecutive chunks of `chunk_size` tokens, the rest dropped, BOS replacing each chunk's first token."""
    if chunk_size < 1:
        raise ConversionError(f"--chunk-size must be at least 1, got {chunk_size}")
    if max_chunks is not None and max_chunks < 1:
        raise ConversionError(f"--max-chunks must be at least 1, got {max_chunks}")
    n_chunks = len(ids) // chunk_size
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1:
        raise ConversionError(
            f"the calibration text has {len(ids)} tokens, fewer than one chunk of {chunk_size}; "
            "give more text or a smaller --chunk-size"
        )
    chunks = []
    for i in range(n_chunks):
        chunk = list(ids[i * chunk_size:(i + 1) * chunk_size])
        if bos is not None:
            chunk[0] = bos
        chunks.append(chunk)
    return chunks


def gguf_weight_table(model_dir: Path, arch=None) -> tuple[dict[str, list[_Target]], dict[str, tuple[int, ...]]]:
    """checkpoint tensor name -> its GGUF target(s), and the shapes of all GGUF matrices, from the plugin."""
    from ggufsmith.readers.checkpoint import open_checkpoint
    from ggufsmith.converters.pipeline import resolve_architecture

    with open_checkpoint(model_dir) as checkpoint:
        plugin = resolve_architecture(checkpoint, arch)
        mapped = plugin.map_tensors(checkpoint.tensors)
    table: dict[str, list[_Target]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for m in mapped:
        shape = tuple(int(s) for s in m.tensor.shape)
        if len(shape) < 2:
            continue  # norms and biases take no importance
        shapes[m.name] = shape
        stacked = len(shape) == 3
        for index, source in enumerate(m.sources):
            table.setdefault(source, []).append(
                _Target(m.name, shape[-1], shape[0] if stacked else 1, index if stacked else None)
            )
    return table, shapes


def _runtime_names(model, checkpoint_names) -> dict[str, list[str]]:
    """Parameter name in the loaded model -> the checkpoint tensors it is made of (transformers >= 5
    renames keys and fuses experts on load; older versions load names unchanged)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key
    except ImportError:
        return {name: [name] for name in checkpoint_names}
    transforms = get_model_conversion_mapping(model)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    params = dict(model.named_parameters())
    prefix = getattr(model, "base_model_prefix", None)
    runtime: dict[str, list[str]] = {}
    for name in checkpoint_names:
        key, _ = rename_source_key(name, renamings, converters, prefix, params)
        runtime.setdefault(key, []).append(name)
    return runtime


def _first_tensor(args, kwargs, *names):
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[0] if args else None


def _install_hooks(model, table, runtime, accumulator: Accumulator, process_output: bool) -> list:
    import torch

    def wanted(target: _Target) -> bool:
        return target.gguf_name.startswith("blk.") or (process_output and target.gguf_name == "output.weight")

    def targets_of(param_name: str) -> list[tuple[str, _Target]]:
        found = []
        for source in runtime.get(param_name, ()):
            found.extend((source, t) for t in table.get(source, ()) if wanted(t))
        return found

    handles = []
    latent_split = set()  # GGUF names of MLA's attn_k_b / attn_v_b, collected by _latent_attention_hooks
    for module_name, module in model.named_modules():
        if getattr(module, "kv_b_proj", None) is None:
            continue
        # {"attn_k_b": target, "attn_v_b": target} when the plugin splits this kv_b_proj for MLA
        split = {t.gguf_name.rsplit(".", 2)[-2]: t for _, t in targets_of(f"{module_name}.kv_b_proj.weight")
                 if t.gguf_name.endswith((".attn_k_b.weight", ".attn_v_b.weight"))}
        if split:
            handles.extend(_latent_attention_hooks(module, split.get("attn_k_b"), split.get("attn_v_b"), accumulator))
            latent_split.update(t.gguf_name for t in split.values())
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        own = dict(module.named_parameters(recurse=False))
        weight = own.get("weight")
        if weight is not None and weight.dim() == 2 and targets_of(prefix + "weight"):
            targets = [t for _, t in targets_of(prefix + "weight") if t.gguf_name not in latent_split]
            if not targets:
                continue

            def dense_hook(mod, args, kwargs, targets=targets):
                x = _first_tensor(args, kwargs, "input", "hidden_states", "x")
                if x is None or not torch.is_floating_point(x):
                    return  # embeddings: token ids, not activations
                for t in targets:
                    accumulator.add(t, t.expert or 0, x.detach().reshape(-1, x.shape[-1]))

            handles.append(module.register_forward_pre_hook(dense_hook, with_kwargs=True))
        elif "gate_up_proj" in own and "down_proj" in own and own["gate_up_proj"].dim() == 3:
            # One target per GGUF tensor: the fused parameter holds every expert's checkpoint tensor.
            gate_up = list({t.gguf_name: t for _, t in targets_of(prefix + "gate_up_proj")}.values())
            down = list({t.gguf_name: t for _, t in targets_of(prefix + "down_proj")}.values())
            if not gate_up and not down:
                continue
            handles.append(module.register_forward_pre_hook(_expert_hook(module, gate_up, down, accumulator), with_kwargs=True))
    return handles


def _latent_attention_hooks(attention, k_b: _Target | None, v_b: _Target | None, accumulator: Accumulator) -> list:
    """llama.cpp's inputs of MLA's attn_k_b and attn_v_b on a DeepSeek-style attention module
    (transformers' DeepseekV2/V3Attention): attn_k_b, per head, the query's first qk_nope_head_dim
    values (the unrotated part, which llama.cpp multiplies into the latent space); attn_v_b, per head,
    softmax(scores) x the normed latent (kv_b_proj's input), which llama.cpp multiplies back out to
    the head's values."""
    import torch

    n_head, head_dim, nope = attention.num_heads, attention.qk_head_dim, attention.qk_nope_head_dim
    query = attention.q_b_proj if attention.q_b_proj is not None else attention.q_proj
    latent = []
    handles = []

    def query_hook(mod, args, output):
        accumulator.add_per_matrix(k_b, output.detach().reshape(-1, n_head, head_dim)[..., :nope])

    def latent_hook(mod, args):
        latent.append(args[0].detach())  # (batch, 1, tokens, kv_lora_rank)

    def attention_hook(mod, args, kwargs, output):
        probabilities = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if probabilities is None or not latent:
            raise ConversionError(f"{type(mod).__name__}: no attention probabilities; ggufsmith imatrix needs "
                                  "transformers' eager attention for multi-head latent attention")
        mixed = torch.matmul(probabilities.detach(), latent.pop())  # (batch, heads, tokens, kv_lora_rank)
        accumulator.add_per_matrix(v_b, mixed.transpose(1, 2))

    if k_b is not None:
        handles.append(query.register_forward_hook(query_hook))
    if v_b is not None:
        handles.append(attention.kv_b_proj.register_forward_pre_hook(latent_hook))
        handles.append(attention.register_forward_hook(attention_hook, with_kwargs=True))
    return handles


def _expert_hook(module, gate_up_targets, down_targets, accumulator: Accumulator) -> Callable:
    """Per-expert statistics of a fused experts module called as experts(hidden, top_k_index, weights):
    the gate and up matrices of expert e see the hidden states of the tokens routed to e; its down
    matrix sees the gated activation of those tokens (before the routing weight, as in llama.cpp's
    graph), computed as the module computes it: its stacks (experts, out, in), or (experts, in, out)
    where transformers marks them `is_transposed` (gpt-oss), its biases (`has_bias`) and its own
    gate (`_apply_gate`: gpt-oss' clamped SwiGLU on interleaved gate/up; else act(gate) * up)."""
    import torch

    def hook(mod, args, kwargs):
        hidden = _first_tensor(args, kwargs, "hidden_states")
        top_k_index = kwargs.get("top_k_index", args[1] if len(args) > 1 else None)
        if hidden is None or top_k_index is None:
            raise ConversionError(f"{type(mod).__name__}: unexpected call signature; ggufsmith imatrix cannot read its routing")
        hidden = hidden.detach().reshape(-1, hidden.shape[-1])
        gate_up_proj = mod.gate_up_proj
        transposed = bool(getattr(mod, "is_transposed", False))
        if gate_up_proj.shape[-2 if transposed else -1] != hidden.shape[-1]:
            layout = "(experts, hidden, 2*ff)" if transposed else "(experts, 2*ff, hidden)"
            raise ConversionError(
                f"{type(mod).__name__}: gate_up_proj of shape {tuple(gate_up_proj.shape)} is not {layout}; "
                "this expert layout is not supported by ggufsmith imatrix"
            )
        routing = top_k_index.reshape(hidden.shape[0], -1)
        for expert in range(gate_up_proj.shape[0]):
            tokens = (routing == expert).any(dim=-1).nonzero().flatten()
            rows = hidden[tokens]
            for t in gate_up_targets:
                accumulator.add(t, expert, rows)
            if down_targets:
                weight = gate_up_proj[expert]
                gate_up = rows @ weight if transposed else torch.nn.functional.linear(rows, weight)
                if getattr(mod, "has_bias", False):
                    gate_up = gate_up + mod.gate_up_proj_bias[expert]
                if hasattr(mod, "_apply_gate"):
                    inner = mod._apply_gate(gate_up)
                else:
                    gate, up = gate_up.chunk(2, dim=-1)
                    inner = mod.act_fn(gate) * up
                for t in down_targets:
                    accumulator.add(t, expert, inner)

    return hook


def compute_imatrix(
    model_dir: str | os.PathLike,
    text: str,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    max_chunks: int | None = None,
    process_output: bool = False,
    arch=None,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
) -> ImatrixResult:
    """Run the HF model in `model_dir` over `text` and collect llama-imatrix's statistics, with
    torch on `threads` threads (default: every core this process may use)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise ConversionError(f"ggufsmith imatrix runs the model with torch and transformers ({e}); pip install torch transformers") from e

    workers = resolve_workers(threads)
    model_dir = Path(model_dir)
    table, shapes = gguf_weight_table(model_dir, arch)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids, bos = tokenize_calibration(tokenizer, text)
    chunks = split_chunks(ids, chunk_size, bos, max_chunks)

    # MLA's attn_v_b statistics need the attention probabilities, which only eager attention returns.
    latent_attention = any(name.endswith(".attn_v_b.weight") for name in shapes)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 **({"attn_implementation": "eager"} if latent_attention else {})).eval()
    runtime = _runtime_names(model, table)
    accumulator = Accumulator()
    handles = _install_hooks(model, table, runtime, accumulator, process_output)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(workers)
    try:
        with torch.inference_mode():
            for i, chunk in enumerate(chunks):
                model(torch.tensor([chunk]), use_cache=False)  # each chunk from an empty context
                if progress:
                    progress(i + 1, len(chunks))
    finally:
        torch.set_num_threads(torch_threads)
        for h in handles:
            h.remove()
    expected = {n for n in shapes if n.startswith("blk.") or (process_output and n == "output.weight")}
    return ImatrixResult(accumulator, len(chunks), chunk_size, len(ids), sorted(expected - set(accumulator.sums)))


def write_computed_imatrix(result: ImatrixResult, path: str | os.PathLike, dataset: str, *,
                           inputs: Iterable[str | os.PathLike] = (), force: bool = False) -> Path:
    from ggufsmith.quantize.imatrix import write_imatrix

    return write_imatrix(path, result.entries(), [dataset], result.chunk_count, result.chunk_size, inputs=inputs, force=force)
