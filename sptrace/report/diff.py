"""A finished comparison (sptrace.diff.RunDiff) as text (one line a change, the largest first) or
Markdown (for a pull-request comment or a CI job summary). Computes nothing."""

from __future__ import annotations

from sptrace.diff import CommChange, KeptChange, RunDiff
from sptrace.timechange import Spread, TimeChange
from sptrace.vocab.units import human_bytes

MODULE_LINES = 10
"""Modules' own-time changes shown in text, the largest first."""


def _count(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.2f}"


def _signed_bytes(x: float) -> str:
    return ("+" if x > 0 else "-" if x < 0 else "") + human_bytes(abs(x))


def comm_line(c: CommChange) -> str:
    b, n = c.base, c.new
    if b is None and n is not None:
        return (f"+ {c.where}: added, {_count(n.count)} per rank and step "
                f"({human_bytes(n.per_op(n.wire_bytes))} on the wire each){_modules(n.modules)}")  # fmt: skip
    if n is None and b is not None:
        return (f"- {c.where}: removed, was {_count(b.count)} per rank and step "
                f"({human_bytes(b.per_op(b.wire_bytes))} on the wire each){_modules(b.modules)}")  # fmt: skip
    assert b is not None and n is not None
    parts = []
    if "count" in c.changed:
        parts.append(f"{_count(b.count)} -> {_count(n.count)} per rank and step")
    if "size" in c.changed:
        each = (human_bytes(s.per_op(s.wire_bytes)) for s in (b, n))
        given = (human_bytes(s.per_op(s.in_bytes)) for s in (b, n))
        parts.append("{} -> {} on the wire each".format(*each) + " (input {} -> {})".format(*given))
    if "group size" in c.changed:
        parts.append(f"group size {_list(b.group_sizes)} -> {_list(n.group_sizes)}")
    if "dtype" in c.changed:
        parts.append(f"dtype {_list(b.dtypes)} -> {_list(n.dtypes)}")
    return f"~ {c.where}: " + "; ".join(parts) + f" (wire {_signed_bytes(c.wire_delta)} per rank and step)"


def kept_line(k: KeptChange) -> str:
    b, n = k.base, k.new
    if k.became_full and n is not None:
        shapes = ", ".join(n.full_shapes) or "shape unknown"
        holders = f"; held by {'; '.join(n.holders)}" if n.holders else ""
        was = f" (the baseline kept {b.full})" if b is not None and b.full else ""
        return f"NEW FULL-SIZE SAVE {k.module}: {n.full} full-size tensor(s) {shapes}{was}{holders}"
    if b is None and n is not None:
        return f"+ retained {k.module}: {n.tensors} tensor(s), {human_bytes(n.bytes)} kept (new)"
    if n is None and b is not None:
        return f"- retained {k.module}: no longer keeps its {b.tensors} tensor(s), {human_bytes(b.bytes)}"
    assert b is not None and n is not None
    text = (
        f"~ retained {k.module}: {b.tensors} -> {n.tensors} tensor(s), {human_bytes(b.bytes)} -> {human_bytes(n.bytes)}"
    )
    if n.full < b.full:
        text += f"; full-size {b.full} -> {n.full}"
    return text


def time_line(t: TimeChange) -> str:
    unit = " a token" if t.per_token else ""

    def ms(s: Spread | None) -> str:
        if s is None:
            return "?"
        value = (lambda x: f"{x * 1e3:.3f} us") if t.per_token else (lambda x: f"{x:.2f} ms")
        band = f" [{value(s.low)}-{value(s.high)}]" if s.ranks > 1 else ""
        return value(s.median) + band

    rel = t.relative
    share = (
        f" of the step ({t.of_step:.2f} ms)" if t.of_step and not t.per_token else " of the step" if t.of_step else ""
    )
    judged = (
        "" if rel is None
        else f" ({rel:+.1%}, " + ("outside both runs' spread across ranks" if t.outside_noise else "within the noise")
        + f", tolerance {t.tolerance:.0%}{share})"
    )  # fmt: skip
    return f"{t.what} time{unit}: {ms(t.base)} -> {ms(t.new)}{judged}"


def _modules(modules: tuple[str, ...]) -> str:
    return f" in {', '.join(modules[:3])}{' ...' if len(modules) > 3 else ''}" if modules else ""


def _list(values: tuple) -> str:
    return "/".join(map(str, values)) or "?"


def _header(d: RunDiff) -> list[str]:
    lines = [f"sptrace diff: {d.base} -> {d.new}"]
    if d.shape_changes:
        change = ", ".join(f"{f} {a} -> {b}" for f, a, b in d.shape_changes)
        how = " (bytes and time compared per token)" if d.per_token else ""
        lines.append(f"the job changed: {change}{how}")
    if d.config_changes:
        lines.append("run.json config: " + ", ".join(f"{k} {a} -> {b}" for k, a, b in d.config_changes))
    return lines


