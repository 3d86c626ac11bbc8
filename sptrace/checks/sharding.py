"""Are the activations kept across the forward -> backward boundary sequence-sharded? Classify
each retained tensor by shape (and module, and the op that produced it), never by bytes alone
when a shape is known, against the run's declared B, S, H, P (and a, g, F when declared).

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
  full-unknown-life  full-size, but the trace does not show its free (a backend's thread may have
                released it, or a Python reference still holds it): not judged, and no PASS

The verdict: FAIL on a full tensor (outside ``allow``); CANNOT DECIDE when the trace does not
show enough (no backward in the window, no retained tensor judged, a layer with none judged, a
declared shape no tensor has); else PASS. ``strict`` fails ambiguous and unknown tensors too.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sptrace.checks.findings import Finding, Verdict, merge_ranks
from sptrace.detect.allocations import Retention
from sptrace.shape import ModelShape
from sptrace.units import count, human_bytes, rank_ranges

CLASSES = ("full", "head-sharded", "seq-sharded", "ambiguous", "other", "unknown", "full-unknown-life")
JUDGED = ("full", "head-sharded", "seq-sharded")
NEEDS = ("batch", "seq", "hidden", "sp_size")
_MLP = re.compile(
    r"(mlp|ffn|feed_?forward|\bfc\d|\.fc\d|\bw[123]\b|up_proj|down_proj|gate_proj|dense_h_to_4h|dense_4h_to_h|"
    r"linear_fc\d|c_fc|experts?)",
    re.I,
)
_ATTN = re.compile(
    r"(attn|attention|q_proj|k_proj|v_proj|o_proj|qkv|query|key|value|\bwq\b|\bwk\b|\bwv\b|\bwo\b|out_proj)", re.I
)
_GATHER = re.compile(r"all_?gather|allgather", re.I)
# ops that compute an MLP's activations (a column-parallel linear's output, its nonlinearity)
_MLP_OPS = re.compile(r"^aten::(mm|addmm|matmul|linear|bmm|gelu|silu|relu|mul|sigmoid|tanh)$")


@dataclass(frozen=True)
class Judge:
    """Classifies retained tensors against a declared ModelShape (B, S, H, P known)."""

    model: ModelShape

    def __post_init__(self) -> None:
        self.model.require(NEEDS, "the sharding check")
        if self.model.seq % self.model.sp_size:
            raise ValueError(
                f"seq {self.model.seq} is not divisible by the sequence-parallel size {self.model.sp_size}"
            )

    @property
    def full_bytes(self) -> int | None:
        """Bytes of a full [B, S, H] activation (None when the dtype is not declared)."""
        m = self.model
        return None if m.dtype_bytes is None else m.batch * m.seq * m.hidden * m.dtype_bytes

    @property
    def shard_bytes(self) -> int | None:
        return None if self.full_bytes is None else self.full_bytes // self.model.sp_size

    def widths(self) -> tuple[dict[int, str], dict[int, str]]:
        """Per-token widths of whole tensors, and of 1/P tensor-parallel shards, that the declared
        dims allow: {width: what}."""
        m = self.model
        H, P = m.hidden, m.sp_size
        whole: dict[int, str] = {H: "H"}
        shard: dict[int, str] = {}
        if H % P == 0:
            shard[H // P] = "H/P"
        d = m.head_dim
        if m.heads and d:
            whole.setdefault(m.heads * d, "a*d")
            if m.heads % P == 0:
                shard.setdefault(m.heads // P * d, "a*d/P")
            if m.kv_heads:
                g = m.kv_heads
                whole.setdefault(g * d, "g*d")
                whole.setdefault((m.heads + 2 * g) * d, "(a+2g)*d")
                if g % P == 0:
                    shard.setdefault(g // P * d, "g*d/P")
                if (m.heads + 2 * g) % P == 0:
                    shard.setdefault((m.heads + 2 * g) // P * d, "(a+2g)*d/P")
        if m.ffn:
            whole.setdefault(m.ffn, "F")
            whole.setdefault(2 * m.ffn, "2F")  # gated MLPs (SwiGLU) fuse gate and up
            if m.ffn % P == 0:
                shard.setdefault(m.ffn // P, "F/P")
                shard.setdefault(2 * m.ffn // P, "2F/P")
        return whole, shard

    def classify(
        self,
        shape: tuple[int, ...] | None,
        nbytes: int,
        storage_bytes: int | None = None,
        module: str | None = None,
        producer: str | None = None,
        origin: str | None = None,
        origin_text: str | None = None,
    ) -> tuple[str, str]:
        """(class, why) of one retained tensor. Its origin (what made it: sptrace.detect.provenance)
        decides first; its shape where the origin is silent; its bytes where it has no shape."""
        storage_bytes = storage_bytes or nbytes
        if origin is None and producer and _GATHER.search(producer):
            origin, origin_text = "gathered", f"made by {producer}"
        if shape:
            cls, why = self._by_shape(tuple(int(d) for d in shape), nbytes, module or "", producer or "", origin,
                                      origin_text or "")  # fmt: skip
        else:
            return self._by_size(nbytes, module or "", producer or "", origin, origin_text or "")
        if cls in ("head-sharded", "seq-sharded", "other") and storage_bytes > nbytes:
            numel = math.prod(int(d) for d in shape)
            elem = nbytes // numel if numel and nbytes % numel == 0 else self.model.dtype_bytes
            if elem and self._full_storage(storage_bytes, elem, origin):
                return "full", f"a view of {nbytes} bytes keeping a {storage_bytes}-byte storage alive"
        return cls, why

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
            whole, shard = self.widths()
            return width in whole and whole[width] != "H" and width not in shard
        return True

    def _by_size(self, nbytes: int, module: str, producer: str, origin: str | None, text: str) -> tuple[str, str]:
        """A tensor known by its bytes alone (a compiled graph's buffer): FULL when only a
        full-sequence tensor has its size, sharded when only shards do, else ambiguous."""
        m = self.model
        if m.dtype_bytes is None:
            return "unknown", "no shape, and no declared dtype to read its size with"
        token_bytes = m.hidden * m.dtype_bytes
        if nbytes < token_bytes:
            return "other", "no shape; smaller than one token's activation"
        tokens_full = m.batch * m.seq * m.dtype_bytes
        if origin == "gathered" and nbytes >= self.full_bytes:
            return "full", f"no shape; {nbytes} bytes {text}: a gathered full sequence"
        if origin in ("reduce-scattered", "all-to-all"):
            return "seq-sharded", f"no shape; {text}"
        whole, shard = self.widths()
        fulls = {w for w in whole if w >= m.hidden} | {m.hidden}
        explains_full = nbytes % tokens_full == 0 and (nbytes // tokens_full) >= m.hidden
        explains_shard = nbytes == self.shard_bytes or (
            nbytes % tokens_full == 0 and (nbytes // tokens_full) in (set(shard) | {w for w in whole if w < m.hidden})
        )
        if origin in ("column", "attention") and explains_full:
            return "head-sharded", f"no shape; {text}"
        if explains_full and origin is None and self._collision_possible(nbytes // tokens_full, module, producer):
            explains_shard = True  # F undeclared: an MLP's [B, S, F/P] may have this size
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

    def _views(self, shape: tuple[int, ...]) -> list[tuple[bool, int, str, bool]]:
        """Every way ``shape`` reads as tokens x width: (full sequence?, width per token, layout,
        attention scores?). A shape can read several ways when dimensions coincide (S == H,
        B == P, B*S == H): each reading is kept, and the class must agree across them."""
        m = self.model
        B, S, P = m.batch, m.seq, m.sp_size
        s_local = S // P
        seqs = {S: True}
        if P > 1:
            seqs.setdefault(s_local, False)
        n = len(shape)
        out: list[tuple[bool, int, str, bool]] = []

        def add(axis: int, width_dims: tuple[int, ...], layout: str) -> None:
            full = seqs[shape[axis]]
            width = math.prod(width_dims)
            heads_first = layout in ("[B, h, S, d]", "[B*h, S, d]")
            if not (heads_first and shape[-1] == S and S != m.head_dim):  # [B, h, S, S] is scores only
                out.append((full, width, layout, False))
            # the sequence once more as the last axis: attention scores (keys across the sequence)
            if n >= 3 and axis != n - 1 and shape[-1] == S and S > 1:
                out.append((full, width, layout, True))

        if n >= 2 and shape[0] == B and shape[1] in seqs:
            add(1, shape[2:], "[B, S, ...]")
        if n >= 2 and shape[1] == B and shape[0] in seqs:
            add(0, shape[2:], "[S, B, ...]")
        if n == 4 and shape[0] == B and shape[2] in seqs and self._head_axis(shape[1], shape[3]):
            add(2, (shape[1], shape[3]), "[B, h, S, d]")
        if n >= 1 and B > 1 and shape[0] in (B * S, B * s_local):
            out.append((shape[0] == B * S and P > 1, math.prod(shape[1:]), "[B*S, ...]", False))
        if n >= 1 and B == 1 and shape[0] in seqs:
            add(0, shape[1:], "[S, ...]")
        if (
            n == 3
            and shape[1] in seqs
            and shape[0] % B == 0
            and shape[0] != B
            and self._head_axis(shape[0] // B, shape[2])
        ):
            add(1, (shape[0] // B, shape[2]), "[B*h, S, d]")
        if P > 1 and n >= 3 and not any(not v[0] and v[1] == m.hidden for v in out):
            # (not where the shape already reads as an exact [S/P, B, H] shard, as the all-to-all
            # that brings the heads home leaves it when P == S/P)
            # the sequence as P chunks of S/P on two axes: an all-to-all's buffer (DeepSpeed-Ulysses
            # lays q, k, v out as [P, S/P, B, h/P, d] sequence-first, [P, B, S/P, h/P, d] and
            # [B, P, S/P, ...] batch-first); the whole sequence, whatever each axis alone reads as
            for chunked, layout in (((0, 1), "[P, S/P, B, ...]"), ((0, 2), "[P, B, S/P, ...]"),
                                    ((1, 2), "[B, P, S/P, ...]")):  # fmt: skip
                batch_axis = ({0, 1, 2} - set(chunked)).pop()
                if shape[chunked[0]] == P and shape[chunked[1]] == s_local and shape[batch_axis] == B:
                    out.append((True, math.prod(shape[3:]), layout, False))
        if m.heads and any(v[2] == "[B, h, S, d]" for v in out):
            # declared heads matched one more axis than a [B, S, ...] reading: the more specific wins
            out = [v for v in out if v[2] == "[B, h, S, d]"]
        return out

    def _head_axis(self, h: int, d: int) -> bool:
        """Could (h, d) be a head count and a head dim? Any, unless the heads are declared."""
        m = self.model
        if not m.heads:
            return True
        counts = {m.heads, m.heads // m.sp_size or 1}
        if m.kv_heads:
            counts |= {m.kv_heads, max(m.kv_heads // m.sp_size, 1)}
        return h in counts and (m.head_dim is None or d in (m.head_dim, m.seq))

    def _by_shape(
        self, shape: tuple[int, ...], nbytes: int, module: str, producer: str, origin: str | None, text: str
    ) -> tuple[str, str]:
        m = self.model
        S, H, P = m.seq, m.hidden, m.sp_size
        views = self._views(shape)
        full_views = [v for v in views if v[0]]
        if origin == "gathered":
            wide = max((v[1] for v in full_views if not v[3]), default=0)
            if wide >= H or (self.full_bytes and nbytes >= self.full_bytes and (full_views or not views)):
                return "full", f"a gathered full sequence ({text}), {wide or '?'} wide per token"
            if wide and wide < H:
                return "head-sharded", f"gathered, full sequence, {wide} wide per token (a 1/{H / wide:.3g} share)"
            if not views:
                return "other", f"gathered ({text}), no token dimension (a weight or a statistic)"
        if not views:
            return "other", "no token dimension"
        if not full_views:
            return "seq-sharded", f"a sequence shard ({S // P} of {S} tokens)"
        if origin in ("column", "attention", "all-to-all"):
            heads = self._heads_of(shape, self._tokens(full_views[0]))
            if heads == "all" and origin != "column":
                return "full", f"full sequence, every head ({text})"
            whole, shard = self.widths()
            wide = [v[1] for v in full_views if not v[3]]
            # (H itself is no evidence: F/P may equal H when F is undeclared)
            if origin == "column" and wide and all(w in whole and whole[w] != "H" and w not in shard and w >= H
                                                   for w in wide):  # fmt: skip
                # the weight was whole, not this rank's 1/P of it: a declared F (or a*d) wide
                return "full", f"full sequence, {wide[0]} wide per token ({whole[wide[0]]}, unsharded): {text}"
            return "head-sharded", f"full sequence, a tensor-parallel shard: {text}"
        if origin == "row":
            wide = max(v[1] for v in full_views)
            if wide >= H:
                return "full", f"full sequence, {wide} wide per token: {text}, before its reduce-scatter"
        if origin == "reduce-scattered":
            return "seq-sharded", text
        judged = [self._by_view(v, shape, module, producer) for v in views]
        classes = {c for c, _ in judged}
        if len(classes) == 1:
            return judged[0]
        readings_text = "; ".join(f"as {v[2]}: {c}" for v, (c, _) in zip(views, judged))
        if classes <= {"seq-sharded", "head-sharded", "other"}:
            # no reading is full: the tensor is a shard (or a statistic) whichever it is
            cls = next(c for c in ("seq-sharded", "head-sharded", "other") if c in classes)
            return cls, f"not full whichever way its shape reads ({readings_text})"
        readings = "; ".join(f"as {v[2]}{' scores' if v[3] else ''}: {c}" for v, (c, _) in zip(views, judged))
        return "ambiguous", f"its shape reads several ways ({readings}) and its origin is not in the trace"

    def _tokens(self, view: tuple[bool, int, str, bool]) -> int:
        m = self.model
        return m.batch * (m.seq if view[0] else m.seq // m.sp_size)

    def _by_view(
        self, view: tuple[bool, int, str, bool], shape: tuple[int, ...], module: str, producer: str
    ) -> tuple[str, str]:
        """The class of one reading of a shape, from widths alone."""
        m = self.model
        S, H, P = m.seq, m.hidden, m.sp_size
        full_seq, width, layout, scores = view
        if not full_seq:
            return "seq-sharded", f"a sequence shard ({S // P} of {S} tokens, {layout})"
        if scores:
            heads = max(1, width // S)
            if m.heads is None:
                return "ambiguous", (
                    f"attention scores of {count(heads, 'head')} over the full sequence; pass --heads to judge"
                )
            if heads * P <= m.heads:
                return "head-sharded", f"attention scores of {count(heads, 'head')} (a/P = {m.heads // P})"
            return "full", f"attention scores of {count(heads, 'head')} over the full sequence (a = {m.heads})"
        heads = self._heads_of(shape, self._tokens(view))
        if heads == "all":
            return "full", f"full sequence, every head ({width} wide per token)"
        if heads == "share":
            return "head-sharded", f"full sequence, a 1/P share of the heads ({width} wide per token)"
        whole, shard = self.widths()
        in_whole, in_shard = width in whole, width in shard
        if in_shard and not in_whole:
            return "head-sharded", f"full sequence, {width} wide per token ({shard[width]})"
        if in_whole and in_shard:  # e.g. F/P = H: a 4H MLP at P = 4
            resolved = self._resolve_collision(width, module, whole[width], shard[width], producer)
            if resolved is not None:
                return resolved
            return "ambiguous", (
                f"full sequence, {width} wide per token: {whole[width]} (full) and {shard[width]} (a tensor-parallel "
                "shard) alike; the module does not tell which"
            )
        if width >= H:
            if self._collision_possible(width, module, producer):
                return "ambiguous", (
                    f"full sequence, {width} wide per token in an MLP module: a full tensor, or a [B, S, F/P] shard if "
                    "F/P = " + str(width) + "; pass --ffn to judge"
                )
            return "full", f"full sequence, {width} wide per token (H = {H})"
        return "head-sharded", f"full sequence, {width} wide per token: a 1/{H / width:.3g} share of H"

    def _heads_of(self, shape: tuple[int, ...], tokens: int) -> str | None:
        """For layouts with a head axis ([B, S, h, d], [B, h, S, d], [S, B, h, d]) and the head
        counts declared: 'all' heads (a, or g kv heads), a 1/P 'share', or None (either, or neither)."""
        m = self.model
        d, P = m.head_dim, m.sp_size
        if len(shape) < 3 or not (m.heads and d) or d not in shape:
            return None
        rest = math.prod(shape) // tokens
        if rest % d:
            return None
        h = rest // d
        whole = {m.heads} | ({m.kv_heads} if m.kv_heads else set())
        share = {m.heads // P} if m.heads % P == 0 else set()
        if m.kv_heads:
            share |= {m.kv_heads // P} if m.kv_heads % P == 0 else {max(m.kv_heads, P) // P}  # kv replicated up to P
        if h in share and h not in whole:
            return "share"
        if h in whole and h not in share:
            return "all"
        return None

    def _resolve_collision(
        self, width: int, module: str, whole: str, shard: str, producer: str = ""
    ) -> tuple[str, str] | None:
        """A width both whole and a shard: the module, or the op that produced the tensor, says
        which kind of shard it would be."""
        if shard.startswith(("F", "2F")) and _MLP.search(module) and not _ATTN.search(module):
            return "head-sharded", f"full sequence, {width} wide per token: {shard} in MLP module {module}"
        if shard.startswith(("F", "2F")) and _MLP_OPS.match(producer) and not _ATTN.search(module):
            return "head-sharded", f"full sequence, {width} wide per token: {shard}, computed by {producer}"
        if not shard.startswith(("F", "2F")) and _ATTN.search(module):
            return "head-sharded", f"full sequence, {width} wide per token: a head shard in attention module {module}"
        return None

    def _collision_possible(self, width: int, module: str, producer: str = "") -> bool:
        """Could a tensor this wide be a 1/P MLP shard the flags did not declare? (In an MLP
        module, or computed by an MLP's ops, when F is not declared.)"""
        m = self.model
        if m.ffn is not None:
            return width in (m.ffn // m.sp_size, 2 * m.ffn // m.sp_size) and m.ffn % m.sp_size == 0
        return bool(_MLP.search(module)) or (bool(_MLP_OPS.match(producer)) and not _ATTN.search(module))


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


@dataclass
class ShardingReport:
    model: ModelShape
    saved: pd.DataFrame
    """Every retained tensor of every rank, with its class (``class``, ``why``)."""
    findings: list[Finding]
    layers: pd.DataFrame
    """Per rank and layer: retained bytes, full bytes, and Korthikanti's expectation."""
    verdict: Verdict
    notes: list[str] = field(default_factory=list)
    unseen_frees: dict[int, int] = field(default_factory=dict)
    """Per rank: allocations alive at the boundary whose free is not in the trace (not judged)."""

    @property
    def ok(self) -> bool:
        return self.verdict.status == "pass"

    def counts(self) -> dict[str, int]:
        return {c: int((self.saved["class"] == c).sum()) for c in CLASSES}

    def to_dict(self) -> dict[str, Any]:
        saved = self.saved.copy()
        saved["shape"] = saved["shape"].map(lambda s: list(s) if isinstance(s, (tuple, list)) else None)
        return {
            "ok": self.ok,
            "verdict": self.verdict.to_dict(),
            "model": self.model.to_dict(),
            "counts": self.counts(),
            "findings": [f.to_dict() for f in self.findings],
            "layers": _records(self.layers),
            "saved": _records(saved.drop(columns=["alloc_ns", "free_ns"], errors="ignore")),
            "notes": self.notes,
            "unseen_frees": [{"rank": r, "allocations": n} for r, n in sorted(self.unseen_frees.items())],
        }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for rec in frame.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()})
    return out


def check_sharding(
    retained: list[Retention],
    model: ModelShape,
    *,
    allow: tuple[str, ...] = (),
    strict: bool = False,
    expected_per_layer: float | None = None,
) -> ShardingReport:
    """Classify every retained tensor of every rank and conclude. ``allow``: module globs that
    may keep full tensors; ``strict``: ambiguous and unknown tensors fail too."""
    judge = Judge(model)
    frames = [r.tensors for r in retained if not r.tensors.empty]
    saved = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=retained[0].tensors.columns)
    for column in ("origin", "origin_text", "unseen_free"):
        if column not in saved:
            saved[column] = None
    classes = [
        judge.classify(
            tuple(s) if isinstance(s, (tuple, list)) else None, int(n),
            int(sb) if sb is not None and sb == sb else None, mod if isinstance(mod, str) else None,
            prod if isinstance(prod, str) else None, org if isinstance(org, str) else None,
            txt if isinstance(txt, str) else None,
        )
        for s, n, sb, mod, prod, org, txt in zip(
            saved["shape"], saved["nbytes"], saved["storage_bytes"], saved["module"],
            saved["producer"].fillna(saved["alloc_op"]), saved["origin"], saved["origin_text"])
    ]  # fmt: skip
    saved["class"] = [c for c, _ in classes]
    saved["why"] = [w for _, w in classes]
    unseen_mask = saved["unseen_free"].map(lambda v: v is True or v == 1).astype(bool)
    # a tensor whose free the trace does not show matters only if it would break the contract:
    # then the verdict cannot be PASS (nor FAIL: it may have died before the boundary)
    full_unseen = unseen_mask & (saved["class"] == "full")
    # the rest are counted (unseen_frees), not rows: whether gloo's thread freed them is a race,
    # and a report must not change with it
    keep = ~unseen_mask | full_unseen
    saved = saved[keep].reset_index(drop=True)
    unseen_mask = unseen_mask[keep].reset_index(drop=True)
    full_unseen = full_unseen[keep].reset_index(drop=True)
    if full_unseen.any():
        saved.loc[full_unseen, "why"] = "full-size, but its free is not in the trace: " + saved.loc[full_unseen, "why"]
        saved.loc[full_unseen, "class"] = "full-unknown-life"
    findings: list[Finding] = []
    for rec in saved[~unseen_mask].to_dict(orient="records"):
        cls = rec["class"]
        if cls not in ("full", "ambiguous", "unknown") or (cls != "full" and not strict):
            continue
        module = rec["module"] or "<unknown module>"
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in allow):
            continue
        findings.append(_finding(rec, judge, strict))
    findings = merge_ranks(findings)
    layer_rows = []
    # per rank and layer, the boundary (step, micro-batch) that kept the most
    by_boundary = saved[saved["layer"].notna()].assign(
        _step=saved["step"].astype(float).fillna(-1), _micro=saved["micro_batch"].astype(float).fillna(0)
    )  # fmt: skip
    for (rank, layer), per_layer in by_boundary.groupby(["rank", "layer"]):
        worst = max((g for _, g in per_layer.groupby(["_step", "_micro"])), key=lambda g: int(g["storage_bytes"].sum()))
        layer_rows.append({
            "rank": int(rank), "layer": int(layer), "saved_tensors": len(worst),
            "judged": int(worst["class"].isin(JUDGED).sum()), "measured_bytes": int(worst["storage_bytes"].sum()),
            "full_bytes": int(worst[worst["class"] == "full"]["storage_bytes"].sum()),
            "expected_bytes": expected_per_layer,
        })  # fmt: skip
    layers = pd.DataFrame(
        layer_rows,
        columns=["rank", "layer", "saved_tensors", "judged", "measured_bytes", "full_bytes", "expected_bytes"],
    )
    notes = [n for r in retained for n in r.notes]
    notes = list(dict.fromkeys(notes))
    unseen = sum(r.unseen_frees for r in retained)
    if unseen:
        notes.append(
            f"{unseen} allocations alive at the boundary were not judged: their free is not in the trace (gloo and "
            "NCCL release a collective's tensors on threads the profiler does not record)"
        )
    counts = {c: int((saved["class"] == c).sum()) for c in CLASSES}
    unseen_full = saved[full_unseen]
    if counts["ambiguous"]:
        notes.append(
            f"{count(counts['ambiguous'], 'tensor')} {'is' if counts['ambiguous'] == 1 else 'are'} ambiguous: "
            f"{_first_why(saved, 'ambiguous')}"
        )
    if counts["unknown"]:
        notes.append(
            f"{count(counts['unknown'], 'tensor')} without a shape, of a size that identifies nothing: not judged"
        )
    verdict = _conclude(retained, saved[~unseen_mask], findings, model, counts, strict, unseen_full)
    unseen_by_rank = {r.rank: r.unseen_frees for r in retained if r.unseen_frees}
    return ShardingReport(model, saved, findings, layers, verdict, notes, unseen_by_rank)


