"""Point-to-point pairing, ring steps and peer resolution on hand-built collective tables (the
expected pairs follow from how the tables are built)."""

from __future__ import annotations

import pandas as pd

from sptrace.checks.p2p import check_point_to_point
from sptrace.detect.collectives import COLUMNS
from sptrace.reduce.p2p import analyse_point_to_point, pair_point_to_point
from sptrace.reduce.peers import resolve_peers

N = 4096


def op(rank, kind, peer, t, *, nbytes=N, phase="forward", layer=0, candidates=None):
    row = dict.fromkeys(COLUMNS)
    row.update(rank=rank, kind=kind, peer=peer, in_bytes=nbytes, out_bytes=nbytes, start_us=float(t), dur_us=5.0,
               transfer_start_us=float(t) + 1, transfer_dur_us=4.0, phase=phase, layer=layer, module="attn",
               source="", unknown=None, peer_candidates=candidates)  # fmt: skip
    return row


def ring(P, steps, *, phase="forward", t0=0.0, reverse=False):
    """Every rank sends to r+1 (r-1 when reversed) and receives from the other side, ``steps`` times."""
    rows = []
    for step in range(steps):
        for r in range(P):
            to, src = ((r - 1) % P, (r + 1) % P) if reverse else ((r + 1) % P, (r - 1) % P)
            t = t0 + 100 * step + r
            rows += [op(r, "send", to, t, phase=phase), op(r, "recv", src, t + 0.5, phase=phase)]
    return rows


def frame(rows):
    return pd.DataFrame(rows)[COLUMNS]


def test_a_ring_pairs_every_send_with_its_receive_by_step():
    f = frame(ring(4, 3) + ring(4, 4, phase="backward", t0=1000, reverse=True))
    pairs, unpaired = pair_point_to_point(f)
    assert len(pairs) == 4 * 3 + 4 * 4 and unpaired.empty
    fwd = pairs[pairs["phase"] == "forward"]
    assert set(zip(fwd["src"], fwd["dst"])) == {(0, 1), (1, 2), (2, 3), (3, 0)}
    assert sorted(fwd["step"].unique()) == [0, 1, 2]
    bwd = pairs[pairs["phase"] == "backward"]
    assert set(zip(bwd["src"], bwd["dst"])) == {(1, 0), (2, 1), (3, 2), (0, 3)}
    report = analyse_point_to_point(f)
    assert list(report.steps["phase"]) == ["forward"] * 3 + ["backward"] * 4  # execution order
    assert set(report.steps["hops"]) == {4} and set(report.steps["bytes"]) == {4 * N}
    matrix = report.matrix("forward")
    assert matrix.loc[0, 1] == 3 * N and matrix.loc[0, 2] == 0


def test_a_receive_naming_the_wrong_source_is_paired_by_destination_and_reported():
    rows = ring(4, 1)
    # rank 2's receive says it came from rank 3 (pytorch#153819-style metadata); rank 1 sent it
    bad = next(r for r in rows if r["rank"] == 2 and r["kind"] == "recv")
    bad["peer"] = 3
    pairs, unpaired = pair_point_to_point(frame(rows))
    assert len(pairs) == 4 and unpaired.empty
    flagged = pairs[pairs["peer_disagrees"]]
    assert list(zip(flagged["src"], flagged["dst"])) == [(1, 2)]
    findings = check_point_to_point(analyse_point_to_point(frame(rows)), [0, 1, 2, 3])
    assert [f.code for f in findings if f.severity == "warning"] == ["p2p-peer-disagrees"]
    assert next(f for f in findings if f.code == "p2p-peer-disagrees").ranks == (2,)


def test_a_send_nobody_received_is_an_error_when_the_peer_has_a_trace():
    rows = [r for r in ring(4, 1) if not (r["rank"] == 3 and r["kind"] == "recv")]
    report = analyse_point_to_point(frame(rows))
    assert list(zip(report.unpaired["rank"], report.unpaired["kind"])) == [(2, "send")]
    errors = [f for f in check_point_to_point(report, [0, 1, 2, 3]) if f.severity == "error"]
    assert [f.code for f in errors] == ["unpaired-p2p"] and errors[0].ranks == (2,)
    assert "never received" in errors[0].message
    # without rank 3's trace it is a warning: the partner cannot be asked
    absent = [f for f in check_point_to_point(report, [0, 1, 2]) if f.code == "unpaired-p2p"]
    assert absent[0].severity == "warning" and "has no trace" in absent[0].message


def test_peers_of_an_unnamed_subgroup_are_resolved_by_the_partners_traces():
    # ranks 0..3 hold two groups: the world and the ring [0, 2] / [1, 3]; c10d::send names its
    # peer by its rank in the group, which the trace does not name
    world = {"group": "0", "size": 4, "ranks": [0, 1, 2, 3]}

    def options(rank, local):
        ring_ranks = [rank % 2, rank % 2 + 2]
        out = [{**world, "peer": local}] if local != rank else []
        if ring_ranks[local] != rank:
            out.append({"group": f"ring{rank % 2}", "size": 2, "ranks": ring_ranks, "peer": ring_ranks[local]})
        return out

    rows = []
    for r in range(4):
        local_peer = 1 - r // 2  # the other member of the ring, by its rank in the ring
        rows.append(op(r, "send", None, r, candidates=options(r, local_peer)))
        rows.append(op(r, "recv", None, r + 0.5, candidates=options(r, local_peer)))
    f = resolve_peers(frame([{**row} for row in rows]).assign(peer_candidates=[r["peer_candidates"] for r in rows]))
    assert "peer_candidates" not in f.columns
    assert list(f["peer"]) == [2, 2, 3, 3, 0, 0, 1, 1]
    # where the world and the ring name different peers, the partner decides, and so the group;
    # rank 2's ring partner is rank 0 in both of its groups, so its group stays unknown
    assert list(f["group"]) == ["ring0", "ring0", "ring1", "ring1", None, None, "ring1", "ring1"]
    assert f["source"].str.contains("whose trace answers it").all()
