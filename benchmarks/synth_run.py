"""Synthetic many-rank runs for scale tests: a real W-rank run replicated to N ranks, with what a
large job's traces have and plain copies lack, written one rank file at a time.

    python benchmarks/synth_run.py OUT --ranks 10000 [--source RUN] [--seed 0]
    python benchmarks/synth_run.py OUT --ranks 8 --repeat 800 --source RUN   # ranks of 800 windows each

``--repeat N`` makes each rank N times longer: the source's profiled window repeated N times on
shifted clocks (``repeated``), with every id renumbered (external, record-function, correlation,
Python, autograd sequence, event index, flow ids, collective sequence numbers) and each
``ProfilerStep#k`` renamed, so that the rank is one longer valid trace of N times the steps. It is
written copy by copy: memory holds one copy of one rank's events.

Disk: the source's size times N/W (the corpus DLRM run: about 0.8 MB a rank, so 1024 ranks take
about 0.8 GB and 10,000 about 7.8 GB); memory: the source's W traces, decoded once, and one rank
being written.

Copy c of source rank r becomes rank c*W + r (its process groups moved to the copy's ranks, as
``sptrace.load.replicate`` does), and then each rank gets

- a **clock offset**: every timestamp of the rank moves by a constant drawn in +-``offset_us``
  (hosts' clocks disagree; the analyzer must align them from the collectives);
- **arrival jitter**: at its middle NCCL kernel, the rank's compute kernel before it runs up to
  ``jitter_us`` longer, so the ranks arrive at that collective at different times; the
  collective lasts until the last member arrives, and its members run on from there in step.
  The members are the rank's copy when the source names its process groups (each copy a job of
  its own), else every rank of the run (the source's collectives are on the default group, which
  the copies now share: one job of N ranks). Separate jobs share no collective, so no analyzer
  can align their clocks to each other's: a run of them has a critical path per job, and the
  planted stragglers are named one job at a time;
- one **planted straggler** per 1000 ranks (at least one): its compute kernel before that
  collective runs ``straggler_us`` longer (the i-th straggler's 10 % more than the one before, so
  the last planted is the slowest of the run and the one its critical path must name).

What was planted is written to ``OUT/synth-planted.txt`` (JSON) (``stragglers``: rank -> delay in us,
``offsets_us``: rank -> clock offset), the truth a benchmark checks the analyzer against.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from sptrace.load.files import RUN_FILE, find_traces
from sptrace.load.replicate import NAME_KEYS, RANK_KEYS, move_groups, read_document
from sptrace.vocab.errors import TraceError, UsageError

HERE = Path(__file__).resolve().parent
SYNTH_FILE = "synth-planted.txt"
"""What was planted (JSON; not named .json, so that no trace reader takes it for a trace)."""
Event = Mapping[str, object]


@dataclass(frozen=True)
class Plan:
    """How the copies differ from their source."""

    offset_us: float = 20_000.0
    jitter_us: float = 100.0
    straggler_us: float = 4_000.0
    seed: int = 0


@dataclass
class Planted:
    """What a synthesis planted: the truth to check the analyzer against."""

    ranks: int
    stragglers: dict[int, float] = field(default_factory=dict)
    offsets_us: dict[int, float] = field(default_factory=dict)

    @property
    def slowest(self) -> int:
        return max(self.stragglers, key=lambda r: self.stragglers[r])

    def to_json(self) -> str:
        return json.dumps({"ranks": self.ranks, "stragglers": self.stragglers, "offsets_us": self.offsets_us})


def straggler_ranks(n: int, world: int, rng: random.Random) -> list[int]:
    """One rank per 1000 (at least one), each in its own thousand, never two in one copy."""
    count = max(1, n // 1000)
    span = n // count
    return [i * span + rng.randrange(min(span, n - i * span)) for i in range(count)]


def names_groups(doc: Mapping[str, object]) -> bool:
    """Whether a trace names its process groups (distributedInfo's pg_config, or events' args)."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and info.get("pg_config"):
        return True
    keys = (*RANK_KEYS, *NAME_KEYS)
    events = doc.get("traceEvents")
    return any(isinstance(e.get("args"), dict) and any(k in e["args"] for k in keys) for e in events or ())


def _is_nccl(e: Event) -> bool:
    return e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()