def _first_why(saved: pd.DataFrame, cls: str) -> str:
    rows = saved[saved["class"] == cls]
    return str(rows["why"].iloc[0]) if len(rows) else ""


def _finding(rec: dict[str, Any], judge: Judge, strict: bool) -> Finding:
    module = rec["module"] or "<unknown module>"
    shape = "x".join(map(str, rec["shape"])) if isinstance(rec["shape"], (tuple, list)) else f"{rec['nbytes']} bytes"
    layer = int(rec["layer"]) if rec["layer"] is not None and rec["layer"] == rec["layer"] else None
    where = _boundary(rec)
    if rec["class"] != "full":
        return Finding(
            "error", "sharding", f"{rec['class']}-tensor",
            f"{module} keeps a [{shape}] tensor across the forward/backward boundary{where} that cannot be judged "
            f"(--strict): {rec['why']}",
            (int(rec["rank"]),), layer, module, page="memory",
        )  # fmt: skip
    storage = int(rec["storage_bytes"])
    excess = storage - storage / judge.model.sp_size
    origin = [str(rec["holder"])] if rec.get("holder") else []
    if rec.get("alloc_op"):
        origin.append(f"allocated by {rec['alloc_op']}")
    if rec.get("saved_by") and rec.get("saved_by") != rec.get("freed_in"):
        origin.append(f"saved by {rec['saved_by']}")
    dtype = f"{rec['dtype']} " if rec.get("dtype") else ""
    return Finding(
        "error", "sharding", "full-size-save",
        f"{module} keeps a full-sequence [{shape}] {dtype}tensor across the forward/backward boundary{where} "
        f"({human_bytes(storage)}, {human_bytes(excess)} more than a 1/{judge.model.sp_size} shard"
        + (f"; {'; '.join(origin)}" if origin else "") + f"): {rec['why']}",
        (int(rec["rank"]),), layer, module, page="memory",
    )  # fmt: skip


