"""A sharding test in one function: ``check_sharding`` starts ``world_size`` ranks on gloo (CPU),
builds the model on each, applies ``sptrace.instrument``, profiles two training steps into a folder
and runs ``sptrace check`` on them, in this process, once every rank has exited.

    from sptrace.testing import check_sharding

    def build(rank, world_size):           # called on every rank, after the process group exists
        return parallelize(MyModel(...))

    def step(model, i):                    # one training step: forward + backward (+ optimizer)
        model(batch(i)).mean().backward()

    def test_sharding():
        check_sharding(build, step, world_size=4, shape={"batch": 2, "seq": 64, "hidden": 48})

The test fails (``ShardingCheckFailed``, an AssertionError) with the gate's FAIL lines and its
verdict line; an infrastructure error (a rank that raised or crashed, a timeout, a shape it
cannot use) is one ``SptraceTestError`` message. No rank is left running, whatever happens.
Installed, sptrace also gives pytest the ``sptrace_check`` fixture (sptrace.testing.pytest_plugin):
the same function, with the traces in the test's ``tmp_path``. The ranks are started and stopped
by sptrace.testing.ranks.

Nothing here imports torch or pandas at import time: the ranks and the check import them when
they run. The ranks are fresh interpreters (``python -c``, each in a process session of its own,
so that a rank and anything it started can be stopped together), so ``model_factory`` and
``step_fn`` travel to them pickled: module-level functions (or ``functools.partial`` of them),
never lambdas or functions defined inside another function.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sptrace.vocab.errors import SptraceError

__all__ = ["REQUIRED_SHAPE", "ShardingCheckFailed", "ShardingResult", "SptraceTestError", "check_sharding"]

REQUIRED_SHAPE = ("batch", "seq", "hidden")
"""The shape keys the gate cannot do without (P is the world size unless ``sp_size`` says)."""
_EXTRA_KEYS = ("fault", "fault_layer", "fault_modules", "instrumented", "layout", "reference_model", "seed")
"""Keys run.json may carry beside the model's fields (sptrace.load.files reads them as such)."""
EXPECT = ("pass", "fail", None)


class SptraceTestError(SptraceError):
    """The sharding test could not run: a bad argument, a rank that raised or crashed, a
    timeout. One message naming what went wrong (and, for a rank, its log)."""


