"""Draws of sequence-parallel models for the gate's generator (no torch here: the tests read the
draws at collection time).

Each draw fixes B, S, H, F, heads a, head dim d, P, the dtype, the activation layout (batch- or
sequence-first), how many steps the profiler records, how many micro-batches each step has and
in which order they run, and where (if anywhere) the model keeps one stray full-sequence tensor:
which step, micro-batch, layer and in which way. At least half of the draws force a collision of
dimensions that a shape-only rule cannot tell apart (S == H, F/P == H, a*d/P == H, S == F/P,
B == P). The truth is what the draw placed; the job (job.py) checks that torch saw it there.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass

WORLD = 4
"""The job's rank count: P is 4 (one group) or 2 (two groups, as data parallelism x SP)."""
WAYS = ("autograd", "list", "attr", "hook", "sac", "compile")
"""How a stray full-sequence tensor is kept: autograd saves the gathered input of a plain
F.linear; the model appends it to a Python list, caches it on a module attribute, or a forward
hook keeps it; a selective-checkpointing policy MUST_SAVEs the functional all-gather's output;
a torch.compile'd block runs on the gathered tensor and saves it (and a buffer of its size)."""
COLLISIONS = ("S==H", "F/P==H", "a*d/P==H", "S==F/P", "B==P")


@dataclass(frozen=True)
class Draw:
    name: str
    batch: int
    seq: int
    hidden: int
    ffn: int
    heads: int
    head_dim: int
    sp: int
    dtype: str
    layout: str  # "bsh" (batch-first) or "sbh" (sequence-first)
    layers: int
    steps: int
    micro_batches: int
    order: str  # "interleaved": f0 b0 f1 b1; "grouped": f0 f1 b0 b1
    checkpointed: bool  # every layer runs under selective activation checkpointing
    compiled: bool  # every layer runs a torch.compile'd block
    collisions: tuple[str, ...]
    stray: dict | None  # {"way", "step", "micro_batch", "layer"}, or None for a clean model

    def to_dict(self) -> dict:
        return asdict(self)

    def undecidable(self) -> list[str]:
        """Why a trace of this model may not show enough to decide (CANNOT DECIDE is then a right
        answer, PASS or FAIL the other one), from how the model is written, never from a verdict:
        * sequence-first, the model gathers straight into a buffer it made and hands it to gloo,
          whose worker thread may drop the last reference: that free is not in the trace, and a
          buffer still held by the model looks the same;
        * a head dim equal to S gives q and k the shape of attention scores."""
        why = []
        if self.layout == "sbh":
            why.append("gathers into its own buffer, which gloo may free on a thread the profiler does not record")
        if self.head_dim == self.seq:
            why.append("head dim == S: q and k have the shape of attention scores")
        return why


def collisions_of(b: int, s: int, h: int, f: int, a: int, d: int, p: int) -> tuple[str, ...]:
    """Which of COLLISIONS these dimensions have (each a coincidence a shape rule can trip on)."""
    hit = {
        "S==H": s == h,
        "F/P==H": f // p == h,
        "a*d/P==H": a * d // p == h,
        "S==F/P": s == f // p,
        "B==P": b == p,
    }
    return tuple(k for k in COLLISIONS if hit[k])


def draw(index: int, seed: int = 0) -> Draw:
    rng = random.Random(seed * 100_003 + index)
    way = rng.choice((None, None, *WAYS)) if index % 6 else None  # a clean model in at least 1 of 6
    p = rng.choice((2, 4))
    forced = rng.choice(COLLISIONS) if index % 2 == 0 else None  # at least half collide
    for _ in range(1000):
        b = p if forced == "B==P" else rng.choice((1, 2, 3))
        s_local = rng.choice((2, 3, 4, 6, 8))
        s = s_local * p
        d = rng.choice((2, 4, 8))
        heads_local = rng.choice((1, 2, 3))
        a = heads_local * p
        h = rng.choice((8, 12, 16, 24, 32))
        f_local = rng.choice((8, 12, 16, 24, 48))
        if forced == "S==H":
            h = s
        elif forced == "F/P==H":
            f_local = h
        elif forced == "a*d/P==H":
            if h % heads_local:
                continue
            d = h // heads_local
        elif forced == "S==F/P":
            f_local = s
        f = f_local * p
        if h < 4 or d < 1:
            continue
        if forced and forced not in collisions_of(b, s, h, f, a, d, p):
            continue
        break
    checkpointed = way == "sac" or (way is None and rng.random() < 0.15)
    compiled = way == "compile" or (way is None and not checkpointed and rng.random() < 0.15)
    steps = rng.choice((1, 2))
    micro = rng.choice((1, 2))
    order = rng.choice(("interleaved", "grouped")) if micro > 1 else "interleaved"
    layers = 2
    stray = None
    if way is not None:
        stray = {
            "way": way,
            "step": rng.randrange(steps),
            "micro_batch": rng.randrange(micro),
            "layer": rng.randrange(layers),
        }
    return Draw(
        name=f"g{index:02d}", batch=b, seq=s, hidden=h, ffn=f, heads=a, head_dim=d, sp=p,
        # torch.compile'd draws stay float32: each dtype would be another inductor compile
        dtype="float32" if compiled else rng.choice(("float32", "bfloat16")),
        layout=rng.choice(("bsh", "sbh")), layers=layers, steps=steps, micro_batches=micro, order=order,
        checkpointed=checkpointed, compiled=compiled, collisions=collisions_of(b, s, h, f, a, d, p), stray=stray,
    )  # fmt: skip


def default_count() -> int:
    """How many models the suite draws: SPTRACE_GENERATED_DRAWS, else 24, which keeps `make test`
    inside its time budget and still covers every way, layout, dtype and collision the gate must
    survive (test_the_draws_cover_what_the_gate_must_survive); CI draws 42."""
    return int(os.environ.get("SPTRACE_GENERATED_DRAWS") or 24)


def draws(count: int | None = None, seed: int = 0) -> list[Draw]:
    """The job's draws. Every way of keeping a stray appears at least once: the draw cycles
    through WAYS when chance left one out."""
    out = [draw(i, seed) for i in range(count or default_count())]
    ways = {d.stray["way"] for d in out if d.stray}
    missing = [w for w in WAYS if w not in ways]
    for k, way in enumerate(missing):
        i = 6 * k + 1  # never one of the guaranteed-clean draws
        d = out[i]
        stray = {"way": way, "step": d.steps - 1, "micro_batch": d.micro_batches - 1, "layer": 1}
        out[i] = Draw(**{**d.to_dict(), "stray": stray, "checkpointed": way == "sac", "compiled": way == "compile",
                         "dtype": "float32" if way == "compile" else d.dtype, "collisions": d.collisions})  # fmt: skip
    return out
