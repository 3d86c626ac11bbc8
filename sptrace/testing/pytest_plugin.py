"""sptrace's pytest plugin (registered under the ``pytest11`` entry point, so installing sptrace
is enough): the ``sptrace_check`` fixture, ``sptrace.testing.check_sharding`` with the traces in
the test's own ``tmp_path``.

    def test_my_model_stays_sharded(sptrace_check):
        sptrace_check(build, step, world_size=4, shape={"batch": 2, "seq": 64, "hidden": 48})

pytest imports this module (and sptrace.testing's __init__) in every session of a project that has
sptrace installed: neither imports torch or pandas until a test calls the fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sptrace.testing import ShardingResult


@pytest.fixture
def sptrace_check(tmp_path: Path) -> Callable[..., ShardingResult]:
    """``check_sharding(model_factory, step_fn, *, shape, world_size=8, expect="pass", ...)``
    writing each call's traces to a new folder under ``tmp_path`` (``sptrace-run``,
    ``sptrace-run-2``, ...), kept as pytest keeps a test's tmp_path. Returns its ShardingResult;
    fails the test with the gate's FAIL lines unless the verdict is the one expected."""
    from sptrace.testing import check_sharding  # (light; what it runs imports torch in the ranks)

    calls = [0]

    def check(
        model_factory: Callable[[int, int], object], step_fn: Callable[..., object], **kwargs: object
    ) -> ShardingResult:
        __tracebackhide__ = True
        if kwargs.get("out_dir") is None:
            calls[0] += 1
            kwargs["out_dir"] = tmp_path / ("sptrace-run" if calls[0] == 1 else f"sptrace-run-{calls[0]}")
        return check_sharding(model_factory, step_fn, **kwargs)

    return check
