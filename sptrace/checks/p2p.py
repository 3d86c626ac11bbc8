"""Findings about a run's point-to-point traffic (sptrace.reduce.p2p), for any scheme and for
runs with no model of the job alike.

- ``unpaired-p2p``: a send no rank received, or a receive no rank sent. An error when the
  partner rank's trace is there (a ring that would hang, or a trace that lost events); a warning
  when it is not, or when the trace does not name the partner.
- ``p2p-peer-disagrees`` (warning): a receive names a source that sent it nothing; it was paired
  by destination and size with what another rank sent (pytorch#153819).
- ``ring-overlap`` and ``ring-imbalance`` (info): the share of the ring transfers hidden behind
  computation, and max / mean over ranks of the computation between the ring transfers.
"""

from __future__ import annotations

import pandas as pd

from sptrace.checks.findings import Finding, merge_ranks
from sptrace.reduce.p2p import P2PReport
from sptrace.vocab.units import human_bytes


def _where(layer: object, phase: object) -> str:
    layer_text = "no layer" if layer is None or pd.isna(layer) else f"layer {int(layer)}"
    return f"{layer_text} {phase}"


def check_point_to_point(report: P2PReport, ranks: list[int]) -> list[Finding]:
    present = set(ranks)
    findings: list[Finding] = []
    for row in report.unpaired.itertuples(index=False):
        size = "of unknown size" if pd.isna(row.bytes) else f"of {human_bytes(float(row.bytes))}"
        if pd.isna(row.peer):
            findings.append(Finding(
                "warning", "p2p", "unpaired-p2p",
                f"{_where(row.layer, row.phase)}: a {row.kind} {size} whose peer the trace does not name",
                (int(row.rank),), None if pd.isna(row.layer) else int(row.layer), row.module, page="collectives",
            ))  # fmt: skip
            continue
        peer = int(row.peer)
        what = (f"a send {size} to rank {peer} that rank {peer} never received" if row.kind == "send"
                else f"a receive {size} from rank {peer} that rank {peer} never sent")  # fmt: skip
        severity = "error" if peer in present else "warning"
        if peer not in present:
            what += f" (rank {peer} has no trace)"
        findings.append(Finding(
            severity, "p2p", "unpaired-p2p", f"{_where(row.layer, row.phase)}: {what}", (int(row.rank),),
            None if pd.isna(row.layer) else int(row.layer), row.module, page="collectives",
        ))  # fmt: skip
    disagreeing = report.pairs[report.pairs["peer_disagrees"]] if len(report.pairs) else report.pairs
    for row in disagreeing.itertuples(index=False):
        findings.append(Finding(
            "warning", "p2p", "p2p-peer-disagrees",
            f"{_where(row.layer, row.phase)}: its receive of {human_bytes(float(row.bytes or 0))} names a source that "
            f"sent it nothing; rank {row.src} sent it (paired by destination and size)",
            (int(row.dst),), None if pd.isna(row.layer) else int(row.layer), row.module, page="collectives",
        ))  # fmt: skip
    share = report.overlap_share()
    if share is not None:
        findings.append(Finding(
            "info", "p2p", "ring-overlap",
            f"{100 * share:.0f}% of the point-to-point transfer time was hidden behind computation "
            f"({len(report.pairs)} sends paired)", page="collectives",
        ))  # fmt: skip
    imbalance = report.imbalance()
    if imbalance is not None:
        per_rank = report.balance.groupby("rank")["compute_us"].sum()
        busiest = int(per_rank.idxmax())
        findings.append(Finding(
            "info", "p2p", "ring-imbalance",
            f"computation between the ring transfers: max / mean over ranks = {imbalance:.2f} (the busiest: "
            f"{per_rank.max() / 1e3:.1f} ms)", (busiest,), page="collectives",
        ))  # fmt: skip
    return merge_ranks(findings)
