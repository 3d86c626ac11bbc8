"""The statement that made each tensor of an instrumented forward: sptrace.instrument's record of
source lines, exact where a bare trace gives only each function's first line.

While an instrumented root module's forward runs under the profiler, a ``TorchFunctionMode`` sees
every torch function the model calls (``torch.matmul``, ``F.dropout``, a tensor's methods,
``torch.ops`` calls, ``torch.empty``) with the tensor it returns, and notes the innermost frame of
the user's code calling it (sptrace.vocab.source_lines.maker's rule: else the framework's). When
the forward returns, the notes of the tensors still alive are written as one ``sptrace.made::``
event, keyed by storage: the first note of a storage that is still alive names its maker (a later
view of it, or an in-place op on it, made nothing).

Torch's own code runs under the mode as one call (the mode is off inside the function it
intercepts), so a library's internals add nothing, and the pack hooks that run inside an op see no
mode. The cost (docs/performance.md): a Python call per torch function of the forward, only while
profiling; ``instrument(model, source_lines=False)`` turns it off.

Hand-written: torch records no statement lines for the tensors an op makes (its Python tracer gives
each function's first line; anomaly mode's tracebacks cost a formatted stack per autograd node).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from sptrace.vocab import markers
from sptrace.vocab.source_lines import frame_kind


class _Here(Exception):
    """Raised and caught at once: its traceback holds the running frame."""


_Tensor = torch.Tensor
_ref = weakref.ref


class MakerLines(TorchFunctionMode):
    """Notes, for each tensor a torch function returns, where the user's code called it."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[tuple[weakref.ref[torch.Tensor], int, str, str]] = []
        """(the tensor, weakly; line, function, file) in the order they were made."""
        self._kinds: dict[str, str] = {}
        self.site: tuple[int, str, str] | None = None
        """(line, function, file) of the user's statement whose torch call is running now."""

    def __torch_function__(self, func: Callable[..., object], types: object, args: tuple = (),
                           kwargs: dict | None = None) -> object:  # fmt: skip
        # The hot path: with_stack=True records every call a Python frame makes, C functions
        # included, so this calls nothing it can avoid (type checks by __mro__, dict lookups by
        # subscript, loops instead of comprehensions, which are frames of their own in 3.11).
        try:  # the caller's frame without a call (sys._getframe would be one more recorded event)
            raise _Here
        except _Here as here:
            frame = here.__traceback__.tb_frame.f_back  # type: ignore[union-attr]
        framework, kinds = None, self._kinds
        while frame is not None:
            file = frame.f_code.co_filename
            try:
                kind = kinds[file]
            except KeyError:
                kind = kinds[file] = frame_kind(file)
            if kind == "user":
                break
            if kind == "framework" and framework is None:
                framework = frame
            frame = frame.f_back
        frame = frame or framework
        site = None if frame is None else (frame.f_lineno, frame.f_code.co_name, frame.f_code.co_filename)
        self.site = site  # what a pack hook inside the call reads (note_saved)
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            self.site = None
        if site is None:
            return out
        mro = type(out).__mro__
        if _Tensor in mro:
            self.notes += ((_ref(out), *site),)
        elif (tuple in mro or list in mro) and out:
            for tensor in out:
                if _Tensor in type(tensor).__mro__:
                    self.notes += ((_ref(tensor), *site),)
        return out

    def note_saved(self, tensor: torch.Tensor) -> None:
        """A tensor autograd saves inside the call running now (a pack hook's): made there, where
        no earlier note names its storage (dropout's mask, which no function returns)."""
        site = self.site
        if site is not None:
            self.notes += ((_ref(tensor), *site),)

    def take_marker(self) -> str | None:
        """The notes of the tensors still alive as one ``sptrace.made::`` event's name (None when
        none is), and forget them."""
        notes, self.notes = self.notes, []
        seen: set[int] = set()
        records = []
        here = os.getcwd()
        for ref, line, function, file in notes:
            tensor = ref()
            if tensor is None:
                continue
            tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor: this rank's shard
            try:
                ptr = tensor.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):  # a subclass without storage (fake, sparse)
                continue
            if not ptr or ptr in seen:
                continue
            seen.add(ptr)
            records.append(markers.made_marker(ptr, line, function, _relative(file, here)))
        return " ".join(records) if records else None


def _relative(file: str, here: str) -> str:
    """``file`` relative to the working folder where it is under it (a repository's path, as CI
    annotations want it), else as it is."""
    if os.path.isabs(file) and (file == here or file.startswith(here + os.sep)):
        return os.path.relpath(file, here)
    return file