def render_text(d: RunDiff) -> str:
    lines = _header(d)
    lines.append("")
    for k in d.new_full:
        lines.append(kept_line(k))
    wb, wn = d.wire
    if wb is not None and wn is not None:
        rel = f" ({wn / wb - 1:+.1%})" if wb else ""
        lines.append(f"wire bytes per rank and step: {human_bytes(wb)} -> {human_bytes(wn)}{rel}")
        judged = d.wire_judged
        if d.per_token and judged is not None:
            lines.append(f"  per token: {judged[0]:.2f} B -> {judged[1]:.2f} B")
    lines += [comm_line(c) for c in d.comm_changed]
    lines += [kept_line(k) for k in d.kept_changed if not k.became_full]
    lines += [f"~ kept in {_layer(layer)}: {human_bytes(b)} -> {human_bytes(n)} at its largest rank and boundary"
              for layer, (b, n) in d.kept_layers.items() if b != n]  # fmt: skip
    lines += [f"? {_layer(layer)}: {human_bytes(b)} -> {human_bytes(n)} alive at the boundary with no holder the trace "
              "can show (a buffer a collective filled: the backend's or the model's)"
              for layer, b, n in d.undecided]  # fmt: skip
    lines += [time_line(t) for t in sorted(d.time, key=lambda t: -abs(t.relative or 0))]
    moved = d.module_time_moved
    lines += [f"own time, {time_line(t)}" for t in moved[:MODULE_LINES]]
    if len(moved) > MODULE_LINES:
        lines.append(f"  ... and {len(moved) - MODULE_LINES} more modules' own time (--format json lists all)")
    lines += [f"note: {n}" for n in d.notes]
    lines.append("")
    lines.append(verdict_line(d))
    return "\n".join(lines) + "\n"


def _layer(layer: int) -> str:
    return "outside layers" if layer < 0 else f"layer {layer}"


def verdict_line(d: RunDiff) -> str:
    if d.regressions:
        return "REGRESSION: " + "; ".join(d.regressions)
    if d.undecided:
        return ("CANNOT DECIDE: " + ", ".join(_layer(layer) for layer, _, _ in d.undecided)
                + " hold more bytes than the baseline whose holder the trace does not show; run the model under "
                "sptrace.instrument and profile two steps")  # fmt: skip
    unjudged = "" if all(d.classes) else " (full-size saves not classed: declare B, S and H; retained bytes compared)"
    if d.same:
        return "NO CHANGE: the runs agree on every collective, retained tensor and time" + unjudged
    return "NO REGRESSION: no new full-size save, no layer keeping more, no more wire bytes, no slower step" + unjudged


def render_markdown(d: RunDiff) -> str:
    head = _header(d)
    lines = [f"### {verdict_line(d)}", "", f"`{d.base}` -> `{d.new}`", ""]
    lines += [f"- {line}" for line in head[1:]]
    if d.new_full:
        lines += [
            "",
            "**New full-size saves**",
            "",
            "| module | full-size tensors | shapes | held by |",
            "|---|---|---|---|",
        ]
        for k in d.new_full:
            n = k.new
            assert n is not None
            lines.append(f"| `{k.module}` | {n.full} | {', '.join(n.full_shapes)} | {'; '.join(n.holders)} |")
    changed = d.comm_changed
    wb, wn = d.wire
    if changed or (wb is not None and wn is not None):
        lines += ["", "**Communication** (per rank and step)", ""]
        if wb is not None and wn is not None:
            lines += [f"Wire bytes: {human_bytes(wb)} -> {human_bytes(wn)}", ""]
        if changed:
            lines += [
                "| phase | layer | kind | change | count | wire each | wire delta |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in changed:
                b, n = c.base, c.new
                count = f"{_count(b.count) if b else 0} -> {_count(n.count) if n else 0}"
                each = " -> ".join(human_bytes(s.per_op(s.wire_bytes)) if s else "-" for s in (b, n))
                layer = "-" if c.layer is None else str(c.layer)
                lines.append(f"| {c.phase} | {layer} | {c.kind} | {', '.join(c.changed)} | {count} | {each} | "
                             f"{_signed_bytes(c.wire_delta)} |")  # fmt: skip
    kept = d.kept_changed
    if kept:
        lines += ["", "**Retained for backward** (the largest rank and boundary)", "",
                  "| module | tensors | kept | full-size |", "|---|---|---|---|"]  # fmt: skip
        for k in kept:
            b, n = k.base, k.new
            lines.append(
                f"| `{k.module}` | {b.tensors if b else 0} -> {n.tensors if n else 0} | "
                f"{human_bytes(b.bytes) if b else '-'} -> {human_bytes(n.bytes) if n else '-'} | "
                f"{b.full if b else 0} -> {n.full if n else 0} |"
            )
        moved = [(layer, b, n) for layer, (b, n) in d.kept_layers.items() if b != n]
        if moved:
            lines += ["", "Kept per layer: " + "; ".join(f"layer {x}: {human_bytes(b)} -> {human_bytes(n)}"
                                                         for x, b, n in moved)]  # fmt: skip
    if d.time:
        lines += ["", "**Time** (median over ranks [least-most])", ""]
        lines += [f"- {time_line(t)}" for t in d.time]
        lines += [f"- own time, {time_line(t)}" for t in d.module_time_moved[:MODULE_LINES]]
    if d.notes:
        lines += [""] + [f"> note: {n}" for n in d.notes]
    return "\n".join(lines) + "\n"
