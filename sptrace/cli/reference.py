"""The reference models: ``sptrace profile`` and ``sptrace demo`` (the README's main job), and the
parser of ``sptrace sweep`` (sptrace.cli.sweep). Every flag is checked
(sptrace.reference_models.config) before anything launches."""

from __future__ import annotations

import argparse
from pathlib import Path

from sptrace.cli.common import log
from sptrace.cli.matrix import matrix_runs
from sptrace.cli.reference_flags import add_model_flags, config_from
from sptrace.cli.sweep import cmd_sweep
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import SCHEMES

DEMO_DIR = Path("sptrace-demo")
DEMO_SCHEMES = ("megatron", "ulysses", "hybrid")  # the first article's three systems


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="profile one step of reference models on N local ranks, many configurations in one launch"
    )
    p.add_argument(
        "--scheme", choices=SCHEMES, action="append",
        help="the scheme; repeat it to profile several in one launch, each into OUT/SCHEME",
    )  # fmt: skip
    p.add_argument(
        "--matrix", metavar="FILE",
        help="a JSON file of named runs, each into OUT/NAME, in one launch per rank count: "
        '{"defaults": {...}, "runs": {"NAME": {"scheme": "megatron", "fault": "stray-full-save", ...}}}; '
        "a run's keys are this command's model flags (and nproc, instrument, lean), the flags given here "
        "are their defaults",
    )  # fmt: skip
    p.add_argument("--nproc", type=int, default=8, help="ranks = sequence-parallel size P (default 8)")
    p.add_argument(
        "--out", required=True,
        help="directory for rank*.pt.trace.json.gz and run.json (with several runs: for their folders)",
    )  # fmt: skip
    p.add_argument("--warmup", type=int, default=2, help="un-profiled steps before the profiled ones")
    p.add_argument(
        "--steps",
        type=int,
        default=2,
        help="profiled steps (default 2: the second shows which collective buffers the backend released)",
    )
    p.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="auto: CUDA+NCCL when there are enough GPUs, else CPU+gloo",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace a run already in --out")
    p.add_argument(
        "--no-instrument", action="store_true",
        help="record without sptrace's markers and saved-tensor records, like a foreign framework's trace",
    )  # fmt: skip
    p.add_argument(
        "--lean", action="store_true",
        help="profile without Python stacks (the profiler's costliest option); modules are named by the markers",
    )  # fmt: skip
    add_model_flags(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("demo", help="profile megatron, ulysses and hybrid on 8 ranks (the README's main job)")
    p.add_argument("--out", default=str(DEMO_DIR), help=f"default ./{DEMO_DIR}")
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="profiled steps (default 2)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--port", type=int, default=8050, help="dashboard port (on 127.0.0.1)")
    p.add_argument("--no-serve", action="store_true", help="profile and analyse, do not serve the dashboard")
    add_model_flags(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sweep", help="profile schemes x sequence lengths, tabulate them and fit the regression")
    p.add_argument(
        "--schemes", default="megatron,ulysses,hybrid",
        help="comma-separated, of megatron, ulysses, hybrid, ring, usp and their -zero3 (default: the first three)",
    )  # fmt: skip
    p.add_argument("--seq", dest="seqs", required=True, help="comma-separated sequence lengths, e.g. 128,256,512")
    p.add_argument("--out", required=True)
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="profiled steps of each run (default 2)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--force", action="store_true", help="profile again runs that already exist")
    add_model_flags(p, with_seq=False)
    p.add_argument("--config", metavar="FILE", help="the model's sizes from a YAML or JSON file of run_info keys, as "
                   "the analysing commands take it (a flag wins over it; S, the scheme and P come from --seq, "
                   "--schemes and --nproc)")  # fmt: skip
    p.set_defaults(func=cmd_sweep)


