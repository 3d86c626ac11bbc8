"""What a run's traces say about its model, for ``sptrace init-config``: each value with the
evidence it was read from, or left for the user with what the trace showed.

Only what the trace records is read, and from where it came, never from a shape alone:
- P: the size of the process group the collectives inside the layers ran on;
- L: the layers whose collectives or module markers the trace names;
- the activation dtype: the one element type of the collectives inside the layers;
- H and the tokens per rank: the input of the normalisation ops (layer/RMS norm, fused or not),
  whose last dim is normalised: [B, S/P, H] or [S/P, B, H] per rank. Which leading dim is B is
  decided only by the attention ops, which see the whole sequence under Megatron-SP, Ulysses and
  the hybrid; otherwise both readings are reported;
- the head dim d: the last dim of the attention ops' query input, so a = H / d.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from sptrace.detect.args import load_list
from sptrace.vocab.dtypes import ACTIVATION_DTYPES
from sptrace.vocab.shape import ShapeValues

NORM_OP = re.compile(r"(?:layer_?norm|rms_?norm|layernorm|rmsnorm)", re.IGNORECASE)
NORM_SKIP = re.compile(r"backward|_bwd|grad", re.IGNORECASE)
ATTENTION_OP = re.compile(r"(?:scaled_dot_product|flash_attn|flash_attention|efficient_attention|cudnn_attention|"
                          r"fused_attn|dot_product_attention)", re.IGNORECASE)  # fmt: skip


@dataclass
class Inferred:
    """Values read off the traces (field -> value) with the evidence for each, and the fields
    left to the user with what the trace showed of them."""

    values: ShapeValues = field(default_factory=ShapeValues)
    evidence: dict[str, str] = field(default_factory=dict)
    open: dict[str, str] = field(default_factory=dict)

    def put(self, name: str, value: int | str, why: str) -> None:
        self.values[name] = value
        self.evidence[name] = why
        self.open.pop(name, None)


def scheme_of(kinds: set[str]) -> str | None:
    """The scheme whose per-layer collectives are ``kinds`` (the articles' tables)."""
    sp = {"all_gather", "reduce_scatter"} <= kinds
    a2a = "all_to_all" in kinds
    p2p = bool({"send", "recv", "send_recv"} & kinds)
    if p2p:
        return "usp" if a2a else "ring"
    if sp and a2a:
        return "hybrid"
    if a2a:
        return "ulysses"
    if sp:
        return "megatron"
    return None


def layers_dtype(collectives: pd.DataFrame) -> str | None:
    """The activation dtype the collectives inside the layers carry, when they carry one, and it
    is one an activation can have (an index all-to-all's int64 is not)."""
    if not len(collectives):
        return None
    seen = {str(d) for d in collectives.loc[collectives["layer"].notna(), "dtype"].dropna()}
    return next(iter(seen)) if len(seen) == 1 and next(iter(seen)) in ACTIVATION_DTYPES else None


def shapes_of(table: pd.DataFrame, pattern: re.Pattern, skip: re.Pattern | None = None) -> Counter:
    """The first input's shape of the CPU ops whose name matches ``pattern``, counted."""
    ops = table[(table["cat"] == "cpu_op") & table["input_dims"].notna()]
    names = ops["name"].astype(str)
    mask = names.str.contains(pattern)
    if skip is not None:
        mask &= ~names.str.contains(skip)
    shapes: Counter = Counter()
    for dims in ops.loc[mask, "input_dims"]:
        first = next((d for d in load_list(dims) if isinstance(d, list) and d), None)
        if first and all(isinstance(x, int) and x > 0 for x in first):
            shapes[tuple(first)] += 1
    return shapes


def infer_model(
    collectives: pd.DataFrame, groups: Sequence[Mapping[str, object]], table: pd.DataFrame | None
) -> Inferred:
    """What ``collectives`` (every rank's), the ranks' process ``groups`` (``distributedInfo``'s
    ``pg_config`` entries, as the trace lists them: each field is checked before use) and one
    rank's event ``table`` say of the model."""
    out = Inferred()
    for name, what in (("scheme", "the scheme"), ("sp_size", "P"), ("layers", "L"), ("batch", "B"),
                       ("seq", "S"), ("hidden", "H"), ("heads", "a"), ("dtype", "the activation dtype")):  # fmt: skip
        out.open[name] = f"{what}: not shown by the trace"
    c = collectives
    inside = c[c["layer"].notna()] if len(c) else c
    if len(inside):
        kinds = set(inside["kind"].astype(str))
        scheme = scheme_of(kinds)
        if scheme:
            out.put("scheme", scheme, f"the collectives inside the layers: {', '.join(sorted(kinds))}")
        sizes = Counter(int(s) for s in inside["group_size"].dropna() if int(s) > 1)
        if len(sizes) == 1:
            (size,) = sizes
            out.put("sp_size", size, f"the process group of every collective inside the layers ({size} ranks)")
        elif sizes:
            out.open["sp_size"] = f"P: the layers' collectives run on groups of {', '.join(map(str, sorted(sizes)))}"
        layers = sorted({int(v) for v in inside["layer"]})
        out.put("layers", layers[-1] + 1, f"the trace names layers {layers[0]}-{layers[-1]}")
        dtype = layers_dtype(c)
        if dtype is not None:
            out.put("dtype", dtype, "the element type of the collectives inside the layers")
    if "sp_size" not in out.values:
        sized = {g.get("pg_size") for g in groups if isinstance(g.get("pg_size"), int) and g["pg_size"] > 1}
        if len(sized) == 1:
            size = next(iter(sized))
            out.put("sp_size", size, f"the run's only process group size ({size} ranks)")
    if table is None or table.empty or "input_dims" not in table.columns:
        return out
    norms = shapes_of(table, NORM_OP, NORM_SKIP)
    if not norms:
        out.open["hidden"] = "H: no layer or RMS norm op with recorded input shapes (record_shapes=True)"
        return out
    shape, n = norms.most_common(1)[0]
    H = shape[-1]
    out.put("hidden", H, f"the last dim of the norm ops' input {list(shape)} ({n} ops)")
    lead = shape[:-1]
    P = out.values.get("sp_size")
    attention = shapes_of(table, ATTENTION_OP, NORM_SKIP)
    if attention:
        q, _ = attention.most_common(1)[0]
        d = q[-1]
        if d > 1 and H % d == 0:
            out.put("heads", H // d, f"H / d, d = {d} the last dim of the attention ops' query {list(q)}")
    if len(lead) == 1:  # [tokens, H]: B x S/P flattened
        out.open["batch"] = f"B: the norm ops take {lead[0]} tokens per rank (B x S/P) flattened"
        out.open["seq"] = out.open["batch"].replace("B:", "S:", 1)
        return out
    if len(lead) != 2:
        return out
    full = {x for q in attention for x in q[:-1]} if attention else set()
    readings = [(lead[0], lead[1]), (lead[1], lead[0])]  # (B, S/P)
    if P and out.values.get("scheme") in ("megatron", "ulysses", "hybrid"):
        # these schemes' attention sees the whole sequence: S = P x the per-rank sequence dim
        fits = [(b, s) for b, s in readings if s * P in full]
        if len(set(fits)) == 1:  # one reading fits (or both are the same: B == S/P)
            b, s = fits[0]
            why = f"the norm input {list(shape)} holds S/P = {s} (the attention ops see S = {s * P}), B = {b}"
            out.put("batch", b, why)
            out.put("seq", s * P, why)
            return out
    shown = f"the norm ops' input is {list(shape)}: B x S/P is {lead[0]} x {lead[1]} or {lead[1]} x {lead[0]}"
    out.open["batch"] = f"B: {shown}"
    out.open["seq"] = f"S: {shown}" + (f" (S = P x S/P, P = {P})" if P else "")
    return out
