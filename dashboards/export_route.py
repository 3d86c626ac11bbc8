"""The dashboard's merged-trace download (sptrace.export): ``/export/merged-trace.json.gz?run=I&ranks=0-7``
streams, gzip, the merged trace of run I of those the dashboard serves, for those ranks (the
Timeline links the ranks it shows); ``window=START:END`` (ms from the step start) as the CLI's.
Runs are named by index into the store, so no path from the URL ever reaches the filesystem."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlencode

from dash import Dash
from sptrace.dashboards.store import RunStore

from sptrace.vocab.errors import SptraceError

if TYPE_CHECKING:
    from flask import Response

EXPORT_PATH = "/export/merged-trace.json.gz"


def export_href(run: int, ranks: list[int] | None = None) -> str:
    """The download's URL for a run's ranks (None: sptrace.export.choose_ranks' default)."""
    query: dict[str, int | str] = {"run": run}
    if ranks is not None:
        query["ranks"] = _compact(ranks)
    return f"{EXPORT_PATH}?{urlencode(query)}"


def _compact(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (sptrace.vocab.units.parse_ranks reads it back)."""
    from sptrace.vocab.units import rank_ranges

    return rank_ranges(ranks).replace(" ", "")


def register_export(app: Dash, store: RunStore) -> None:
    """The download's route on the app's Flask server (the app's 404 guard lets EXPORT_PATH by)."""
    from flask import Response, request, stream_with_context

    def download() -> Response | tuple[str, int, dict[str, str]]:
        from sptrace.export import ExportOptions, ExportSummary, gzip_chunks, parse_window, trace_chunks
        from sptrace.vocab.units import parse_ranks

        text = request.args.get("run", "0")
        if not text.isdigit() or not 0 <= int(text) < len(store):
            return _problem(f"no run {text!r}: this dashboard serves runs 0 to {len(store) - 1}", 404)
        run = int(text)
        a = store.get(run)
        if isinstance(a, SptraceError):
            return _problem(str(a), 404)
        try:
            ranks = parse_ranks(request.args["ranks"]) if request.args.get("ranks") else None
            window = parse_window(request.args["window"]) if request.args.get("window") else None
            chunks = trace_chunks(a, ExportOptions(ranks=ranks, window_ms=window), ExportSummary())
        except SptraceError as exc:  # a rank not in the run, a window outside it: said before any byte is sent
            return _problem(str(exc), 400)
        name = f"{store.name(run)}-merged.json.gz"
        return Response(stream_with_context(gzip_chunks(chunks)), mimetype="application/gzip",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})  # fmt: skip

    app.server.add_url_rule(EXPORT_PATH, "sptrace_export", download)


def _problem(text: str, status: int) -> tuple[str, int, dict[str, str]]:
    return text + "\n", status, {"Content-Type": "text/plain; charset=utf-8"}