class ShardingCheckFailed(AssertionError):
    """The gate's verdict was not the one expected: the message is its FAIL lines and verdict
    line; ``result`` holds the whole ``ShardingResult``."""

    def __init__(self, message: str, result: ShardingResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class ShardingResult:
    """What ``sptrace check`` said about the profiled run."""

    verdict: str
    """pass, fail or undecided (CANNOT DECIDE)."""
    exit_code: int
    """sptrace check's exit code: 0 PASS, 1 FAIL, 2 CANNOT DECIDE."""
    fail_lines: list[str]
    """Each ``FAIL ...`` line of the report, with the lines that belong to it (source lines)."""
    verdict_line: str
    """The report's verdict line (``PASS: ...``, ``FAIL: ...``, ``CANNOT DECIDE: ...``) and its reasons."""
    text: str
    """The whole text report (and anything the check wrote to stderr)."""
    run_dir: Path
    """The traces and run.json (removed when ``check_sharding`` made a temporary folder and
    the verdict was the expected one)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of the ranks (launch, import, profile) and of the check."""

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def message(self) -> str:
        """The FAIL lines and the verdict line: what a failed test says."""
        return "\n".join([*self.fail_lines, self.verdict_line])


def check_sharding(
    model_factory: Callable[[int, int], Any],
    step_fn: Callable[[Any, int], Any],
    *,
    shape: Mapping[str, Any],
    world_size: int = 8,
    timeout: float = 300.0,
    out_dir: str | os.PathLike[str] | None = None,
    expect: str | None = "pass",
    allow: tuple[str, ...] | list[str] = (),
    strict: bool = False,
    warmup: int = 1,
    steps: int = 2,
    instrument: bool = True,
    threads: int = 1,
) -> ShardingResult:
    """Profile ``steps`` training steps of the model on ``world_size`` gloo ranks (CPU) and run
    ``sptrace check`` on them.

    ``model_factory(rank, world_size)`` builds the model on each rank after
    ``torch.distributed`` is initialised (gloo; the default group spans every rank) and returns
    the ``nn.Module`` to instrument (already wrapped: ``parallelize_module``, ``fully_shard``).
    ``step_fn(model, step)`` runs one whole training step (forward and backward; an optimizer
    step if you like), called ``warmup`` times unprofiled, then ``steps`` times under the
    profiler. Both must be picklable: module-level functions or ``functools.partial`` of them
    (the ranks are separate interpreters; a lambda or a nested function is refused at once).

    ``shape``: what the gate judges against, written to run.json as ``profile_step``'s
    ``run_info``: ``batch``, ``seq`` and ``hidden`` are required; ``heads``, ``kv_heads``,
    ``ffn``, ``layers``, ``scheme``, ``dtype`` ... are optional, and ``sp_size`` defaults to
    ``world_size``.

    ``expect``: "pass" (default) raises ``ShardingCheckFailed`` unless the gate says PASS, with
    its FAIL lines and verdict line; "fail" raises unless it says FAIL (a test that a planted
    stray is caught); None returns the result whatever it is. ``allow`` and ``strict`` are
    ``sptrace check``'s ``--allow`` (module globs) and ``--strict``.

    ``out_dir``: where the traces go (kept); by default a temporary folder, removed unless the
    verdict was not the expected one (then the message names it). ``timeout`` (seconds) bounds
    the whole launch; past it every rank is stopped. ``threads``: torch's intra-op threads per
    rank (1: ranks do not fight over a small machine's cores).

    Raises ``SptraceTestError`` (before starting anything) for a bad argument or shape, and
    when a rank raised (its rank, exception and where), crashed, or the ranks ran past
    ``timeout``; no rank process outlives the call.
    """
    __tracebackhide__ = True  # pytest: the failure points at the test, not at this function
    run_info = _validated_shape(shape, world_size)
    if expect not in EXPECT:
        raise SptraceTestError(f"expect must be 'pass', 'fail' or None, got {expect!r}")
    if not timeout or timeout <= 0:
        raise SptraceTestError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if warmup < 0 or steps < 1:
        raise SptraceTestError(f"warmup must be >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    if isinstance(allow, str):
        allow = (allow,)
    payload, meta = _payload(model_factory, step_fn)

    made_temp = out_dir is None
    root = Path(tempfile.mkdtemp(prefix="sptrace-testing-")) if made_temp else Path(out_dir)
    keep = not made_temp
    try:
        if not made_temp and root.exists() and any(root.glob("rank*.pt.trace.json*")):
            raise SptraceTestError(f"{root} already holds a run; give check_sharding an empty or new out_dir")
        started = time.monotonic()
        options = {"run_info": run_info, "warmup": warmup, "steps": steps, "instrument": instrument,
                   "threads": threads, **meta}  # fmt: skip
        from sptrace.testing.ranks import launch

        launch(root, world_size, payload, timeout, options)
        ranks_s = time.monotonic() - started
        result = _gate(root, allow=tuple(allow), strict=strict, seconds={"ranks": round(ranks_s, 2)})
        if expect is not None and result.verdict != expect:
            keep = True
            raise ShardingCheckFailed(_failure_message(result, expect), result)
        return result
    except BaseException:
        keep = True
        raise
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


# ---- arguments -----------------------------------------------------------------------------------


def _validated_shape(shape: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """The run_info to record: ``shape`` with ``sp_size`` filled in, checked before any launch."""
    from sptrace.vocab.shape import ALIASES, FIELDS, INT_FIELDS, seq_split_problem

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise SptraceTestError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(shape, Mapping):
        raise SptraceTestError(
            f"shape must be a mapping such as {{'batch': 2, 'seq': 64, 'hidden': 48}}, got {type(shape).__name__}"
        )
    info: dict[str, Any] = {}
    for key, value in shape.items():
        name = str(key).replace("-", "_")
        name = ALIASES.get(name, name)
        if name not in FIELDS and name not in _EXTRA_KEYS:
            raise SptraceTestError(
                f"shape has {key!r}, which is no model field sptrace reads; the fields are {', '.join(FIELDS)}"
            )
        info[name] = value
    missing = [k for k in REQUIRED_SHAPE if info.get(k) is None]
    if missing:
        raise SptraceTestError(
            f"shape lacks {', '.join(repr(k) for k in missing)}: the sharding check needs batch, seq and hidden "
            f"(B, S, H of the full model; P is the world size unless shape gives sp_size), got {dict(shape)!r}"
        )
    info.setdefault("sp_size", world_size)
    for name in INT_FIELDS:
        value = info.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SptraceTestError(f"shape[{name!r}] must be a positive integer, got {value!r}")
    if info["sp_size"] > world_size:
        raise SptraceTestError(f"shape's sp_size {info['sp_size']} is larger than world_size {world_size}")
    problem = seq_split_problem(info["seq"], info["sp_size"])
    if problem:
        raise SptraceTestError(f"shape: {problem}")
    try:
        json.dumps(info)
    except TypeError as exc:
        raise SptraceTestError(f"shape must hold JSON values (it is written to run.json): {exc}") from None
    return info


def _payload(model_factory: Callable, step_fn: Callable) -> tuple[bytes, dict[str, Any]]:
    """The two callables pickled for the ranks, with what the ranks need to import them: this
    process's sys.path and, for functions of a script run as ``__main__``, the script."""
    for what, fn in (("model_factory", model_factory), ("step_fn", step_fn)):
        if not callable(fn):
            raise SptraceTestError(f"{what} must be callable, got {type(fn).__name__}")
        try:
            pickle.dumps(fn)
        except Exception as exc:
            name = getattr(fn, "__qualname__", None) or repr(fn)
            raise SptraceTestError(
                f"{what} {name} cannot be pickled ({type(exc).__name__}: {exc}); the ranks are separate "
                "processes: define it at module level (functools.partial of a module-level function works), "
                "not as a lambda or inside another function"
            ) from None
    main = sys.modules.get("__main__")
    main_path = None
    if any(getattr(fn, "__module__", None) == "__main__" for fn in (model_factory, step_fn)):
        main_path = getattr(main, "__file__", None)
        if main_path is None:
            raise SptraceTestError(
                "model_factory and step_fn are defined in an interactive session; the ranks cannot import them: "
                "put them in a module or a script file"
            )
        main_path = os.path.abspath(main_path)
    meta = {"sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path], "main_path": main_path}
    return pickle.dumps({"model_factory": model_factory, "step_fn": step_fn}), meta


# ---- the gate ------------------------------------------------------------------------------------


def _gate(run_dir: Path, *, allow: tuple[str, ...], strict: bool, seconds: dict[str, float]) -> ShardingResult:
    """``sptrace check RUN`` in this process (its text report, exit code and verdict)."""
    from sptrace.cli import main

    argv = ["check", str(run_dir), "--no-cache", "--workers", "1"]
    for glob in allow:
        argv += ["--allow", glob]
    if strict:
        argv.append("--strict")
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    seconds = {**seconds, "check": round(time.monotonic() - started, 2)}
    text = out.getvalue() + err.getvalue()
    verdict = {0: "pass", 1: "fail"}.get(code, "undecided")
    return ShardingResult(verdict=verdict, exit_code=code, fail_lines=_fail_lines(out.getvalue()),
                          verdict_line=_verdict_line(out.getvalue(), err.getvalue()), text=text, run_dir=run_dir,
                          seconds=seconds)  # fmt: skip


def _fail_lines(text: str) -> list[str]:
    """Each ``FAIL ...`` line (the sharding check's, and a registered gating check's indented
    one) with the more-indented lines under it (its source lines)."""
    out: list[str] = []
    indent = None
    for line in text.splitlines():
        stripped = line.lstrip()
        here = len(line) - len(stripped)
        if stripped.startswith("FAIL ") and not stripped.startswith("FAIL: "):
            out.append(line)
            indent = here
        elif indent is not None and stripped and here > indent:
            out.append(line)
        else:
            indent = None
    return out


_LABELS = ("PASS:", "FAIL:", "CANNOT DECIDE:")


def _verdict_line(out: str, err: str) -> str:
    """The sharding verdict's line with its ``also:`` reasons, and the verdict line of each other
    gating check that did not pass (indented under its title); else the error sptrace printed."""
    lines = out.splitlines()
    taken: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith(_LABELS) and not taken:
            taken.append(line)
            for more in lines[i + 1 :]:
                if not more.startswith("  also: "):
                    break
                taken.append(more)
        elif line.startswith("  ") and line.lstrip().startswith(_LABELS[1:]) and taken:
            title = next((x for x in reversed(lines[:i]) if x and not x.startswith(" ")), "")
            taken.append(f"{title} {line.strip()}".strip())
    if taken:
        return "\n".join(taken)
    said = (err.strip() or out.strip()).splitlines()
    return said[-1] if said else "sptrace check said nothing"


def _failure_message(result: ShardingResult, expect: str) -> str:
    said = {"pass": "PASS", "fail": "FAIL", "undecided": "CANNOT DECIDE"}[result.verdict]
    head = (f"sptrace check said {said}, expected {expect.upper()} (exit {result.exit_code}; "
            f"the run is kept in {result.run_dir})")  # fmt: skip
    return "\n".join([head, *result.fail_lines, result.verdict_line])