def cmd_profile(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        raise UsageError("--nproc must be >= 1")
    if not args.scheme and not args.matrix:
        raise UsageError("give --scheme (repeat it for several) or --matrix FILE")
    if args.scheme and args.matrix:
        raise UsageError("--scheme and --matrix do not go together: put the schemes in the matrix")
    from sptrace.launch import RunRequest, check_requests, profile_references

    out = Path(args.out)
    instrument = not args.no_instrument
    if args.matrix:  # every run is checked before anything launches
        requests = [
            RunRequest(cfg, out / name, inst, lean) for name, cfg, inst, lean in matrix_runs(Path(args.matrix), args)
        ]
    elif len(args.scheme) == 1:  # one run: OUT is the run
        requests = [RunRequest(config_from(args, args.scheme[0], args.nproc), out, instrument, args.lean)]
    else:
        twice = sorted({s for s in args.scheme if args.scheme.count(s) > 1})
        if twice:
            raise UsageError(f"--scheme {twice[0]} is given twice")
        requests = [RunRequest(config_from(args, s, args.nproc), out / s, instrument, args.lean) for s in args.scheme]
    by_size: dict[int, list[RunRequest]] = {}
    for req in requests:
        by_size.setdefault(req.cfg.sp_size, []).append(req)
    for group in by_size.values():  # every launch is checked before the first starts
        check_requests(group, warmup=args.warmup, force=args.force, steps=args.steps)
    for size in sorted(by_size, reverse=True):  # one launch per rank count
        for run in profile_references(
            by_size[size], warmup=args.warmup, steps=args.steps, device=args.device, force=args.force, log=log
        ):
            log(f"wrote {run.world_size} traces ({run.trace_bytes / 2**20:.1f} MiB) and run.json to {run.out_dir} in "
                f"{run.seconds:.0f} s")  # fmt: skip
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The README's main job: profile the three schemes, analyse each once, show the verdicts."""
    from sptrace.launch import RunRequest, profile_references

    out = Path(args.out)
    base = config_from(args, "megatron", args.nproc)
    requests = [RunRequest(base.replace(scheme=scheme), out / scheme) for scheme in DEMO_SCHEMES]
    runs = profile_references(
        requests, warmup=args.warmup, steps=args.steps, device=args.device, force=True, log=log
    )  # one launch
    from sptrace.analysis import PARTS, analyse_run  # (after the launch: its import overlaps nothing)

    print(f"Profiled one training step of each scheme on {args.nproc} ranks, in one launch:")
    for run in runs:
        print(f"  {run.out_dir}/  ({run.world_size} x rank*.pt.trace.json.gz, run.json; {run.seconds:.0f} s)")
    # once per run, for both verdicts and the dashboard (its Timeline's what-if replays the graphs)
    analyses = [analyse_run(run.out_dir, parts=(*PARTS, "whatif")) for run in runs]
    print("\nCollectives against the cost model (sptrace analyze RUN for the details):")
    for run, a in zip(runs, analyses):
        line = a.comm.verdict.line() if a.comm else f"not checked: {a.comm_unavailable}"
        print(f"  {run.out_dir.name:<9} {line}")
    print("\nSharding of the activations kept for backward (sptrace check RUN for the details):")
    for run, a in zip(runs, analyses):
        line = a.sharding.verdict.line() if a.sharding else f"not checked: {a.sharding_unavailable}"
        print(f"  {run.out_dir.name:<9} {line}")
    print("\nStep and communication time (transfer time, mean over ranks):")
    for run, a in zip(runs, analyses):
        t = a.facts
        share = "" if t.comm_share is None else f" ({100 * t.comm_share:.0f}% of the step)"
        print(f"  {run.out_dir.name:<9} step {t.step_ms or 0:.1f} ms, communication {t.comm_ms or 0:.1f} ms{share}")
    if args.no_serve:
        print(f"\nsptrace dash {' '.join(str(r.out_dir) for r in runs)}   # to browse them")
        return 0
    from sptrace.dashboards.app import serve

    print(f"\ndashboard: http://127.0.0.1:{args.port}/  (Ctrl-C stops it)", flush=True)
    serve([r.out_dir for r in runs], port=args.port, analyses=analyses)
    return 0