def _anchor(events: list[Event]) -> tuple[int | None, int | None]:
    """The index of the rank's middle NCCL kernel and of its last compute kernel ending before it."""
    nccl = sorted((i for i, e in enumerate(events) if _is_nccl(e)), key=lambda i: float(events[i]["ts"]))
    if not nccl:
        return None, None
    at = nccl[len(nccl) // 2]
    start = float(events[at]["ts"])
    before = [
        i for i, e in enumerate(events)
        if e.get("cat") == "kernel" and not _is_nccl(e) and float(e["ts"]) + float(e.get("dur", 0)) <= start
    ]  # fmt: skip
    last = max(before, key=lambda i: float(events[i]["ts"]) + float(events[i].get("dur", 0)), default=None)
    return at, last


def perturbed(events: list[Event], anchors: tuple[int | None, int | None], delay: float, latest: float,
              offset: float, moved: object) -> list[Event]:  # fmt: skip
    """The rank's events with its arrival at the anchor collective ``delay`` us late, the
    collective waiting for its copy's ``latest`` arrival, every timestamp moved by ``offset``,
    and the ``args`` of events naming process groups moved (``moved``: a function of args)."""
    at, last = anchors
    start = float(events[at]["ts"]) if at is not None else float("inf")
    end = start + float(events[at].get("dur", 0)) if at is not None else float("inf")
    out = []
    for i, e in enumerate(events):
        ts = e.get("ts")
        if ts is None:
            out.append(e)
            continue
        t = float(ts)
        shift = offset + (latest if t >= end else delay if t >= start else 0.0)
        new = dict(e)
        new["ts"] = round(t + shift, 3) if isinstance(ts, float) else round(t + shift)
        if i == last:
            new["dur"] = e.get("dur", 0) + round(delay)
        elif i == at:
            new["dur"] = e.get("dur", 0) + round(latest - delay)
        args = new.get("args")
        if moved is not None and isinstance(args, dict) and any(k in args for k in (*RANK_KEYS, *NAME_KEYS)):
            new["args"] = moved(args)  # type: ignore[operator]
        out.append(new)
    return out


ID_KEYS = (
    "External id",
    "Record function id",
    "correlation",
    "Sequence number",
    "Python id",
    "Python parent id",
    "Ev Idx",
    "Seq",
    "seq",
    "Collective seq",
)
"""Event args that number something within a trace (renumbered per copy by ``repeated``)."""
_STEP = "ProfilerStep#"


def repeated(events: list[Event], copies: int) -> list[list[Event]]:
    """The rank's window ``copies`` times, one list of events per copy: copy k shifted by k windows
    (the window's span and a gap of 1 % of it), each id of ID_KEYS and each flow id moved past the
    previous copies' (by one more than its largest value), each ``ProfilerStep#s`` renamed to
    ``s + k * steps``; events without a time (metadata) in copy 0 alone."""
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    start = min(float(e["ts"]) for e in timed)
    end = max(float(e["ts"]) + float(e.get("dur", 0) or 0) for e in timed)
    period = (end - start) * 1.01 + 1.0
    stride = {k: 1 + max((int(e["args"][k]) for e in events if isinstance(e.get("args"), dict)
                          and isinstance(e["args"].get(k), int)), default=0) for k in ID_KEYS}  # fmt: skip
    flow_stride = 1 + max((int(e["id"]) for e in events if isinstance(e.get("id"), int)), default=0)
    step_numbers = [int(str(e["name"])[len(_STEP):]) for e in timed if str(e.get("name", "")).startswith(_STEP)
                    and str(e["name"])[len(_STEP):].isdigit()]  # fmt: skip
    steps = max(step_numbers) - min(step_numbers) + 1 if step_numbers else 0
    out = []
    for k in range(copies):
        copy = []
        for e in events if k == 0 else timed:
            if k == 0:
                copy.append(e)
                continue
            new = dict(e)
            t = float(e["ts"]) + k * period
            new["ts"] = round(t, 3) if isinstance(e["ts"], float) else round(t)
            if isinstance(e.get("id"), int):
                new["id"] = e["id"] + k * flow_stride
            args = e.get("args")
            if isinstance(args, dict) and any(key in args for key in ID_KEYS):
                new["args"] = {key: (v + k * stride[key] if key in stride and isinstance(v, int) and v >= 0 else v)
                               for key, v in args.items()}  # fmt: skip
            name = str(e.get("name", ""))
            if steps and name.startswith(_STEP) and name[len(_STEP) :].isdigit():
                new["name"] = f"{_STEP}{int(name[len(_STEP) :]) + k * steps}"
            copy.append(new)
        out.append(copy)
    return out


def write_lengthened(source: Path, copies: int, out: Path) -> None:
    """Each rank of ``source`` with its window repeated ``copies`` times (``repeated``), into ``out``."""
    files, _ = find_traces(Path(source))
    out.mkdir(parents=True)
    if (Path(source) / RUN_FILE).is_file():
        shutil.copy(Path(source) / RUN_FILE, out / RUN_FILE)
    encoder = msgspec.json.Encoder()
    for f in files:
        doc = read_document(f)
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        name = f.name.removesuffix(".gz")
        with open(out / name, "wb") as sink:
            sink.write(json.dumps(head)[:-1].encode() + b', "traceEvents": [')
            first = True
            for copy in repeated(doc["traceEvents"], copies):
                body = encoder.encode(copy)[1:-1]
                if body:
                    sink.write(body if first else b"," + body)
                    first = False
            sink.write(b"]}")


def synthesize(source: Path, n: int, out: Path, plan: Plan = Plan()) -> Planted:
    """Write an n-rank run to ``out`` (created) from the source run's W rank traces (n a multiple of W)."""
    files, _ = find_traces(Path(source))
    docs = {}
    for f in files:
        doc = read_document(f)
        info = doc.get("distributedInfo") if isinstance(doc, dict) else None
        if not isinstance(info, dict) or not isinstance(info.get("rank"), int):
            raise TraceError(f, "no distributedInfo rank: cannot tell which rank to replicate")
        docs[info["rank"]] = doc
    world = len(docs)
    if n % world:
        raise UsageError(f"{n} ranks is not a multiple of the source's {world}")
    rng = random.Random(plan.seed)
    planted = Planted(n)
    for i, r in enumerate(straggler_ranks(n, world, rng)):
        planted.stragglers[r] = round(plan.straggler_us * (1 + 0.1 * i), 1)
    anchors = {r: _anchor(d["traceEvents"]) for r, d in docs.items()}
    copies = n // world
    delays = [{r: rng.uniform(0, plan.jitter_us) + planted.stragglers.get(c * world + r, 0.0) for r in docs}
              for c in range(copies)]  # fmt: skip
    one_job = not any(names_groups(d) for d in docs.values())
    everyone = max(max(d.values()) for d in delays)
    out.mkdir(parents=True)
    if (Path(source) / RUN_FILE).is_file():
        shutil.copy(Path(source) / RUN_FILE, out / RUN_FILE)
    encoder = msgspec.json.Encoder()
    for copy in range(copies):
        base = copy * world
        latest = everyone if one_job else max(delays[copy].values())
        for r, doc in docs.items():
            rank = base + r
            offset = round(rng.uniform(-plan.offset_us, plan.offset_us), 1)
            planted.offsets_us[rank] = offset
            moved = (lambda a, b=base, c=copy: move_groups(a, b, c)) if copy else None
            events = perturbed(doc["traceEvents"], anchors[r], delays[copy][r], latest, offset, moved)
            info = move_groups({**doc["distributedInfo"], "rank": rank, "world_size": n}, base, copy)
            head = {k: v for k, v in doc.items() if k not in ("traceEvents", "distributedInfo")}
            head["distributedInfo"] = info
            # the header with the standard library's separators (HTA finds a rank by a text search
            # that expects them), the events with msgspec's: one rank in memory at a time
            text = json.dumps(head)[:-1].encode() + b', "traceEvents": ' + encoder.encode(events) + b"}"
            (out / f"rank{rank}.json").write_bytes(text)
    (out / SYNTH_FILE).write_text(planted.to_json())
    return planted


def read_planted(run: Path) -> Planted:
    raw = json.loads((run / SYNTH_FILE).read_text())
    return Planted(raw["ranks"], {int(k): v for k, v in raw["stragglers"].items()},
                   {int(k): v for k, v in raw["offsets_us"].items()})  # fmt: skip


def default_source() -> Path | None:
    """The corpus DLRM run beside the checkout (SPTRACE_CORPUS overrides), if there."""
    import os

    corpus = Path(os.environ.get("SPTRACE_CORPUS") or HERE.parent.parent / "shared/corpus")
    dlrm = corpus / "param_dlrm_kineto"
    return dlrm if dlrm.is_dir() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder to write (must not exist)")
    ap.add_argument("--ranks", type=int, required=True, help="ranks to write, a multiple of the source's")
    ap.add_argument("--source", type=Path, help="the run to replicate (default: DLRM from the corpus)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="repeat each rank's window N times (a rank N times longer)")
    args = ap.parse_args()
    source = args.source or default_source()
    if source is None:
        print("no source run: pass --source (or put the corpus beside the checkout)", file=sys.stderr)
        return 2
    if args.repeat > 1:
        if args.ranks != len(find_traces(source)[0]):
            print("--repeat lengthens the source's own ranks: pass --ranks W, its rank count", file=sys.stderr)
            return 2
        write_lengthened(source, args.repeat, args.out)
        print(f"{args.out}: {args.ranks} ranks, each {args.repeat} windows long")
        return 0
    planted = synthesize(source, args.ranks, args.out, Plan(seed=args.seed))
    print(f"{args.out}: {args.ranks} ranks, stragglers {planted.stragglers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
