"""The sharding check's classifier, ``Judge``: is an activation kept across the forward ->
backward boundary sequence-sharded? It classifies each retained tensor by shape (and module, and
the op that produced it), never by bytes alone when a shape is known, against the run's declared
B, S, H, P (and a, g, F when declared).

  full          a full-sequence tensor at least H wide per token ([B, S, H], [S, B, H], [B*S, H],
                [B, S, F]), all heads of a full-sequence attention tensor, or a view keeping such a
                storage alive: the contract is broken
  head-sharded  full sequence, a 1/P share of the width ([B, S, H/P], [B, a/P, S, d], [B, S, F/P],
                attention scores of a/P heads)
  seq-sharded   a [B, S/P, ...] token shard
  ambiguous     a shape that is a full tensor or a tensor-parallel shard alike (F/P = H, a 4H MLP
                at P=4) and nothing in the trace or the flags tells which: counted, shown, not judged
  other         no token dimension (weights, scalars, statistics)
  unknown       no shape, and a size that matches nothing

How a shape reads against the declared dims is sptrace.checks.sharding_shapes; the verdict over
every rank's retained tensors is sptrace.checks.sharding_verdict.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sptrace.checks.sharding_shapes import Reading, heads_of, readings, tokens_of, widths
from sptrace.vocab import dtypes
from sptrace.vocab.shape import ModelShape
from sptrace.vocab.units import count, significant

CLASSES = ("full", "head-sharded", "seq-sharded", "ambiguous", "other", "unknown")
JUDGED = ("full", "head-sharded", "seq-sharded")
NEEDS = ("batch", "seq", "hidden", "sp_size")
_GATHER = re.compile(r"all_?gather|allgather", re.I)


@dataclass(frozen=True)
class Judge:
    """Classifies retained tensors against a declared ModelShape (B, S, H, P known)."""

    model: ModelShape
    weights: Mapping[int, str] = field(default_factory=dict)
    """The widths the trace's weights give (sptrace.detect.weights): {width: where it was read}.
    A full-sequence tensor of such a width may be a tensor-parallel shard; of any other width at
    least H wide, it is full."""

    def __post_init__(self) -> None:
        self.model.require(NEEDS, "the sharding check")
        problem = self.model.seq_split_problem()
        if problem:
            raise ValueError(problem)

    @property
    def full_bytes(self) -> int | None:
        """Bytes of a full [B, S, H] activation (None when the dtype is not declared)."""
        m = self.model
        return None if m.dtype_bytes is None else m.batch * m.seq * m.hidden * m.dtype_bytes

    @property
    def full_elements(self) -> int:
        """B*S*H: the elements of a full [B, S, H] activation."""
        m = self.model
        return m.batch * m.seq * m.hidden

    @property
    def shard_bytes(self) -> int | None:
        return None if self.full_bytes is None else self.full_bytes // self.model.sp_size

    def classify(
        self,
        shape: tuple[int, ...] | None,
        nbytes: int,
        storage_bytes: int | None = None,
        module: str | None = None,
        producer: str | None = None,
        origin: str | None = None,
        origin_text: str | None = None,
        dtype: str | None = None,
        operator_made: bool = True,
    ) -> tuple[str, str]:
        """(class, why) of one retained tensor. Its origin (what made it: sptrace.detect.provenance)
        decides first; its shape where the origin is silent; its bytes where it has no shape.
        ``dtype``: its element type, where known (else the declared activation's);
        ``operator_made``: False for memory no operator allocated (an activation is always some
        operator's output or a factory's buffer)."""
        storage_bytes = storage_bytes or nbytes
        if not operator_made and not shape:
            return "other", ("allocated by no operator (a random generator's state, a tensor made from NumPy, a C++ "
                             "cache): not an activation")  # fmt: skip
        if origin is None and producer and _GATHER.search(producer):
            origin, origin_text = "gathered", f"made by {producer}"
        if shape and origin in ("gathered", "reduced") and math.prod(int(d) for d in shape) >= self.full_elements:
            # element count before dims: what a gather made holds P shards' worth, the whole
            # sequence, however its dims read ([P*B, S/P, H] reads as a shard)
            numel = math.prod(int(d) for d in shape)
            what = "a gathered full sequence" if origin == "gathered" else "summed over its group"
            return "full", (f"{what} ({origin_text}): {numel} elements, at least B*S*H = "
                            f"{self.full_elements}, whatever its dims read")  # fmt: skip
        if shape:
            cls, why = self._by_shape(tuple(int(d) for d in shape), nbytes, module or "", producer or "", origin,
                                      origin_text or "")  # fmt: skip
        else:
            return self._by_size(nbytes, module or "", producer or "", origin, origin_text or "", dtype)
        if cls in ("head-sharded", "seq-sharded", "other") and storage_bytes > nbytes:
            numel = math.prod(int(d) for d in shape)
            elem = nbytes // numel if numel and nbytes % numel == 0 else self.model.dtype_bytes
            if elem and self._full_storage(storage_bytes, elem, origin):
                return "full", f"a view of {nbytes} bytes keeping a {storage_bytes}-byte storage alive"
        return cls, why

    @functools.cached_property
    def _shard_weights(self) -> Mapping[int, str]:
        """The widths of the trace's weights a shard can have: any but H (a square weight is no
        evidence of a shard: a replicated projection has one as often)."""
        H = self.model.hidden
        return {w: where for w, where in self.weights.items() if w != H}

    def _full_storage(self, storage_bytes: int, elem: int, origin: str | None) -> bool:
        """Is a storage of these bytes a full-sequence tensor at least H wide? Its origin vetoes
        it when that makes it a shard (a column-parallel product of this rank's 1/P weight),
        unless its width is a declared whole width only (F, a*d: the weight was whole)."""
        m = self.model
        tokens = m.batch * m.seq * elem
        if storage_bytes % tokens or storage_bytes // tokens < m.hidden:
            return False
        width = storage_bytes // tokens
        if origin in ("column", "attention", "all-to-all", "reduce-scattered"):
            whole, shard = widths(self.model)
            return width in whole and whole[width] != "H" and width not in shard
        return True

    def _by_size(
        self, nbytes: int, module: str, producer: str, origin: str | None, text: str, dtype: str | None = None
    ) -> tuple[str, str]:
        """A tensor known by its bytes alone (a compiled graph's buffer): FULL when only a
        full-sequence tensor has its size, sharded when only shards do, else ambiguous."""
        m = self.model
        if m.dtype_bytes is None:
            own = dtypes.element_size(dtype) if dtype else None
            if nbytes < self.full_elements * (own or 1):  # fewer elements than B*S*H at any element size
                return "other", f"no shape; {nbytes} bytes hold fewer than B*S*H = {self.full_elements} elements"
            return "unknown", "no shape, and no declared dtype to read its size with"
        token_bytes = m.hidden * m.dtype_bytes
        if nbytes < token_bytes:
            return "other", "no shape; smaller than one token's activation"
        elem = (dtypes.element_size(dtype) if dtype else None) or min(m.dtype_bytes, 2)
        if nbytes < self.full_elements * elem and nbytes != self.shard_bytes:
            # fewer elements than a full activation, at its own element size where known, else at
            # the smaller of the activation's and a 16-bit type's (autocast keeps bf16 copies)
            return "other", (f"no shape; {nbytes} bytes, fewer than B*S*H = {self.full_elements} elements at "
                             f"{elem} bytes each: not a full-sequence tensor")  # fmt: skip
        tokens_full = m.batch * m.seq * m.dtype_bytes
        if origin == "gathered" and nbytes >= self.full_bytes:
            return "full", f"no shape; {nbytes} bytes {text}: a gathered full sequence"
        if origin in ("reduce-scattered", "all-to-all"):
            return "seq-sharded", f"no shape; {text}"
        whole, shard = widths(self.model)
        fulls = {w for w in whole if w >= m.hidden} | {m.hidden}
        explains_full = nbytes % tokens_full == 0 and (nbytes // tokens_full) >= m.hidden
        explains_shard = nbytes == self.shard_bytes or (
            nbytes % tokens_full == 0 and (nbytes // tokens_full) in (set(shard) | {w for w in whole if w < m.hidden})
        )
        if origin in ("column", "attention") and explains_full:
            return "head-sharded", f"no shape; {text}"
        if explains_full and origin is None and (nbytes // tokens_full) in self._shard_weights:
            explains_shard = True  # a weight of the trace makes products (or takes inputs) this wide
        if explains_full and not explains_shard:
            width = nbytes // tokens_full
            return "full", (
                f"no shape; {nbytes} bytes, which only a full-sequence tensor {width} wide per token explains "
                f"([B, S, {width}] at {m.dtype}; judged by size alone)"
                if width not in fulls or width == m.hidden
                else f"no shape; the size of a full [B, S, {width}] activation (judged by size alone)"
            )
        if explains_shard and not explains_full:
            return (
                "seq-sharded",
                "no shape; exactly the size of a sequence or tensor-parallel shard (judged by size alone)",
            )
        if explains_full and explains_shard:
            return "ambiguous", (
                f"no shape; {nbytes} bytes is the size of a full-sequence tensor and of a shard alike (judged by size "
                "alone); pass --ffn/--heads to tell them apart"
            )
        return "unknown", "no shape, and a size that identifies nothing"

    def _by_shape(
        self, shape: tuple[int, ...], nbytes: int, module: str, producer: str, origin: str | None, text: str
    ) -> tuple[str, str]:
        m = self.model
        S, H, P = m.seq, m.hidden, m.sp_size
        views = readings(m, shape, chunked=origin != "received")
        full_views = [v for v in views if v.full_seq]
        if origin == "received" and not full_views and m.local_seq in shape:
            return "seq-sharded", f"a block one peer sent ({text}): a sequence shard ({m.local_seq} of {S} tokens)"
        if origin == "gathered":
            wide = max((v.width for v in full_views if not v.scores), default=0)
            if wide >= H or (self.full_bytes and nbytes >= self.full_bytes and (full_views or not views)):
                return "full", f"a gathered full sequence ({text}), {wide or '?'} wide per token"
            if wide and wide < H:
                share = significant(H / wide)
                return "head-sharded", f"gathered, full sequence, {wide} wide per token (a 1/{share} share)"
            if not views:
                return "other", f"gathered ({text}), no token dimension (a weight or a statistic)"
        if not views:
            return self._no_token_axis(shape, origin, text)
        if not full_views and math.prod(shape) >= self.full_elements and origin is None:
            # dims read a shard P*H or more wide per token, yet it holds a whole [B, S, H]'s
            # elements: [H, B*S] with H == B*S/P reads so; only the op that made it tells
            return "ambiguous", (
                f"its dims read a sequence shard {math.prod(shape) // (m.batch * m.local_seq)} wide per token, yet it "
                f"holds {math.prod(shape)} elements, at least B*S*H = {self.full_elements}, and the trace does not "
                "show the op that made it"
            )
        if not full_views:
            return "seq-sharded", f"a sequence shard ({S // P} of {S} tokens)"
        if origin == "attention" and m.heads and all(v.scores for v in full_views):
            # attention scores (keys on the last axis) with the heads declared: heads are counted over
            # the keys, not a head dim
            return self._by_view(full_views[0], shape, module, producer)
        if origin in ("column", "attention", "all-to-all"):
            heads = heads_of(m, shape, tokens_of(m, full_views[0]))
            if heads == "all" and origin != "column":
                return "full", f"full sequence, every head ({text})"
            whole, shard = widths(self.model)
            wide = [v.width for v in full_views if not v.scores]
            # (H itself is no evidence: F/P may equal H when F is undeclared)
            if origin == "column" and wide and all(w in whole and whole[w] != "H" and w not in shard and w >= H
                                                   for w in wide):  # fmt: skip
                # the weight was whole, not this rank's 1/P of it: a declared F (or a*d) wide
                return "full", f"full sequence, {wide[0]} wide per token ({whole[wide[0]]}, unsharded): {text}"
            return "head-sharded", f"full sequence, a tensor-parallel shard: {text}"
        if origin == "row":
            wide = max(v.width for v in full_views)
            if wide >= H:
                return "full", f"full sequence, {wide} wide per token: {text}, before its reduce-scatter"
        if origin == "reduce-scattered":
            return "seq-sharded", text
        judged = [self._by_view(v, shape, module, producer) for v in views]
        classes = {c for c, _ in judged}
        if len(classes) == 1:
            return judged[0]
        readings_text = "; ".join(f"as {v.layout}: {c}" for v, (c, _) in zip(views, judged))
        if classes <= {"seq-sharded", "head-sharded", "other"}:
            # no reading is full: the tensor is a shard (or a statistic) whichever it is
            cls = next(c for c in ("seq-sharded", "head-sharded", "other") if c in classes)
            return cls, f"not full whichever way its shape reads ({readings_text})"
        readings_scored = "; ".join(
            f"as {v.layout}{' scores' if v.scores else ''}: {c}" for v, (c, _) in zip(views, judged)
        )
        return "ambiguous", f"its shape reads several ways ({readings_scored}) and its origin is not in the trace"

    def _no_token_axis(self, shape: tuple[int, ...], origin: str | None, text: str) -> tuple[str, str]:
        """A shape no [B, S, ...] layout reads. Fewer than B*S*H elements: no full activation
        (a statistic, a mask, a weight's piece). As many or more: a full activation laid out
        otherwise ([B, H, S], [H, B*S], flat) is as likely as anything else, and only the op that
        made it, or a declared 1/P share of the heads, tells: never passed on its dims alone."""
        m = self.model
        numel = math.prod(shape)
        if numel < self.full_elements:
            return "other", f"no token dimension, and fewer than B*S*H = {self.full_elements} elements"
        if origin in ("column", "attention", "all-to-all", "reduce-scattered", "received"):
            return "head-sharded", f"no [B, S, ...] layout reads it; {text}"
        B, S, d = m.batch, m.seq, m.head_dim
        shares = {m.heads // m.sp_size, (m.kv_heads or 0) // m.sp_size} - {0} if m.heads else set()
        if S in shape and (B == 1 or B in shape) and d and len(shape) >= 3 and shape[-1] == d and shape[-2] in shares:
            # K and V stacked over the whole sequence, a/P heads each ([2, B, S, a/P, d] in USP)
            return "head-sharded", f"the whole sequence, {shape[-2]} heads of d = {d} ({list(shape)}): a 1/P share"
        return "ambiguous", (
            f"no [B, S, ...] layout reads {list(shape)}, yet it holds {numel} elements, at least B*S*H = "
            f"{self.full_elements}: a full activation laid out otherwise ([B, H, S], [H, B*S], flat) or a tensor of "
            "another kind, and the trace does not show the op that made it"
        )

    def _by_view(self, view: Reading, shape: tuple[int, ...], module: str, producer: str) -> tuple[str, str]:
        """The class of one reading of a shape, from widths alone."""
        m = self.model
        S, H, P = m.seq, m.hidden, m.sp_size
        full_seq, width, layout, scores = view
        if not full_seq:
            return "seq-sharded", f"a sequence shard ({m.local_seq} of {S} tokens, {layout})"
        if scores:
            heads = max(1, width // S)
            if m.heads is None:
                return "ambiguous", (
                    f"attention scores of {count(heads, 'head')} over the full sequence; pass --heads to judge"
                )
            if heads * P <= m.heads:
                return "head-sharded", f"attention scores of {count(heads, 'head')} (a/P = {m.heads // P})"
            return "full", f"attention scores of {count(heads, 'head')} over the full sequence (a = {m.heads})"
        heads = heads_of(m, shape, tokens_of(m, view))
        if heads == "all":
            return "full", f"full sequence, every head ({width} wide per token)"
        if heads == "share":
            return "head-sharded", f"full sequence, a 1/P share of the heads ({width} wide per token)"
        whole, shard = widths(self.model)
        if width < H:  # narrower than a token's activation: a head shard, a statistic, a rotary table
            if width in shard:
                return "head-sharded", f"full sequence, {width} wide per token ({shard[width]})"
            return "head-sharded", f"full sequence, {width} wide per token: a 1/{significant(H / width)} share of H"
        # All S tokens at least H wide: full, unless a shard can be that wide; then only the op
        # that made it tells (a shard needs positive evidence: sptrace.detect.provenance)
        if width in shard:
            what = f"{shard[width]}, declared" + (f", and {whole[width]} (full) alike" if width in whole else "")
        elif width in whole:  # a declared whole width (H, F, a*d): the weights are no shard's
            return "full", (f"full sequence, {width} wide per token ({whole[width]}): no shard is that wide (H = {H}; "
                            "no declared width makes a shard that wide)")  # fmt: skip
        elif width in self._shard_weights:
            what = self._shard_weights[width] + ", read off the trace"
        else:
            return "full", (f"full sequence, {width} wide per token: no shard is that wide (H = {H}; no declared "
                            "width or weight of the trace makes a shard that wide)")  # fmt: skip
        return "ambiguous", (
            f"full sequence, {width} wide per token: a full tensor, or a tensor-parallel shard as wide as {what}, "
            "and the trace does not show the op that made it"
        )


def classify(
    shape: tuple[int, ...] | None,
    nbytes: int,
    storage_bytes: int | None,
    model: ModelShape,
    module: str | None = None,
    producer: str | None = None,
) -> tuple[str, str]:
    """(class, why) of one retained tensor against a declared ModelShape."""
    return Judge(model).classify(shape, nbytes, storage_bytes, module, producer)
