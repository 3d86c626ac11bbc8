"""Wire bytes: what one rank sends for one collective under ring algorithms (nccl-tests' model).
Detection fills a trace's collectives with them and the cost model its expectations, so both
read one formula."""

from __future__ import annotations


def wire_bytes(kind: str, in_bytes: int, out_bytes: int, group_size: int) -> float:
    """Bytes one rank sends for one collective under ring algorithms (nccl-tests' model).

    Rooted collectives as c10d records them on each rank: a scatter's root has the whole input
    (the others 0) and keeps its own chunk; a gather's non-roots send their input, the root
    (whose output is not 0) sends nothing; reduce chains the partial sums, one input each."""
    if kind == "send":
        return float(in_bytes)
    if kind == "recv":
        return 0.0
    if group_size <= 1:
        return 0.0
    r = (group_size - 1) / group_size
    if kind == "all_gather":
        return out_bytes * r
    if kind in ("reduce_scatter", "all_to_all"):
        return in_bytes * r
    if kind == "all_reduce":
        return 2 * in_bytes * r
    if kind == "broadcast":
        return float(in_bytes)
    if kind == "send_recv":
        return float(in_bytes)
    if kind == "scatter":
        return in_bytes * r
    if kind == "gather":
        return 0.0 if out_bytes else float(in_bytes)
    if kind == "reduce":
        return float(in_bytes)
    return 0.0
