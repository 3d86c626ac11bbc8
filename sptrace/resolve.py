"""The run's model, resolved once: what the user declared (run.json, then --config, then the flags),
known before any trace is read, and after the map what the traces say of the sizes left undeclared.
Every value read off the traces is read here, in one function, and the model is frozen after it:
the checks, the views and the cost model all see one ModelShape, each value with where it came from.
A value the user declared is never replaced; one the traces contradict is said by the check it
affects (sptrace.checks.builtin)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from sptrace.detect.allocations import Retention
from sptrace.detect.infer import layers_dtype
from sptrace.load.trace import RunTrace
from sptrace.vocab.errors import UsageError
from sptrace.vocab.markers import SAVED
from sptrace.vocab.shape import FIELDS, Declarations, ModelShape, ShapeValues
from sptrace.vocab.units import count


def declared_model(
    run_info: Mapping[str, object] | None, flags: ShapeValues | Declarations | None = None
) -> ModelShape:
    """run.json's declared config, overridden by --config and the flags: what is known before any
    trace is read."""
    declared = run_info.get("config") if isinstance(run_info, dict) else None
    if declared is None and isinstance(run_info, dict) and any(k in FIELDS for k in run_info):
        declared = run_info  # written flat, shaped like profile_step's run_info
    model = ModelShape.from_mapping(declared if isinstance(declared, dict) else None, "run.json")
    if isinstance(flags, Declarations):  # a --config file, then the flags
        return flags.apply(model)
    return model.override("flags", **dict(flags)) if flags else model


def resolve_model(
    declared: ModelShape, run: RunTrace, collectives: pd.DataFrame, retained: Iterable[Retention]
) -> ModelShape:
    """The declared model with every size it leaves unknown that the traces tell, each saying where
    it came from:

    - P: the run's only process group, when it has one;
    - g (kv heads): as many as heads, when no GQA is declared;
    - L: one more than the last layer that communicates;
    - the activation dtype: the one the collectives inside the layers carry, else the one element
      type the trace's ops took their [B, S/P, H] activations in (any layout)."""
    read: dict[str, tuple[object, str]] = {}
    size = _only_group_size(run)
    if declared.sp_size is None and size is not None:
        read["sp_size"] = (size, f"the run's only process group ({count(size, 'rank')})")
    if declared.kv_heads is None and declared.heads is not None:
        read["kv_heads"] = (declared.heads, "equal to heads (no --kv-heads declared)")
    layers = set(collectives["layer"].dropna().astype(int)) if len(collectives) else set()
    if declared.layers is None and layers:
        read["layers"] = (max(layers) + 1, f"the trace (layers {min(layers)}-{max(layers)} communicate)")
    if declared.dtype is None:
        carried = layers_dtype(collectives)
        if carried is not None:
            read["dtype"] = (carried, f"the trace (the collectives inside its layers are {carried})")
    model = declared.with_read(read)
    if model.dtype is None:
        seen = activation_dtypes(model, retained)
        if len(seen) == 1:
            (dtype,) = seen
            model = model.with_read({"dtype": (dtype, f"the trace (its [B, S/P, H] activations are {dtype})")})
    return model


def activation_dtypes(model: ModelShape, retained: Iterable[Retention]) -> set[str]:
    """The element types the trace's ops took [B, S/P, H] activations in, in any layout (empty
    unless B, H and S/P are known)."""
    B, H, s = model.batch, model.hidden, model.local_seq
    if B is None or H is None or s is None:
        return set()
    residual = {(B, s, H), (s, B, H), (B * s, H)} | ({(s, H)} if B == 1 else set())
    return {kind for r in retained for shape, kinds in r.shape_dtypes.items() if shape in residual for kind in kinds}


def _only_group_size(run: RunTrace) -> int | None:
    groups = {(g.get("pg_name"), g.get("pg_size")) for t in run for g in t.process_groups if isinstance(g, Mapping)}
    if len(groups) != 1:
        return None
    ((_, size),) = groups
    return size if isinstance(size, int) and size > 0 else None


def require_sharding_shape(declared: ModelShape, path: Path | None, notes: Iterable[str] = ()) -> None:
    """B, S and H come only from the user (run.json, --config, flags): every one missing, named
    in one line. P may come from the trace's only process group, so it is named with that
    condition."""
    missing = declared.missing(("batch", "seq", "hidden"))
    if missing:
        flags = ", ".join(FIELDS[n][0] for n in missing)
        also = " (and --sp, unless the trace holds a single process group)" if declared.sp_size is None else ""
        said = "".join(f"; {n}" for n in notes)  # run.json's keys that are no field, say (a misspelt size)
        raise UsageError(f"{path}: the sharding check needs {flags}{also}, which neither run.json, --config "
                         f"nor a flag declares{said}")  # fmt: skip


def require_memory_events(first: Path, cache: bool, cache_root: Path) -> None:
    """Before any parse: a first trace that holds neither [memory] events nor sptrace.saved
    records leaves its rank unjudged, so the sharding check could only say CANNOT DECIDE; said
    at once (a trace already in the cache is parsed in no time: not probed)."""
    from sptrace.load.cache import cached_entry
    from sptrace.load.files import holds_any

    if cache and cached_entry(cache_root, first) is not None:
        return
    if not holds_any(first, (b'"[memory]"', SAVED.encode())):
        raise UsageError(
            f"{first}: the trace has neither [memory] events nor sptrace.saved records, so no retained tensor can be "
            "judged: profile with profile_memory=True (sptrace.instrument adds exact shapes)"
        )
