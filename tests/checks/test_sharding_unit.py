"""Classification of saved tensors, and sptrace.assert_sequence_sharded on plain models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sptrace
from sptrace.checks.sharding import ShardingShape, classify

STEP = ShardingShape(batch=2, seq=128, hidden=96, sp_size=8, element_size=4)  # the reference default


@pytest.mark.parametrize(
    "shape, cls",
    [
        ((2, 128, 96), "full"),  # [B, S, H]
        ((128, 2, 96), "full"),  # sequence-first
        ((256, 96), "full"),  # flattened tokens, as a matmul saves it
        ((2, 128, 160), "full"),  # [B, S, F]: a full MLP activation
        ((2, 16, 96), "seq-sharded"),  # [B, S/P, H]
        ((32, 96), "seq-sharded"),
        ((2, 16, 1), "seq-sharded"),  # norm statistics
        ((2, 128, 20), "head-sharded"),  # [B, S, F/P]
        ((2, 2, 128, 6), "head-sharded"),  # [B, a/P, S, d]
        ((2, 128, 12), "head-sharded"),  # [B, S, a*d/P]
        ((2, 2, 128, 128), "head-sharded"),  # attention scores
        ((96, 96), "other"),  # a weight
    ],
)
def test_classify_by_shape(shape, cls):
    n = 4
    for d in shape:
        n *= d
    assert classify(shape, n, n, STEP)[0] == cls


def test_views_and_sizes():
    # a [B, S/P, F] view whose storage is the whole [B, S, F]: the storage is what is kept
    assert classify((2, 16, 160), 20480, 163840, STEP) == (
        "full", "a view of 20480 bytes keeping a 163840-byte storage alive"
    )  # fmt: skip
    assert classify(None, 98304, 98304, STEP)[0] == "full"
    assert classify(None, 12288, 12288, STEP)[0] == "seq-sharded"
    assert classify(None, 5000, 5000, STEP)[0] == "unknown"


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 32)

    def forward(self, x):  # x: [B, S/P, H]
        return self.fc(self.norm(x)).relu()


class Gathering(nn.Module):
    """Gathers the sequence (simulated by a repeat) and lets a linear save the full input."""

    def __init__(self, sp: int) -> None:
        super().__init__()
        self.sp = sp
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        full = x.repeat(1, self.sp, 1)  # [B, S, H]
        return self.fc(full.relu())[:, : x.shape[1]]


def test_assert_sequence_sharded_passes_and_fails():
    x = torch.randn(2, 8, 16)
    saved = sptrace.assert_sequence_sharded(Clean(), x, sp_size=4)
    # the norm saves x (an input), fc the norm's output, the root's relu its result
    assert {r.module for r in saved} == {"norm", "fc", "<root>"}
    assert all(8 in r.shape or 2 * 8 in r.shape for r in saved)
    with pytest.raises(sptrace.ShardingViolation) as err:
        sptrace.assert_sequence_sharded(Gathering(4), x, sp_size=4)
    (rec, _why), *_ = err.value.records
    assert rec.module == "fc" and rec.shape == (64, 16) and rec.nbytes == 64 * 16 * 4
    assert "fc saves [64, 16] float32" in str(err.value)
    assert sptrace.assert_sequence_sharded(Gathering(4), x, sp_size=4, allow=("fc",))
    # sequence-first layout
    sptrace.assert_sequence_sharded(Clean(), x.transpose(0, 1).contiguous(), sp_size=4, seq_dim=0)


def test_assert_sequence_sharded_leaves_the_model_clean():
    model = Clean()
    sptrace.assert_sequence_sharded(model, torch.randn(1, 4, 16), sp_size=2)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
