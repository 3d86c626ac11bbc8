"""Where in the user's code a tensor was made: a source line, and which frames of a Python stack are
the user's.

A stack runs through the user's code, the framework's (Megatron-Core, DeepSpeed, Transformer
Engine ...), torch's, the standard library's and sptrace's own. A tensor's maker is the innermost
frame of the user's code, else, where the stack has none (a framework's layer called from a test),
the innermost frame of the framework: the line a user reads to find the tensor.

The profiler's Python tracer names a frame ``path(first line): function``, its path relative to
the sys.path entry it was imported from (``torch/nn/modules/module.py(1736): _call_impl``,
``model.py(52): forward``); sptrace.instrument reads the live frames, with absolute paths and the
statement's own line. Both are classified here, once, for the analysis and the instrumentation
alike (no torch, no pandas: the instrumentation imports it in training processes).
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from sptrace.vocab.jsontypes import JSONObject

FRAMEWORKS = frozenset({
    "megatron", "deepspeed", "transformer_engine", "apex", "flash_attn", "fairscale", "torchtitan",
    "transformers", "accelerate", "colossalai", "xformers", "nemo", "lightning", "pytorch_lightning",
})  # fmt: skip
"""Top-level packages of the training frameworks: their frames are the maker only where the stack
has no frame of the user's code."""

LIBRARIES = frozenset({"torch", "sptrace", "triton", "numpy", "functorch", "typing_extensions", "_pytest",
                       "pytest", "pluggy"}) | frozenset(sys.stdlib_module_names)  # fmt: skip
"""Top-level packages whose frames are never a maker: torch's, sptrace's own, the standard library."""

_TRACER_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
_SITE = ("site-packages", "dist-packages")


@dataclass(frozen=True, slots=True)
class SourceLine:
    """A line of source: ``exact`` when it is the statement's own line (sptrace.instrument), not
    the first line of the function that ran it (a bare trace's Python tracer)."""

    file: str
    line: int
    function: str
    exact: bool

    def text(self) -> str:
        """'model.py:52 in forward()' ('model.py:48, in forward()' for a function's first line)."""
        return f"{self.file}:{self.line} in {self.function}()" + ("" if self.exact else " (the function's first line)")

    def to_dict(self) -> JSONObject:
        return {"file": self.file, "line": self.line, "function": self.function, "exact": self.exact}


def parse_tracer_frame(name: str) -> SourceLine | None:
    """A Python tracer event's name ``path(line): function`` as a SourceLine (None for the
    tracer's other events: ``nn.Module: Linear_0``, ``<built-in method mm ...>``)."""
    if name.startswith("<"):
        return None
    m = _TRACER_FRAME.match(name)
    if m is None:
        return None
    return SourceLine(m["file"], int(m["line"]), m["function"], exact=False)


@lru_cache(maxsize=4096)
def frame_kind(file: str) -> str:
    """'user', 'framework' or 'library' for a frame's file (absolute, or relative to a sys.path
    entry as the Python tracer writes it)."""
    if not file or file.startswith("<"):
        return "library"
    path = file.replace("\\", "/")
    parts = [p for p in path.split("/") if p and p != "."]
    for site in _SITE:  # an installed package: the part after site-packages names it
        if site in parts:
            tail = parts[parts.index(site) + 1 :]
            return _kind_of_top(_top(tail)) if tail else "library"
    if os.path.isabs(file):
        if _under(path, _STDLIB) or _under(path, _SPTRACE):
            return "library"
        return "user"
    return _kind_of_top(_top(parts))


def _top(parts: list[str]) -> str:
    return parts[0].removesuffix(".py") if parts else ""


def _kind_of_top(top: str) -> str:
    if top in LIBRARIES:
        return "library"
    return "framework" if top in FRAMEWORKS else "user"


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


_STDLIB = tuple({os.path.realpath(p).replace("\\", "/") for p in (sysconfig.get_paths()["stdlib"],
                                                                   sysconfig.get_paths()["platstdlib"])})  # fmt: skip
_SPTRACE = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/"),)
"""sptrace's package folder (its reference models live outside it: they are a user's code)."""


def maker(frames: Iterable[SourceLine]) -> SourceLine | None:
    """The innermost frame of the user's code among ``frames`` (outermost first), else the
    innermost framework frame, else None."""
    user = framework = None
    for frame in frames:
        kind = frame_kind(frame.file)
        if kind == "user":
            user = frame
        elif kind == "framework":
            framework = frame
    return user or framework
