"""The ranks' collectives in one table, with what one rank's trace cannot say settled from the
other ranks' traces: the first step of the cross-rank reduce, before matching.

- ``fill_from_peers``: the element type a rank's trace did not record, from the same collective
  on another rank (the k-th collective of an op is the k-th on every rank of an SPMD program).
- ``resolve_peers``: the peer of a send or receive named by its rank in a group the trace does
  not name, from the partners' own traces.
- ``receives_follow_senders``: a receive takes its sender's phase (a pipeline stage receives its
  gradient before its own backward starts).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

import pandas as pd

from sptrace.detect.collectives import COLUMNS, detect_collectives
from sptrace.load.trace import RunTrace
from sptrace.vocab import dtypes
from sptrace.vocab.collective_kinds import wire_bytes


class _Placed(Protocol):
    """A send's or receive's row, as itertuples or .loc gives it: the columns that place it."""

    in_bytes: float | None
    phase: str
    layer: float | None


def merge_collectives(tables: Iterable[pd.DataFrame | None]) -> pd.DataFrame:
    """The ranks' collectives tables (sptrace.detect.collectives.RANK_COLUMNS, in rank order) as
    one table (COLUMNS), with element types and peers filled from the other ranks and each receive
    in its sender's phase: every command that reads a run's collectives merges them here."""
    frames = [f for f in tables if f is not None and not f.empty]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    with warnings.catch_warnings():
        # a column all NA on one rank (no peer recorded, no transfer linked) takes its type from the
        # ranks that have values: pandas' rule today, which it warns it will change; the golden
        # outputs (tests/golden) show it if it does
        warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation with empty or all-NA", FutureWarning)
        merged = pd.concat(frames, ignore_index=True)
    return receives_follow_senders(resolve_peers(fill_from_peers(merged)))


def detect_run_collectives(run: RunTrace) -> pd.DataFrame:
    """Every rank's collectives of a loaded run, detected here and merged (``merge_collectives``)."""
    return merge_collectives(detect_collectives(t, for_reduce=True) for t in run)


def resolve_peers(frame: pd.DataFrame) -> pd.DataFrame:
    """Sends and receives whose peer is a rank of a group the trace does not name: of the global
    ranks that peer can be (one per group holding this rank), the one whose own trace has the
    opposite operation of the same size naming this rank, when exactly one does. The
    ``peer_candidates`` column is dropped."""
    if "peer_candidates" not in frame.columns:
        return frame
    todo = frame.index[frame["peer"].isna() & frame["peer_candidates"].notna()] if len(frame) else frame.index
    if not len(todo):
        return frame.drop(columns=["peer_candidates"])
    frame = frame.copy()

    # a send and its receive share their size; usually their phase and layer too, but not always:
    # a pipeline stage receives its gradient before its own backward starts, and each stage
    # numbers its own layers. Partners are sought where all three agree, then by size alone.
    def strict(row: _Placed) -> tuple[int | str | None, ...]:
        size = None if pd.isna(row.in_bytes) else int(row.in_bytes)
        layer = None if pd.isna(row.layer) else int(row.layer)
        return size, str(row.phase), layer

    def loose(row: _Placed) -> tuple[int | str | None, ...]:
        return (None if pd.isna(row.in_bytes) else int(row.in_bytes),)

    opposite = {"send": "recv", "recv": "send"}
    p2p = frame[frame["kind"].isin(["send", "recv"])]
    tallies = []
    for where in (strict, loose):
        # (rank, kind, where, claimed peer, through which group) -> how many ops claim it (a
        # group of None: the peer is known, the group not); and the claims of known peers alone
        claims: Counter = Counter()
        known: Counter = Counter()
        for row in p2p.itertuples(index=False):
            if row.peer is not None and not pd.isna(row.peer):
                claims[(row.rank, row.kind, where(row), int(row.peer), row.group)] += 1
                known[(row.rank, row.kind, where(row), int(row.peer))] += 1
            for option in row.peer_candidates or ():
                claims[(row.rank, row.kind, where(row), option["peer"], option["group"])] += 1
        tallies.append((where, claims, known))
    for i in todo:
        rank, kind = int(frame.at[i, "rank"]), frame.at[i, "kind"]
        options = frame.at[i, "peer_candidates"]
        peers = list(dict.fromkeys(o["peer"] for o in options))  # several groups may name one rank
        chosen = None
        # the strongest evidence first: in the same place (size, phase, layer), a partner naming
        # this rank through the same group, then a partner whose own peer is known; then the same
        # by size alone (a pipeline stage receives its gradient before its own backward starts).
        # A partner's mere candidate through another group is no evidence: WORLD reads every
        # index as a global rank, and would answer for anyone.
        for where, claims, known in tallies:
            place = where(frame.loc[i])
            for scores in (
                [sum(claims[(o["peer"], opposite[kind], place, rank, o["group"])] for o in options if o["peer"] == p)
                 for p in peers],
                [known[(p, opposite[kind], place, rank)] for p in peers],
            ):  # fmt: skip
                best = max(scores)
                if best and scores.count(best) == 1:
                    chosen = peers[scores.index(best)]
                    break
            if chosen is not None:
                break
        if chosen is None:
            continue
        fitting = [o for o in options if o["peer"] == chosen]
        frame.at[i, "peer"] = fitting[0]["peer"]
        if len(fitting) == 1:  # the group too, unless several of this rank's groups hold that peer
            frame.at[i, "group"], frame.at[i, "group_size"] = fitting[0]["group"], fitting[0]["size"]
            frame.at[i, "group_ranks"] = fitting[0]["ranks"]
        frame.at[i, "source"] = f"{frame.at[i, 'source']}; peer: the one of {len(options)} whose trace answers it"
        left = [u for u in str(frame.at[i, "unknown"] or "").split("; ") if u and not u.startswith("peer:")]
        frame.at[i, "unknown"] = "; ".join(left) or None
    return frame.drop(columns=["peer_candidates"])


