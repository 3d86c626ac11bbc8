"""Draws of sequence-parallel models for the gate's generator (no torch here: the tests read the
draws at collection time).

Each draw fixes B, S, H, F, heads a, head dim d, P (a group of 2, 4 or all 8 ranks), the dtype
(and autocast), the activation layout (batch- or sequence-first), how the sequence is gathered
(into a buffer the model made, as a list then ``cat``, or a functional collective) and how partial
sums return to shards (reduce-scatter, all-reduce then ``chunk``, or a functional collective),
activation checkpointing (none, non-reentrant, selective), a full-size positional parameter whose
shard the model multiplies by, whether the model runs under ``sptrace.instrument`` (the README's
recipe) or bare, how many steps the profiler records, how many micro-batches each step has and in
which order they run, and where (if anywhere) the model keeps one stray full-sequence tensor:
which step, micro-batch, layer and in which way. At least half of the draws force a collision of
dimensions that a shape-only rule cannot tell apart (S == H, F/P == H, a*d/P == H, S == F/P,
B == P). The truth is not this intent but what torch saw (job.py): a weak reference to the
planted tensor's storage, read at the forward -> backward boundary.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass

WORLD = 8
"""The job's rank count: P is 8 (one group), 4 or 2 (groups of consecutive ranks)."""
WAYS = ("autograd", "list", "attr", "hook", "sac", "compile", "offload")
"""How a stray full-sequence tensor is kept: autograd saves the gathered input of a plain
F.linear; the model appends it to a Python list, caches it on a module attribute, or a forward
hook keeps it; a selective-checkpointing policy MUST_SAVEs the functional all-gather's output;
a torch.compile'd block runs on the gathered tensor and saves it; autograd saves the gathered
input of a plain F.linear through a pack hook that keeps a copy in its place (``OFFLOADS``)."""
GATHERS = ("into_tensor", "list", "funcol", "allreduce_pad", "broadcast", "ring")
"""all_gather_into_tensor into a buffer the model made (the buffer is the collective's own);
all_gather into a list, then cat (the cat is the model's); a functional collective (its output
is the collective's own); all_reduce of a zero [.., S, ..] buffer the rank wrote its shard into
(the buffer is the all-reduce's own); P broadcasts, each rank's shard in turn, then cat; P - 1
ring exchanges (batch_isend_irecv to the next rank, from the previous), then cat."""
ASSEMBLED = ("allreduce_pad", "broadcast", "ring")
"""The gathers that assemble the sequence with no all-gather at all."""
EXACT = ("into_tensor", "funcol", "allreduce_pad")
"""The gathers whose whole sequence is a collective's own buffer (the others join pieces: a cat is
the model's own tensor)."""
OFFLOADS = ("save_on_cpu", "copy_hook")
"""How a saved tensor is offloaded: torch.autograd.graph.save_on_cpu(pin_memory=True), or a
saved_tensors_hooks pack hook that keeps a copy (``t.clone()``)."""
SCATTERS = ("reduce_scatter", "all_reduce_chunk", "funcol")
"""reduce_scatter_tensor; all_reduce in place, then chunk(P)[rank] (a common way to write it);
the functional reduce-scatter."""
CHECKPOINTS = ("none", "full", "sac")
"""Each block as it is; under non-reentrant torch.utils.checkpoint (gather and matmul recomputed
in backward); under a selective-checkpointing policy that keeps matmul outputs."""
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
    autocast: bool  # float32 weights under bf16 autocast
    layout: str  # "bsh" (batch-first) or "sbh" (sequence-first)
    gather: str
    scatter: str
    checkpoint: str
    compiled: bool  # every layer runs a torch.compile'd block
    pos_param: bool  # a full-size [S, H] positional parameter (B = 1): the model multiplies by its shard
    offload: str | None  # OFFLOADS: the offload stray's hook, or a clean draw's offloading of every layer's saves
    instrumented: bool  # sptrace.instrument(model), as the README says
    layers: int
    steps: int
    micro_batches: int
    order: str  # "interleaved": f0 b0 f1 b1; "grouped": f0 f1 b0 b1
    collisions: tuple[str, ...]
    stray: dict | None  # {"way", "step", "micro_batch", "layer"}, or None for a clean model

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def kind(self) -> str:
        """What the draw is scored as: its stray's way, or clean."""
        return self.stray["way"] if self.stray else "clean"


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
    p = rng.choice((2, 4, 8))
    forced = rng.choice(COLLISIONS) if index % 2 == 0 else None  # at least half collide
    pos_param = way is None and forced != "B==P" and rng.random() < 0.2
    for _ in range(1000):
        b = 1 if pos_param else p if forced == "B==P" else rng.choice((1, 2, 3))
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
    checkpoint = "sac" if way == "sac" else rng.choice(("none", "none", "full", "sac")) if way is None else (
        rng.choice(("none", "none", "full")) if way in ("list", "attr", "hook") else "none")  # fmt: skip
    compiled = way == "compile" or (way is None and checkpoint == "none" and rng.random() < 0.1)
    gather = "funcol" if checkpoint == "sac" else rng.choice(GATHERS)
    scatter = "funcol" if checkpoint == "sac" else rng.choice(SCATTERS)
    steps = rng.choice((1, 2))
    micro = rng.choice((1, 2))
    order = rng.choice(("interleaved", "grouped")) if micro > 1 else "interleaved"
    layers = 2
    stray = None
    if way is not None:
        stray = {"way": way, "step": rng.randrange(steps), "micro_batch": rng.randrange(micro),
                 "layer": rng.randrange(layers)}  # fmt: skip
    dtype = "float32" if compiled else rng.choice(("float32", "bfloat16"))  # one inductor compile per dtype
    offload = rng.choice(OFFLOADS) if way == "offload" or (way is None and not compiled and rng.random() < 0.3) \
        else None  # fmt: skip
    return Draw(
        name=f"g{index:02d}", batch=b, seq=s, hidden=h, ffn=f, heads=a, head_dim=d, sp=p, dtype=dtype,
        autocast=dtype == "float32" and not compiled and rng.random() < 0.2, layout=rng.choice(("bsh", "sbh")),
        gather=gather, scatter=scatter, checkpoint=checkpoint, compiled=compiled, pos_param=pos_param,
        offload=offload, instrumented=rng.random() < 0.5, layers=layers, steps=steps, micro_batches=micro, order=order,
        collisions=collisions_of(b, s, h, f, a, d, p), stray=stray,
    )  # fmt: skip


