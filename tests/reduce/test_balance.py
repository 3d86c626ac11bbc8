"""GIVEN each rank's work lane and the FLOPs of its matrix products, per module and phase
WHEN sptrace.reduce.balance compares the ranks against the model's work
THEN it names the cause the data shows: a causal ring without load balancing (rank and ratio
against 2R/(R+1)), a rank with more tokens, a slow device (every layer, every step), a code path
(one module, every step); and equal work with no slow rank is balanced."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sptrace.costmodel.attention_work import attention_shares, ring_shares
from sptrace.detect.flops import FLOPS_COLUMNS, op_flops
from sptrace.detect.step_work import STEP_WORK_COLUMNS
from sptrace.reduce import balance as balance_of_run
from sptrace.reduce.balance import is_attention
from sptrace.vocab.shape import ModelShape

P, LAYERS = 8, 4
STEPS = ("s1", "s2")
MODULES = ("attn", "attn.qkv", "mlp.fc1")


def lanes(time_of, steps=tuple(STEPS)) -> pd.DataFrame:
    """Each rank's lane per step, module and phase (sptrace.detect.step_work): time_of(...) us."""
    rows = [
        (rank, step, f"layers.{layer}.{module}", phase, time_of(rank, step, layer, module, phase))
        for rank in range(P) for step in steps for layer in range(LAYERS) for module in (*MODULES, "stall")
        for phase in ("forward", "backward")
    ]  # fmt: skip
    frame = pd.DataFrame(rows, columns=STEP_WORK_COLUMNS)
    return frame[frame["time_us"] > 0].reset_index(drop=True)


def flops(attention=lambda r: 1.0, linear=lambda r: 1.0) -> pd.DataFrame:
    rows = []
    for rank in range(P):
        for layer in range(LAYERS):
            for phase, scale in (("forward", 1.0), ("backward", 2.0)):
                rows.append((rank, f"layers.{layer}.attn", phase, 1e9 * scale * attention(rank)))
                rows.append((rank, f"layers.{layer}.attn.qkv", phase, 5e8 * scale * linear(rank)))
                rows.append((rank, f"layers.{layer}.mlp.fc1", phase, 8e8 * scale * linear(rank)))
    return pd.DataFrame(rows, columns=FLOPS_COLUMNS)


def compute_balance(times: pd.DataFrame, work: pd.DataFrame, layers, model):
    """The run's balance from one frame of lanes and one of FLOPs (as if a single rank summarized all)."""
    return balance_of_run.compute_balance([times], [work], layers, model)


def even(rank, step, layer, module, phase):
    return 100.0 if module != "stall" else 0.0


RING = ModelShape(scheme="ring", sp_size=P, causal=True)


def test_a_contiguous_causal_ring_is_named_with_its_rank_and_ratio():
    shares = ring_shares(P, True, "none")
    work = flops(attention=lambda r: shares[r])
    time = lanes(lambda r, s, layer, m, ph: 100.0 * (shares[r] if m == "attn" else 1.0) if m != "stall" else 0.0)
    for model in (RING.override("flags", cp_balance="none"), RING):  # declared, and read off the work's shape
        balance = compute_balance(time, work, {}, model)
        assert [c.code for c in balance.causes] == ["causal-mask"], balance.line()
        cause = balance.causes[0]
        assert cause.ranks == (P - 1,) and cause.ratio == pytest.approx(2 * P / (P + 1))
        assert cause.predicted == pytest.approx(2 * P / (P + 1)) and "--cp-balance zigzag" in cause.text
        assert set(balance.rows["attention_rank"]) == {P - 1}
        assert balance.rows["attention_ratio"].round(3).eq(round(2 * P / (P + 1), 3)).all()
    json.dumps(balance.to_dict())


def test_zigzag_work_is_balanced_and_a_layout_that_is_not_the_models_is_said():
    balance = compute_balance(lanes(even), flops(), {}, RING.override("flags", cp_balance="zigzag"))
    assert balance.balanced and balance.line().startswith("balanced: equal work on every rank")
    assert balance.rows["predicted_ratio"].eq(1.0).all()
    shares = ring_shares(P, True, "none")
    time = lanes(lambda r, s, layer, m, ph: 100.0 * (shares[r] if m == "attn" else 1.0) if m != "stall" else 0.0)
    skewed = compute_balance(time, flops(attention=lambda r: shares[r]), {},
                             RING.override("flags", cp_balance="zigzag"))  # fmt: skip
    assert [c.code for c in skewed.causes] == ["attention-work"] and "predicts 1.00x" in skewed.causes[0].text


