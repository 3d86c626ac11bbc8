"""The configurations the articles use, by name (SPEC.md §2)."""

from __future__ import annotations

from sptrace.vocab.shape import ShapeValues


class Preset(ShapeValues, total=False):
    """A preset's ModelShape fields, and whether its cost model counts attention only."""

    attention_only: bool


PRESETS: dict[str, Preset] = {
    # the first article's attention example: P=8, B=1, S=32K, H=4096, 32 heads of 128, bf16
    "seed-attention": {
        "sp_size": 8, "batch": 1, "seq": 32768, "hidden": 4096, "heads": 32, "kv_heads": 32,
        "ffn": 16384, "layers": 1, "dtype": "bfloat16", "attention_only": True,
    },
    # its benchmark model: 8 layers, H=6144, 48 heads of 128, F=24576 (3.62e9 parameters), 256K
    "seed-3.6b": {
        "sp_size": 8, "batch": 1, "seq": 262144, "hidden": 6144, "heads": 48, "kv_heads": 48,
        "ffn": 24576, "layers": 8, "dtype": "bfloat16", "attention_only": False,
    },
}  # fmt: skip
