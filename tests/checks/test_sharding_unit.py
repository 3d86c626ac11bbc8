"""Classification of saved tensors, and sptrace.assert_sequence_sharded on plain models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sptrace
from sptrace.checks.sharding import Judge, classify
from sptrace.vocab.shape import ModelShape

# the reference default: B=2, S=128, H=96, P=8, a=16, g=8 (d=6), F=160, fp32
MODEL = ModelShape(batch=2, seq=128, hidden=96, sp_size=8, heads=16, kv_heads=8, ffn=160, dtype="float32")
BARE = ModelShape(batch=2, seq=128, hidden=96, sp_size=8, dtype="float32")  # what a user without flags declares


def _bytes(shape):
    n = 4
    for d in shape:
        n *= d
    return n


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
        ((2, 128, 16, 6), "full"),  # [B, S, a, d]: every head over the full sequence
        ((2, 128, 8, 6), "full"),  # [B, S, g, d]: every kv head (GQA), not a 1/P share
        ((2, 128, 12), "head-sharded"),  # [B, S, a*d/P]
        ((2, 2, 128, 128), "head-sharded"),  # attention scores of a/P heads
        ((2, 16, 128, 128), "full"),  # attention scores of all a heads
        ((2, 2, 16, 128), "seq-sharded"),  # a query shard's scores against the whole sequence (ring)
        ((96, 96), "other"),  # a weight
        # DeepSpeed-Ulysses' all-to-all buffers: the sequence as P chunks of S/P on two axes
        ((8, 16, 2, 2, 6), "head-sharded"),  # [P, S/P, B, a/P, d]: whole sequence, a/P heads
        ((8, 2, 16, 2, 6), "head-sharded"),  # [P, B, S/P, a/P, d] (batch-first, permuted)
        ((8, 16, 2, 16, 6), "full"),  # [P, S/P, B, a, d]: whole sequence, every head
        ((2, 8, 16, 16, 6), "full"),  # [B, P, S/P, a, d]
        ((16, 2, 8, 2, 6), "seq-sharded"),  # [S/P, B, P, a/P, d]: this rank's tokens, heads in P groups
    ],
)
def test_classify_by_shape(shape, cls):
    assert classify(shape, _bytes(shape), None, MODEL)[0] == cls


def test_scores_need_the_head_count():
    # GIVEN a run that does not declare its heads, WHEN attention scores are judged, THEN they are
    # ambiguous (a/P or a heads cannot be told apart), never "full sequence twice, so sharded"
    cls, why = classify((2, 2, 128, 128), _bytes((2, 2, 128, 128)), None, BARE)
    assert cls == "ambiguous" and "--heads" in why


def test_4h_ffn_at_p4_is_decided_by_the_op_that_made_it_never_by_names():
    """F = 4H at P = 4: a [B, S, F/P] shard has the shape of a full [B, S, H] activation. Module
    and op names are no evidence; declaring F never makes a full tensor pass; the op that made
    the tensor (its origin) decides."""
    p4 = ModelShape(batch=2, seq=64, hidden=32, sp_size=4, dtype="float32")
    shape, n = (2, 64, 32), _bytes((2, 64, 32))
    for module in ("layers.0.mlp.act", "layers.0.attn", "layers.0.norm"):
        cls, why = classify(shape, n, None, p4, module=module)
        # F undeclared, no op shown: all S tokens, H wide, is full (a shard needs positive evidence)
        assert cls == "full" and "no shard is that wide" in why, module
    # a square [H, H] weight in the trace is no evidence of a shard (a replicated projection has one)
    assert Judge(p4, weights={32: "the [32x32] weight aten::linear took"}).classify(shape, n)[0] == "full"
    # a [B, S, 3H] tensor where the trace's weights make 3H-wide products: a shard or not, the op tells
    wide = (2, 64, 96)
    cls, why = Judge(p4, weights={96: "the [96x32] weight aten::linear took"}).classify(wide, _bytes(wide))
    assert cls == "ambiguous" and "[96x32] weight" in why and "read off the trace" in why and "--ffn" not in why
    assert Judge(p4).classify(wide, _bytes(wide))[0] == "full"  # no weight that wide: full
    with_ffn = p4.override("flags", ffn=128)  # F/P == H, declared: both readings stay open
    for module in ("layers.0.mlp.act", "layers.0.norm"):
        assert classify(shape, n, None, with_ffn, module=module)[0] == "ambiguous"
    judge = Judge(with_ffn)
    # a tensor an all-gather produced is the gathered sequence, whatever its width collides with
    assert judge.classify(shape, n, None, "layers.0.mlp.fc1", "c10d::_allgather_base_")[0] == "full"
    # a column-parallel product (this rank's [H, F/P] weight) is the shard
    assert judge.classify(shape, n, None, "layers.0.mlp.act", None, "column", "a column-parallel product")[0] == (
        "head-sharded")  # fmt: skip
    # F known and F/P != H: no collision, a [B, S, H] tensor is full wherever it is
    assert classify(shape, n, None, p4.override("flags", ffn=96), module="layers.0.norm")[0] == "full"


def test_element_count_before_dims():
    """A gathered tensor in rank-major layout [P*B, S/P, H] holds B*S*H elements: the whole
    sequence, though one dim equals S/P (selective checkpointing saving all_gather_into_tensor's
    output); a full activation laid out [B, H, S], [H, B*S] or flat is never 'other'."""
    m = ModelShape(batch=2, seq=256, hidden=64, sp_size=8, dtype="float32")
    judge = Judge(m)
    rank_major = (16, 32, 64)
    assert classify(rank_major, _bytes(rank_major), None, m)[0] != "full"  # dims alone read [B*h, S/P, d]
    cls, why = judge.classify(rank_major, _bytes(rank_major), None, None, "_c10d_functional::all_gather_into_tensor")
    assert cls == "full" and "whatever its dims read" in why and "gathered full sequence" in why
    for shape in ((2, 64, 256), (64, 512), (2 * 256 * 64,)):
        cls, _ = classify(shape, _bytes(shape), None, m)
        assert cls in ("full", "ambiguous"), shape  # never other: it holds B*S*H elements
    assert classify((48, 48), _bytes((48, 48)), None, m)[0] == "other"  # fewer than B*S*H: a weight


def test_views_and_sizes():
    # a [B, S/P, F] view whose storage is the whole [B, S, F]: the storage is what is kept
    assert classify((2, 16, 160), 20480, 163840, MODEL) == (
        "full", "a view of 20480 bytes keeping a 163840-byte storage alive"
    )  # fmt: skip
    assert classify(None, 98304, 98304, MODEL)[0] == "full"
    for module in ("layers.0.norm", "layers.0.mlp"):  # F unknown and no weight that wide: full by its size
        assert classify(None, 98304, 98304, BARE, module=module)[0] == "full"
    # a weight of the trace makes [B, S, 96 * 4 / 4]-byte products: a shard may have its size
    assert Judge(BARE, weights={384: "the [384x96] weight aten::linear took"}).classify(None, 393216)[0] == (
        "ambiguous")  # fmt: skip
    assert classify(None, 12288, 12288, MODEL)[0] == "seq-sharded"
    assert classify(None, 5000, 5000, MODEL)[0] == "other"  # fewer bytes than B*S*H 16-bit elements
    assert classify(None, 8, 8, MODEL)[0] == "other"  # smaller than one token: a scalar


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
    # all S tokens, H wide, and no weight of the model makes a shard that wide: full, F declared or not
    with pytest.raises(sptrace.ShardingViolation):
        sptrace.assert_sequence_sharded(Gathering(4), x, sp_size=4)
    with pytest.raises(sptrace.ShardingViolation) as err:
        sptrace.assert_sequence_sharded(Gathering(4), x, sp_size=4, ffn=24)
    (rec, _why), *_ = err.value.records
    assert rec.module == "fc" and rec.shape == (64, 16) and rec.nbytes == 64 * 16 * 4
    assert "fc saves [64, 16] float32" in str(err.value)
    assert sptrace.assert_sequence_sharded(Gathering(4), x, sp_size=4, ffn=24, allow=("fc",))
    # sequence-first layout
    sptrace.assert_sequence_sharded(Clean(), x.transpose(0, 1).contiguous(), sp_size=4, seq_dim=0)


def test_assert_sequence_sharded_leaves_the_model_clean():
    model = Clean()
    sptrace.assert_sequence_sharded(model, torch.randn(1, 4, 16), sp_size=2)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _retained(shapes_seen, tensors):
    import pandas as pd

    from sptrace.detect.allocations import RETAINED_COLUMNS, Retention

    frame = pd.DataFrame(
        [{"rank": 0, "module": "layers.0.attn", "layer": 0, "shape": s, "nbytes": n, "storage_bytes": n,
          "holder": "autograd", "kind": "activation", "unseen_free": False} for s, n in tensors],
        columns=RETAINED_COLUMNS,
    )  # fmt: skip
    return Retention(rank=0, tensors=frame, boundary_ns=100, has_records=False, has_memory=True,
                     layers_seen={0}, shapes_seen=set(shapes_seen))  # fmt: skip


def test_an_attention_module_alone_is_judged_in_its_head_layout():
    """DeepSpeed's DistributedAttention takes q, k, v as [S/P, B, a, d] (sequence-first): the
    hidden state split into heads, never [B, S/P, H] itself. That is the declared shape, not a
    wrong declaration."""
    from sptrace.checks.sharding_verdict import check_sharding

    model = ModelShape(batch=1, seq=64, hidden=64, sp_size=8, dtype="float32")
    q = (8, 1, 8, 8)  # [S/P, B, a, d], a*d = H
    report = check_sharding([_retained({q}, [(q, 8 * 64 * 4)])], model)
    assert report.verdict.status == "pass", report.verdict
    # a shape that does not split H is still a wrong declaration
    report = check_sharding([_retained({(8, 1, 8, 4)}, [((8, 1, 8, 4), 8 * 32 * 4)])], model)
    assert report.verdict.status == "undecided" and "matches no tensor" in report.verdict.summary