def test_a_rank_with_more_tokens_is_named_by_its_linear_work():
    more = flops(attention=lambda r: 1.3 if r == 2 else 1.0, linear=lambda r: 1.3 if r == 2 else 1.0)
    balance = compute_balance(lanes(even), more, {}, ModelShape(scheme="ulysses", sp_size=P))
    assert [c.code for c in balance.causes] == ["more-tokens"]
    assert balance.causes[0].ranks == (2,) and balance.causes[0].ratio == pytest.approx(1.3)


def test_a_slow_device_is_slow_on_every_layer_in_every_step():
    balance = compute_balance(lanes(lambda r, *k: even(r, *k) * (2.2 if r == 3 else 1.0)), flops(), {},
                              ModelShape(scheme="megatron", sp_size=P))  # fmt: skip
    assert [(c.code, c.ranks) for c in balance.causes] == [("slow-device", (3,))]
    assert balance.causes[0].ratio == pytest.approx(2.2)


def test_a_code_path_is_one_module_of_one_rank_in_every_step():
    def stall(rank, step, layer, module, phase):
        if module == "stall":
            return 400.0 if (rank, layer, phase) == (5, 1, "forward") else 0.0
        return 100.0

    balance = compute_balance(lanes(stall), flops(), {}, ModelShape(scheme="megatron", sp_size=P))
    assert [(c.code, c.ranks) for c in balance.causes] == [("code-path", (5,))]
    assert "layers.1.stall forward" in balance.causes[0].text
    # in one step only: noise, not a cause
    once = compute_balance(lanes(lambda r, s, *k: stall(r, s, *k) if s == "s1" else even(r, s, *k)), flops(), {},
                           ModelShape(scheme="megatron", sp_size=P))  # fmt: skip
    assert once.balanced


def test_more_work_is_not_slowness():
    """A rank handed twice the work in twice the time is not slow (time per unit of work)."""
    twice = flops(attention=lambda r: 2.0 if r == 1 else 1.0, linear=lambda r: 2.0 if r == 1 else 1.0)
    balance = compute_balance(lanes(lambda r, *k: even(r, *k) * (2.0 if r == 1 else 1.0)), twice, {},
                              ModelShape(scheme="megatron", sp_size=P))  # fmt: skip
    assert [c.code for c in balance.causes] == ["more-tokens"]


def test_without_shapes_time_alone_is_compared():
    balance = compute_balance(lanes(lambda r, *k: even(r, *k) * (2.0 if r == 6 else 1.0)),
                              pd.DataFrame(columns=FLOPS_COLUMNS), {}, ModelShape())  # fmt: skip
    assert not balance.work_recorded and [c.code for c in balance.causes] == ["slow-device"]
    assert set(balance.rows["measured_by"]) == {"time"}


def test_the_models_attention_shares():
    assert ring_shares(8, True, "none")[-1] == pytest.approx(16 / 9)
    assert sum(ring_shares(8, True, "none")) == pytest.approx(8)
    assert ring_shares(8, True, "zigzag") == [1.0] * 8 == ring_shares(8, False, "none")
    usp = attention_shares(ModelShape(scheme="usp", sp_size=8, ulysses_degree=2, causal=True, cp_balance="none"))
    assert usp == [r for j in range(4) for r in [2 * (j + 1) / 5] * 2]
    assert attention_shares(ModelShape(scheme="megatron", sp_size=4)) == [1.0] * 4
    assert attention_shares(ModelShape(scheme="ring", sp_size=4, causal=True)) is None  # the layout unknown


def test_flops_of_the_counted_ops():
    assert op_flops("aten::mm", "[[4, 8], [8, 3]]") == 2 * 4 * 8 * 3
    assert op_flops("aten::addmm", "[[3], [4, 8], [8, 3]]") == 2 * 4 * 8 * 3
    assert op_flops("aten::bmm", "[[2, 4, 8], [2, 8, 3]]") == 2 * 2 * 4 * 8 * 3
    assert op_flops("aten::baddbmm", "[[2, 4, 3], [2, 4, 8], [2, 8, 3]]") == 2 * 2 * 4 * 8 * 3
    assert op_flops("aten::_scaled_dot_product_flash_attention_for_cpu", "[[1, 2, 16, 8], [1, 2, 32, 8]]") == (
        4 * 1 * 2 * 16 * 8 * 32
    )
    assert op_flops("aten::matmul", "[[4, 8], [8, 3]]") == 0  # a composite: its mm is counted
    assert op_flops("aten::mm", "[[4, 8], [7, 3]]") == 0 and op_flops("aten::mm", "not json") == 0


def test_attention_modules():
    assert is_attention("layers.0.attn") and is_attention("decoder.layers.3.self_attention.core_attention")
    assert not is_attention("layers.0.attn.qkv") and not is_attention("decoder.layers.3.self_attention.linear_proj")
    assert not is_attention("layers.0.mlp.fc1")
