"""How `sptrace check`'s verdict on a drawn model (draw.py, profiled by job.py) compares with
torch's own record of it (the job's truth): the test and benchmarks/gate_generated.py score with
this, so that the README's rates and the suite's assertion are one rule.

The truth is identity, never a size bound: on each rank, a weak reference to the planted tensor's
storage, read at the forward -> backward boundary of its micro-batch, and the collectives'
buffers still alive at each boundary. A stray is there when its storage is alive at its boundary.

Outcomes:
  right            the verdict is the truth's, and a FAIL names the planted tensor itself (its
                   layer, step and micro-batch, exactly the ranks that kept it, its storage)
  lacked evidence  CANNOT DECIDE where the trace truly lacks the evidence, and the verdict says
                   so and names the remedy: a bare model (no sptrace.instrument census) whose only
                   undecided tensors are buffers a collective filled, the stray being one of them
                   (or, clean, none of them kept by the model: torch's record may still show some
                   alive at the boundary, held by gloo's work object until its own thread lets go,
                   which is the backend's hold and looks the same in the trace as a dead one)
  false FAIL, false PASS, CANNOT DECIDE (any other), wrong place (a FAIL about another tensor,
                   layer, step, micro-batch or rank set)
"""

from __future__ import annotations

from typing import Any

OUTCOMES = ("right", "lacked evidence", "false FAIL", "false PASS", "CANNOT DECIDE", "wrong place")
WRONG = ("false FAIL", "false PASS", "CANNOT DECIDE", "wrong place")
KEEPERS = ("autograd", "model", "offloaded")


def planted_on(truth: dict) -> list[int]:
    """The ranks whose planted tensor was alive at its boundary."""
    return [r for r, rec in enumerate(truth["ranks"]) if rec["plant"] and rec["plant"]["alive_at_boundary"]]


def score(draw: dict, truth: dict, report: dict) -> tuple[str, str]:
    """(outcome, why) of one draw's verdict."""
    alive = planted_on(truth)
    want = "fail" if alive else "pass"
    got = report["verdict"]["status"]
    line = f"{report['verdict']['label']}: {report['verdict']['summary']}"
    if got == want == "pass":
        return "right", ""
    if got == want == "fail":
        problem = _misplaced(draw, truth, report, alive)
        return ("wrong place", problem) if problem else ("right", "")
    if got == "fail":
        return "false FAIL", line
    if got == "pass":
        return "false PASS", line
    why = _lacked_evidence(draw, truth, report, want, alive)
    return ("lacked evidence", why) if why else ("CANNOT DECIDE", line)


def _misplaced(draw: dict, truth: dict, report: dict, alive: list[int]) -> str:
    stray = truth["stray"]
    found = [f for f in report["findings"] if f["code"] == "full-size-save"]
    for f in found:
        if f["layer"] != stray["layer"]:
            return f"a finding in layer {f['layer']}, the stray is in layer {stray['layer']}: {f['message']}"
        if draw["steps"] > 1 and f"step {stray['profiler_step']}" not in f["message"]:
            return f"a finding not in the stray's step {stray['profiler_step']}: {f['message']}"
        if draw["micro_batches"] > 1 and f"micro-batch {stray['micro_batch']}" not in f["message"]:
            return f"a finding not in the stray's micro-batch {stray['micro_batch']}: {f['message']}"
        if not f.get("holder") or not f.get("evidence"):
            return f"a finding without its holder and evidence: {f['message']}"
    ranks = sorted({r for f in found for r in f["ranks"]})
    if ranks != alive:
        return f"FAIL on ranks {ranks}, where torch saw the stray kept on ranks {alive}"
    kept = {(s["rank"], s["storage_ptr"]) for s in report["saved"] if s["class"] == "full" and s["holder"] in KEEPERS}
    missing = [r for r in alive if (r, truth["ranks"][r]["plant"]["ptr"]) not in kept]
    if missing:
        return f"the planted tensor's own storage is not judged full on ranks {missing}"
    return ""


def _lacked_evidence(draw: dict, truth: dict, report: dict, want: str, alive: list[int]) -> str:
    if draw["instrumented"]:
        return ""  # sptrace.instrument's census shows who holds every collective's buffer
    reasons = " ".join(report["verdict"]["reasons"])
    undecided: list[Any] = [s for s in report["saved"] if s["group"] == "undecided"]
    if "no holder the trace can show" not in reasons or "sptrace.instrument" not in reasons:
        return ""
    if not undecided or not all(s["collective"] for s in undecided):
        return ""
    if want == "fail":
        if all(truth["ranks"][r]["plant"]["collective_buffer"] for r in alive):
            return (
                "the stray is the very buffer a collective filled: the model's or the backend's, a bare trace "
                "cannot tell"
            )
        return ""
    # clean: nothing the model kept; a buffer still alive at the boundary is gloo's (its work object
    # lets go on its own thread, earlier or later than the boundary by the threads' timing)
    alive_buffers = {(r, b["ptr"]) for r, rec in enumerate(truth["ranks"]) for b in rec["alive_buffers"]}
    held = sum((s["rank"], s["storage_ptr"]) in alive_buffers for s in undecided)
    return (
        f"gloo released the collectives' buffers on its own thread ({held} of {len(undecided)} still held by it at "
        "the boundary by torch's record)"
    )


def tally(results: list[tuple[dict, str, str]]) -> dict[str, dict[str, int]]:
    """{kind: {outcome: count}} of (draw, outcome, why) triples, kinds in the order seen."""
    out: dict[str, dict[str, int]] = {}
    for draw, outcome, _ in results:
        kind = draw["stray"]["way"] if draw["stray"] else "clean"
        out.setdefault(kind, dict.fromkeys(OUTCOMES, 0))[outcome] += 1
    return out
