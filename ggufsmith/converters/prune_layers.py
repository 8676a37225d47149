"""llama-quantize's `--prune-layers L0,L1,...`: leave whole blocks out of the quantized model.

What llama.cpp's quantizer does (src/llama-quant.cpp), and so what we do:
- every tensor of a pruned block (a name containing `blk.N.`) is left out;
- the blocks kept are renumbered in order, 0, 1, 2, ... (`blk.5.attn_q.weight` becomes
  `blk.4.attn_q.weight` when block 3 is pruned), the tensors keep their order;
- `{arch}.block_count` is set to the number of blocks kept, after every other key is set (so it
  moves to the end of the metadata, as gguf_set_val_u32 moves a key it sets);
- the importance matrix entry of a renamed tensor is the one of its original name;
- the type rules see the model as llama.cpp loads it from the input: the original block count
  (ffn_down's "first eighth of the layers") with the pruned model's tensors (the i-th attn_v).

One deliberate difference: per-layer arrays (constants.PER_LAYER_KEYS, e.g. a per-block
head_count_kv or sliding_window_pattern) lose the pruned blocks' entries. llama.cpp 0.3.36 leaves
them whole, and its own loader then refuses the file ("wrong array length"); with ours the pruned
model loads. Files without such arrays are byte for byte llama-quantize's.

We also refuse what llama-quantize silently accepts: a block number the model does not have (it is
ignored there) and pruning every block (a model without layers).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from ggufsmith.constants import PER_LAYER_KEYS, GGUFValueType, Keys, arch_key
from ggufsmith.errors import QuantizationError
from ggufsmith.gguf_writer.metadata import Metadata

_BLOCK = re.compile(r"blk\.(\d+)\.")


def parse_prune_layers(text: str) -> list[int]:
    """`--prune-layers 3,5,7`: block numbers, as llama-quantize parses them (sorted, each once)."""
    ids = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            value = -1
        if value < 0:
            raise QuantizationError(f"{text!r}: {part!r} is not a block number (expected e.g. 20,21,22)")
        ids.append(value)
    return sorted(set(ids))


class LayerPruning:
    """Which blocks go, and the new number of each block kept, for a model of `n_layer` blocks."""

    def __init__(self, pruned: Iterable[int], n_layer: int) -> None:
        self.pruned = sorted(set(pruned))
        self.n_layer = n_layer
        outside = [i for i in self.pruned if not 0 <= i < n_layer]
        if outside:
            raise QuantizationError(
                f"--prune-layers {','.join(map(str, outside))}: the model has blocks 0 to {n_layer - 1} (block_count {n_layer})"
            )
        if len(self.pruned) >= n_layer:
            raise QuantizationError(f"--prune-layers would remove all {n_layer} blocks of the model; keep at least one")
        kept = [i for i in range(n_layer) if i not in self.pruned]
        self.new_number = {old: new for new, old in enumerate(kept)}

    @property
    def n_kept(self) -> int:
        return len(self.new_number)

    def rename(self, name: str) -> str | None:
        """The tensor's name in the pruned model, or None if its block is pruned."""
        m = _BLOCK.search(name)
        if m is None:
            return name
        block = int(m.group(1))
        if block in self.pruned:
            return None
        if block not in self.new_number:  # a block past block_count: llama.cpp would renumber it in turn
            raise QuantizationError(f"tensor {name}: block {block} is past the model's block_count {self.n_layer}; "
                                    "cannot renumber it for --prune-layers")
        return f"{name[:m.start(1)]}{self.new_number[block]}{name[m.end(1):]}"

    def apply_to_metadata(self, metadata: Metadata, arch: str) -> None:
        """Per-layer arrays lose the pruned blocks' entries (in place); block_count is set (moved last)."""
        keep = [i for i in range(self.n_layer) if i not in self.pruned]
        for template in PER_LAYER_KEYS:
            key = arch_key(template, arch)
            item = metadata[key] if key in metadata else None
            if item is None or item.type != GGUFValueType.ARRAY or len(item.value) != self.n_layer:
                continue
            values = item.value[keep] if isinstance(item.value, np.ndarray) else [item.value[i] for i in keep]
            metadata.replace(key, values, GGUFValueType.ARRAY, item.element_type)
        key = arch_key(Keys.LLM.BLOCK_COUNT, arch)
        if key in metadata:
            metadata.remove(key)
        metadata.add(key, self.n_kept, GGUFValueType.UINT32)