def default_count() -> int:
    """How many models the suite draws: SPTRACE_GENERATED_DRAWS, else 24, which keeps `make test`
    inside its time budget and still covers every way, layout, gather, scatter and collision the
    gate must survive (test_the_draws_cover_what_the_gate_must_survive); CI draws more."""
    return int(os.environ.get("SPTRACE_GENERATED_DRAWS") or 24)


def draws(count: int | None = None, seed: int = 0) -> list[Draw]:
    """The job's draws. Every way of keeping a stray appears in both layouts, bare and
    instrumented, with a collective's own buffer and with a tensor derived from one: where chance
    left a combination out, a stray draw is turned into it."""
    out = [draw(i, seed) for i in range(count or default_count())]
    wanted = [(way, layout) for way in WAYS for layout in ("bsh", "sbh")]
    have = {(d.stray["way"], d.layout) for d in out if d.stray}
    spare = [i for i, d in enumerate(out) if i % 6 and (d.stray is None or
             [(x.stray["way"], x.layout) for x in out if x.stray].count((d.stray["way"], d.layout)) > 1)]  # fmt: skip
    for way, layout in [w for w in wanted if w not in have]:
        if not spare:
            break
        i = spare.pop(0)
        d = out[i]
        stray = {"way": way, "step": d.steps - 1, "micro_batch": d.micro_batches - 1, "layer": 1}
        checkpoint = "sac" if way == "sac" else "none"
        out[i] = Draw(**{**d.to_dict(), "stray": stray, "layout": layout, "checkpoint": checkpoint,
                         "gather": "funcol" if way == "sac" else d.gather,
                         "scatter": "funcol" if way == "sac" else d.scatter,
                         "compiled": way == "compile", "pos_param": False, "batch": d.batch,
                         "offload": (d.offload or OFFLOADS[i % 2]) if way == "offload" else None,
                         "dtype": "float32" if way == "compile" else d.dtype,
                         "autocast": d.autocast and way != "compile"})  # fmt: skip
    # a stray the model holds itself (list, attribute, hook), both as the very buffer a collective
    # filled and as a tensor derived from one (a cat), bare and under sptrace.instrument
    held = [i for i, d in enumerate(out) if d.kind in ("list", "attr", "hook")]

    def combo(d: Draw) -> tuple[bool, bool]:
        return d.gather in EXACT, d.instrumented

    for want in [(e, i) for e in (True, False) for i in (True, False)]:
        have = [combo(out[i]) for i in held]
        if want in have:
            continue
        pairs = [(out[i].kind, out[i].layout) for i in held]
        # (a draw whose way and layout another draw has too, first: a very buffer kept in a bare
        # trace stays undecided, and each way must be decided in each layout somewhere)
        spares = [i for i in held if have.count(combo(out[i])) > 1]
        spare = next(
            (i for i in spares if pairs.count((out[i].kind, out[i].layout)) > 1), spares[0] if spares else None
        )
        if spare is None:
            break
        exact, instrumented = want
        d = out[spare]
        out[spare] = Draw(**{**d.to_dict(), "gather": ("into_tensor" if d.layout == "sbh" else "funcol") if exact
                             else "list", "instrumented": instrumented})  # fmt: skip
    _shown(out)
    # a stray in the second micro-batch of a grouped step (f0 f1 b0 b1), in a checkpointed block:
    # b0's recomputation runs after f1 kept its stray, and must neither keep nor plant another
    for checkpoint, ways in (("sac", ("sac",)), ("full", ("list", "attr", "hook"))):
        mine = [i for i, d in enumerate(out) if d.kind in ways]
        if mine and not any(late_in_grouped(out[i]) and out[i].checkpoint == checkpoint for i in mine):
            d = out[mine[-1]]
            out[mine[-1]] = Draw(**{**d.to_dict(), "checkpoint": checkpoint, "micro_batches": 2, "order": "grouped",
                                    "stray": {**d.stray, "micro_batch": 1}})  # fmt: skip
    # every assembly without an all-gather, with a stray and clean, bare and instrumented, and
    # both offloads, with a stray and clean
    for form in ASSEMBLED:
        for stray, instrumented in ((True, False), (True, True), (False, False), (False, True)):
            if any(d.gather == form and bool(d.stray) == stray and d.instrumented == instrumented for d in out):
                continue
            combos = [(d.gather, bool(d.stray), d.instrumented) for d in out]
            # (never a stray the model holds: their gathers are chosen above, exact or not)
            spare = next((i for i, d in enumerate(out) if bool(d.stray) == stray and d.checkpoint != "sac"
                          and d.kind not in ("list", "attr", "hook") and sum(g == d.gather for g, _, _ in combos) > 1
                          and combos.count(combos[i]) > 1), None)  # fmt: skip
            if spare is not None:
                out[spare] = Draw(**{**out[spare].to_dict(), "gather": form, "instrumented": instrumented})
    for hook in OFFLOADS:
        for stray in (True, False):
            if any(d.offload == hook and (d.kind == "offload") == stray for d in out):
                continue
            spare = next((i for i, d in enumerate(out) if (d.kind == "offload" if stray else d.stray is None)
                          and not d.compiled and sum(x.offload == d.offload for x in out) > 1), None)  # fmt: skip
            if spare is not None:
                out[spare] = Draw(**{**out[spare].to_dict(), "offload": hook})
    return out


def _shown(out: list[Draw]) -> None:
    """Each way a model holds a stray, in each layout, at least once where the trace can show it:
    a model that holds the very buffer a collective filled is decided only under
    sptrace.instrument's census."""
    for way in ("list", "attr", "hook"):
        for layout in ("bsh", "sbh"):
            mine = [i for i, d in enumerate(out) if d.kind == way and d.layout == layout]
            if mine and all(out[i].gather in EXACT and not out[i].instrumented for i in mine):
                out[mine[0]] = Draw(**{**out[mine[0]].to_dict(), "instrumented": True})


def late_in_grouped(d: Draw) -> bool:
    """The stray is kept in a later micro-batch than the first, with every forward before any
    backward."""
    return bool(d.stray and d.stray["micro_batch"] > 0 and d.order == "grouped")
