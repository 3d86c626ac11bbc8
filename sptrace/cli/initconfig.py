"""``sptrace init-config RUN``: a config file (YAML, read back by ``--config``) holding every model
value the traces let sptrace read, each with where it was read from, and the rest left null with
what the trace showed of them, to fill in."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sptrace.cli.common import add_load_flags, emit, map_quietly
from sptrace.vocab.shape import ShapeValues

if TYPE_CHECKING:
    from sptrace.detect.infer import Inferred

ORDER = ("scheme", "sp_size", "layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "dtype")
NOT_READ = {
    "kv_heads": "g: leave null when equal to heads (no GQA)",
    "ffn": "F, the MLP width: not read from the trace",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "init-config", help="write a config file of what the traces show of the model (--config reads it)"
    )
    p.add_argument("path", help="a run directory or one trace file")
    p.add_argument("-o", "--output", help="write it here (atomically) instead of stdout")
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.detect.infer import infer_model
    from sptrace.reduce.peers import merge_collectives

    run_, ranks = map_quietly(args, ("collectives",))
    first = run_.ranks[min(run_.ranks)]
    # one rank's ops, for the norm and attention shapes (read again, from the cache)
    table = first.table.select(["name", "cat", "input_dims"]).to_pandas()
    collectives = merge_collectives([ranks.frame("collectives")])
    inferred = infer_model(collectives, first.process_groups, table)
    text = render(str(args.path), inferred)
    known = [n for n in ORDER if n in inferred.values]
    emit(args, text, f"{len(known)} of {len(ORDER)} values read from the trace ({', '.join(known) or 'none'}); "
         "fill in the nulls")  # fmt: skip
    return 0


def _cost_model_needs(values: ShapeValues) -> list[str] | None:
    """The undeclared sizes the inferred scheme's cost model depends on (None: no scheme read)."""
    from sptrace.costmodel.comm import undeclared_sizes
    from sptrace.vocab.errors import UsageError
    from sptrace.vocab.shape import ModelShape

    if not values.get("scheme") or not values.get("sp_size"):
        return None
    try:
        shape = ModelShape().override("trace", **values)
    except UsageError:
        return None
    if shape.heads and not shape.kv_heads:
        shape = shape.override("trace", kv_heads=shape.heads)
    return undeclared_sizes(shape)[0]


def render(path: str, inferred: Inferred) -> str:
    lines = [
        f"# The model of {path}, as its traces show it (sptrace init-config).",
        "# Every value says where it was read from: check it. Fill in each null the analyses need, then",
        f"#   sptrace check {path} --config THIS_FILE   (also analyze, report, dash, sweep)",
    ]
    needed = _cost_model_needs(inferred.values)
    for name in ORDER:
        value = inferred.values.get(name)
        why = inferred.evidence.get(name) or inferred.open.get(name) or NOT_READ.get(name, "")
        if value is None and needed is not None and name in ("heads", "ffn"):
            scheme = inferred.values["scheme"]
            why += f" ({'needed' if name in needed else 'not needed'} by the {scheme} cost model)"
        cell = "null" if value is None else str(value)
        lines.append(f"{name + ':':<9} {cell:<10} # {why}".rstrip())
    return "\n".join(lines) + "\n"