def receives_follow_senders(frame: pd.DataFrame) -> pd.DataFrame:
    """A receive belongs to the autograd work of what was sent: a pipeline stage receives the
    gradient of its output before its own backward starts, outside any autograd node, yet that
    transfer is backward work. The k-th receive of n bytes from rank s takes the phase of the k-th
    send of n bytes from s to this rank (when s's trace has it)."""
    if not len(frame) or not frame["kind"].isin(["recv"]).any():
        return frame
    p2p = frame[frame["kind"].isin(["send", "recv"]) & frame["peer"].notna() & frame["in_bytes"].notna()]
    p2p = p2p.sort_values("start_us", kind="stable")
    sends: dict[tuple[int, int, int], list[str]] = {}
    for row in p2p[p2p["kind"] == "send"].itertuples():
        sends.setdefault((int(row.rank), int(row.peer), int(row.in_bytes)), []).append(str(row.phase))
    frame = frame.copy()
    seen: Counter = Counter()
    for i, row in zip(p2p.index, p2p.itertuples()):
        if row.kind != "recv":
            continue
        key = (int(row.peer), int(row.rank), int(row.in_bytes))
        k = seen[key]
        seen[key] += 1
        phases = sends.get(key, [])
        if k < len(phases) and phases[k] != row.phase and phases[k] in ("forward", "backward"):
            frame.at[i, "phase"] = phases[k]
            frame.at[i, "source"] = f"{frame.at[i, 'source']}; phase: its sender's (rank {int(row.peer)})"
    return frame


def fill_from_peers(frame: pd.DataFrame) -> pd.DataFrame:
    """The element type a rank's trace did not record (a non-root gloo scatter: a TensorList op
    whose worker annotation has no args), from the same collective on another rank: the k-th
    collective of an op on one rank is the k-th of that op on every rank of an SPMD program.
    Sizes follow from the elements this rank's own trace recorded."""
    need = frame["dtype"].isna() & (frame["in_elems"].notna() | frame["out_elems"].notna())
    if not need.any():
        return frame
    frame = frame.copy()
    order = frame.groupby(["rank", "op"], sort=False).cumcount()
    known = frame[frame["dtype"].notna()].assign(k=order[frame["dtype"].notna()])
    donor = known.drop_duplicates(["op", "k"]).set_index(["op", "k"])[["dtype", "rank"]]
    for i in frame.index[need]:
        key = (frame.at[i, "op"], int(order.at[i]))
        if key not in donor.index:
            continue
        dtype, other = donor.loc[key, "dtype"], int(donor.loc[key, "rank"])
        elem = dtypes.element_size(dtype)
        if not elem:
            continue
        frame.at[i, "dtype"] = dtype
        for side in ("in", "out"):
            n = frame.at[i, f"{side}_elems"]
            if n is not None and not pd.isna(n):
                frame.at[i, f"{side}_bytes"] = int(n) * elem
        if frame.at[i, "in_bytes"] is not None and frame.at[i, "out_bytes"] is not None and frame.at[i, "group_size"]:
            size = frame.at[i, "group_size"]
            if size is not None and not pd.isna(size):
                frame.at[i, "wire_bytes"] = wire_bytes(
                    frame.at[i, "kind"], frame.at[i, "in_bytes"], frame.at[i, "out_bytes"], int(size)
                )
        frame.at[i, "source"] = f"{frame.at[i, 'source']}; dtype: the same collective on rank {other}"
        unknown = [
            u
            for u in str(frame.at[i, "unknown"] or "").split("; ")
            if u and not u.startswith(("dtype", "in bytes", "out bytes"))
        ]
        frame.at[i, "unknown"] = "; ".join(unknown) or None
    return frame