def _boundary(rec: dict[str, Any]) -> str:
    """' of step 3, micro-batch 1' where the trace has several boundaries, else ''."""
    label = rec.get("boundary")
    return f" of {label}" if isinstance(label, str) and label else ""


def _conclude(
    retained: list[Retention], saved: pd.DataFrame, findings: list[Finding], model: ModelShape,
    counts: dict[str, int], strict: bool, unseen_full: pd.DataFrame,
) -> Verdict:  # fmt: skip
    judged = sum(counts[c] for c in JUDGED)
    errors = [f for f in findings if f.severity == "error"]
    by_size = int((saved["class"].isin(JUDGED) & ~saved["shape"].map(lambda s: isinstance(s, (tuple, list)))).sum())
    summary = (
        f"{count(judged, 'retained tensor')} judged on {count(len(retained), 'rank')} "
        f"({counts['seq-sharded']} sequence-sharded, "
        f"{counts['head-sharded']} head-sharded, {counts['full']} full"
        + (f"; {by_size} by size alone, with no recorded shape" if by_size else "")
        + ")"
    )
    if errors:
        full = [f for f in errors if f.code == "full-size-save"]
        what = (
            f"{len(full)} full-size {'tensor' if len(full) == 1 else 'tensors'} kept for backward"
            if full
            else f"{len(errors)} unjudgeable {'tensor' if len(errors) == 1 else 'tensors'} (--strict)"
        )
        return Verdict("fail", "FAIL", f"{what}; {summary}")
    reasons: list[str] = []
    no_backward = [r.rank for r in retained if r.boundary_ns is None]
    if no_backward:
        reasons.append(
            f"the profiled window has no backward on {_ranks(no_backward)}: what is kept for backward cannot be told "
            "from the rest; profile a whole training step"
        )
    blind = [r.rank for r in retained if not r.has_records and not r.has_memory]
    if blind:
        reasons.append(
            f"{_ranks(blind)} have neither [memory] events nor sptrace.saved records: profile with "
            "profile_memory=True (sptrace.instrument adds exact shapes)"
        )
    if not reasons:
        B, S, H, P = model.batch, model.seq, model.hidden, model.sp_size
        residual = {(B, S // P, H), (S // P, B, H), (B * S // P, H), (B, S, H), (S, B, H), (B * S, H)}
        if B == 1:
            residual |= {(S // P, H), (S, H)}
        seen = set().union(*(r.shapes_seen for r in retained))
        if seen and not residual & seen and not any(_hidden_in_heads(shape, B, S, P, H) for shape in seen):
            reasons.append(
                f"the declared shape (B={B}, S={S}, H={H}, P={P}) matches no tensor in the trace: no op took a "
                f"[B, S/P, H] = [{B}, {S // P}, {H}] activation (in any layout); is the declared config right?"
            )
    if not reasons:
        token_dims = saved["class"].isin(JUDGED).any()
        if not token_dims:
            if len(saved) and not saved["shape"].map(lambda s: isinstance(s, (tuple, list))).any():
                reasons.append(
                    f"no retained tensor could be judged: none has a known shape ({len(saved)} by bytes only)"
                )
            else:
                reasons.append(
                    f"the declared shape (B={model.batch}, S={model.seq}, S/P={model.seq // model.sp_size}, "
                    f"H={model.hidden}) matches no tensor the trace kept: is the declared config right?"
                    if counts["ambiguous"] == 0
                    else f"no retained tensor could be judged ({counts['ambiguous']} ambiguous)"
                )
        else:
            seen = sorted(set().union(*(r.layers_seen for r in retained)))
            judged_layers = set(saved[saved["class"].isin(JUDGED)]["layer"].dropna().astype(int))
            blank = [layer for layer in seen if layer not in judged_layers]
            if blank:
                reasons.append(
                    f"no retained tensor of layer{'s' if len(blank) > 1 else ''} {rank_ranges(blank)} could be judged"
                )
    if counts["ambiguous"] and not strict:
        rows = saved[saved["class"] == "ambiguous"]
        where = sorted({m or "<unknown module>" for m in rows["module"]})
        reasons.append(
            f"{counts['ambiguous']} retained {'tensor is' if counts['ambiguous'] == 1 else 'tensors are'} ambiguous "
            f"(in {', '.join(where[:4])}{', ...' if len(where) > 4 else ''}): {rows['why'].iloc[0]}"
        )
    if len(unseen_full):
        where = sorted({m or "<unknown module>" for m in unseen_full["module"]})
        reasons.append(
            f"{len(unseen_full)} full-size {'allocation has' if len(unseen_full) == 1 else 'allocations have'} no "
            f"recorded free (in {', '.join(where[:4])}{', ...' if len(where) > 4 else ''}): a collective's backend "
            "may have released it on a thread the profiler does not record, or a Python reference still holds it; "
            "the trace cannot tell which (on CUDA the allocator's count decides)"
        )
    if reasons:
        return Verdict("undecided", "CANNOT DECIDE", reasons[0], tuple(reasons))
    caveats = []
    if counts["unknown"] and not strict:
        caveats.append(f"{count(counts['unknown'], 'tensor')} of unknown shape not judged")
    text = f"every judged tensor is sharded; {summary}" + (f"; {', '.join(caveats)}" if caveats else "")
    return Verdict("pass", "PASS", text, tuple(caveats))


def _hidden_in_heads(shape: tuple[int, ...], B: int, S: int, P: int, H: int) -> bool:
    """A [B, S', a, d] or [S', B, a, d] activation with a*d == H (S' = S or S/P): the hidden state
    split into heads, as an attention module alone takes it (DeepSpeed's DistributedAttention)."""
    if len(shape) != 4 or math.prod(shape[2:]) != H:
        return False
    lead = {tuple(shape[:2])}
    return bool(lead & {(B, S // P), (S // P, B), (B, S), (S, B)})


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def render_junit(report: ShardingReport, run: str | None = None, seconds: float | None = None,
                 started: str | None = None) -> str:  # fmt: skip
    """JUnit XML: one test case per module (all ranks together), failed when that module keeps a
    full tensor, with the rank set in the message; one more case for the verdict itself. ``run``
    names the suite (``sptrace check RUN``); ``seconds`` (the whole check, its analysis included)
    is the suite's time and the verdict case's, ``started`` (ISO 8601) its timestamp."""
    from xml.sax.saxutils import quoteattr

    saved = report.saved
    cases = []
    failures = 0
    modules = sorted({m or "<unknown module>" for m in saved["module"]}) if len(saved) else []
    for module in modules:
        bad = [f for f in report.findings if (f.module or "<unknown module>") == module]
        name = quoteattr(module)
        if bad:
            failures += 1
            text = quoteattr("; ".join(f.text() for f in bad))
            cases.append(f'    <testcase classname="sptrace.sharding" name={name}><failure message={text}/></testcase>')
        else:
            cases.append(f'    <testcase classname="sptrace.sharding" name={name}/>')
    verdict = report.verdict
    name = quoteattr("verdict")
    timed = "" if seconds is None else f' time="{seconds:.3f}"'
    if verdict.status == "undecided":
        error = f"<error message={quoteattr(verdict.line())}/>"
        cases.append(f'    <testcase classname="sptrace.sharding" name={name}{timed}>{error}</testcase>')
    else:
        cases.append(f'    <testcase classname="sptrace.sharding" name={name}{timed}/>')
    errors = int(verdict.status == "undecided")
    suite = quoteattr("sptrace check" + (f" {run}" if run else ""))
    stamp = "" if started is None else f" timestamp={quoteattr(started)}"
    head = (f'  <testsuite name={suite} tests="{len(cases)}" failures="{failures}" errors="{errors}"'
            f"{timed}{stamp}>")  # fmt: skip
    return "\n".join(
        ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>", head, *cases, "  </testsuite>", "</testsuites>", ""]
    )
