"""``loopdock experiment``: run, rescore, report, export and bench, for the command line."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import trio

from loopdock.runtime import YamlFileError, load_yaml_file, resolve_home

from ._bench import bench_command
from ._config import RUN_NAME, limit_samples, load_experiment, parse_prices
from ._errors import ExperimentError
from ._history import open_store, read_run, read_run_at
from ._html import render_html, render_transcript, transcript_path
from ._inspect import export_inspect
from ._plot import render_png
from ._progress import ProgressDisplay
from ._report import Report, build_report, cells_json
from ._rescore import rescore_experiment
from ._runner import run_experiment
from ._spec import Price
from ._text import fmt, render_text

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def add_arguments(parser: argparse.ArgumentParser, parents: Sequence[argparse.ArgumentParser] = ()) -> None:
    """The actions of ``loopdock experiment``; ``parents``: the options every command
    takes (``-v``), given to each action as the other commands' verbs get them."""
    home_help = "runtime home (default: $LOOPDOCK_HOME, else $XDG_DATA_HOME/loopdock, i.e. ~/.local/share/loopdock)"
    actions = parser.add_subparsers(dest="experiment_command", required=True)
    common = list(parents)
    run = actions.add_parser(
        "run", help="run every rollout of an experiment file (each one a durable session)", parents=common,
        description="Run every (task, sample, model, loop, repeat) of FILE as one agent session in the runtime "
        "home. With --resume, a run of the same name goes on: scored rollouts are skipped, the rest run again.",
    )  # fmt: skip
    run.add_argument("file", help="the experiment (YAML)")
    run.add_argument("--resume", action="store_true", help="go on with an earlier run of the same name")
    run.add_argument("--limit", type=_positive, metavar="N",
                     help="run only the first N samples of each task (a smoke run; --resume without it runs the rest)")
    run.add_argument("--home", help=home_help)
    rescore = actions.add_parser(
        "rescore", help="score a run's finished rollouts again with the file's scorers (no rollout model is called)",
        parents=common,
        description="Score every finished rollout of FILE's run again with the scorers FILE names now, from the "
        "agent's stored last answer and its working directory. The new scores are what `report` shows.",
    )  # fmt: skip
    rescore.add_argument("file", help="the experiment (YAML) of the run, with the scorer to use")
    rescore.add_argument("--home", help=home_help)
    report = actions.add_parser("report", help="the report of a run: table, paired deltas, plot and HTML", parents=common)
    report.add_argument("run", help="the run's name")
    report.add_argument("--home", help=home_help)
    report.add_argument("--json", action="store_true", help="print the cells as JSON (and write no files)")
    report.add_argument("--out", help="directory for report.html and success-vs-cost.png (default: HOME/reports/RUN)")
    report.add_argument("--fail-under", type=float, metavar="SCORE",
                        help="exit 1 if any cell's mean score is below SCORE (0..1), or has none: a gate for CI")
    report.add_argument("--prices", help="YAML mapping 'provider/model' to {input, output} per million tokens")
    export = actions.add_parser("export", help="write the run as Inspect AI logs (.eval) for `inspect view`",
                                parents=common)
    export.add_argument("run", help="the run's name")
    export.add_argument("--home", help=home_help)
    export.add_argument("--out", help="directory for the .eval files (default: HOME/reports/RUN/inspect)")
    bench = actions.add_parser("bench", help="runner overhead per rollout and rollouts/s with a latency-bound model",
                               parents=common)
    bench.add_argument("--rollouts", type=int, default=1000, help="rollouts in the run (default 1000), all at once")
    bench.add_argument("--latency", type=float, default=0.5, help="the stand-in model's seconds per call (default 0.5)")
    bench.add_argument("--turns", type=int, default=2, help="model calls per rollout (default 2: a tool call, an answer)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _prices(path: str) -> dict[str, Price]:
    try:
        value = load_yaml_file(path, what="prices file")
    except YamlFileError as exc:
        raise ExperimentError("INVALID_EXPERIMENT", str(exc)) from None
    return parse_prices(value, path)


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    experiment = load_experiment(args.file)
    if args.limit is not None:
        experiment = limit_samples(experiment, args.limit)
    home = resolve_home(args.home)
    if not args.resume and (home / "sessions.db").is_file():
        with open_store(home) as store:
            history = read_run(store, experiment.name)
        if history.plans or history.results:
            scored = sum(1 for r in history.latest().values() if r.done)
            raise ExperimentError(
                "INVALID_EXPERIMENT",
                f"{home} already holds a run {experiment.name!r} ({scored} rollouts scored): pass --resume to go on "
                "with it, or give the experiment another name",
            )
    display = ProgressDisplay(err, tty=err.isatty(), currency=experiment.currency)
    resume = f"loopdock experiment run {args.file} --resume" + (f" --home {args.home}" if args.home else "")
    try:
        summary = trio.run(lambda: run_experiment(experiment, home=home, on_progress=display))
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        # Every running rollout's turn ended aborted and its session is durable: a resume
        # runs them again. One line, not a traceback through every actor's nursery.
        display.interrupted()
        print(f"interrupted: {display.done}/{display.total} rollouts scored; go on with: {resume}", file=err, flush=True)
        return EXIT_INTERRUPTED
    spent = f"; spent {summary.spent:.4g} {summary.currency}" if summary.spent else ""
    print(
        f"experiment {summary.run}: {summary.total} rollouts, {summary.skipped} scored before, {summary.scored} "
        f"scored now, {summary.failed} failed, {summary.not_started} not run (budget){spent}",
        file=out,
    )
    for provider, count in summary.throttles.items():
        print(f"{provider} pushed back {count} times (retried calls or failed rollouts); its concurrency was lowered", file=out)
    if not summary.complete:
        print(f"rerun with --resume to run the rest: {resume}", file=out)
    print(f"report: loopdock experiment report {summary.run}" + (f" --home {args.home}" if args.home else ""), file=out)
    return 0 if summary.complete else 1


def _rescore(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    experiment = load_experiment(args.file)
    home = resolve_home(args.home)
    if not (home / "sessions.db").is_file():
        raise ExperimentError("UNKNOWN_RUN", f"{home} holds no session store (sessions.db): no run was made there")
    try:
        summary = trio.run(lambda: rescore_experiment(experiment, home=home))
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        again = f"loopdock experiment rescore {args.file}" + (f" --home {args.home}" if args.home else "")
        print(f"interrupted: the run's scores now mix the old scorers and the new; finish with: {again}",
              file=err, flush=True)  # fmt: skip
        return EXIT_INTERRUPTED
    for failure in summary.failed:
        print(f"not rescored (the old result stays): {failure}", file=err)
    skipped = f", {summary.skipped} no longer in the file left as they were" if summary.skipped else ""
    print(f"experiment {summary.run}: rescored {summary.rescored} rollouts ({summary.changed} changed), "
          f"{len(summary.failed)} failed{skipped}", file=out)  # fmt: skip
    print(f"report: loopdock experiment report {summary.run}" + (f" --home {args.home}" if args.home else ""), file=out)
    return 1 if summary.failed else 0


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C: a KeyboardInterrupt, alone or in groups of nothing else."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_interrupted(inner) for inner in exc.exceptions)
    return False


def _check_run_name(name: str) -> str:
    if not RUN_NAME.fullmatch(name):
        raise ExperimentError("UNKNOWN_RUN", f"{name!r} is not a run name (letters, digits, _ and -)")
    return name


def _report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    home = resolve_home(args.home)
    history = read_run_at(home, _check_run_name(args.run))
    report = build_report(history, _prices(args.prices) if args.prices else None)
    if args.json:
        print(json.dumps(cells_json(report), indent=2), file=out)
        return _gate(report, args.fail_under, err)
    print(render_text(report), file=out, end="")
    folder = Path(args.out) if args.out else home / "reports" / report.run
    folder.mkdir(parents=True, exist_ok=True)
    png: bytes | None = None
    note = ""
    try:
        png = render_png(report)
    except ExperimentError as exc:
        note = f"no plot: {exc}"
        print(note, file=out)
    if png is not None:
        (folder / "success-vs-cost.png").write_bytes(png)
        print(f"plot: {folder / 'success-vs-cost.png'}", file=out)
    written = _write_transcripts(home, report, folder)
    (folder / "report.html").write_text(render_html(report, png, note, written), encoding="utf-8")
    print(f"html: {folder / 'report.html'}", file=out)
    return _gate(report, args.fail_under, err)


def _write_transcripts(home: Path, report: Report, folder: Path) -> set[str]:
    """Each finished rollout's transcript page next to report.html; their session ids."""
    written = set()
    with open_store(home) as store:
        for result in report.rollouts:
            loaded = store.load(result.session_id) if result.finished else None
            if loaded is None:
                continue
            path = folder / transcript_path(result.session_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render_transcript(result, loaded[1]), encoding="utf-8")
            written.add(result.session_id)
    return written


def _gate(report: Report, threshold: float | None, err: TextIO) -> int:
    """0, or 1 if a cell's mean score is below ``threshold`` (a cell with no finished
    rollout has no score, and fails too)."""
    if threshold is None:
        return 0
    below = [c for c in report.cells if math.isnan(c.score) or c.score < threshold]
    for cell in below:
        print(f"below --fail-under {threshold:g}: {cell.label} scores {fmt(cell.score)}", file=err)
    return 1 if below else 0


def _export(args: argparse.Namespace, out: TextIO) -> int:
    home = resolve_home(args.home)
    history = read_run_at(home, _check_run_name(args.run))
    folder = Path(args.out) if args.out else home / "reports" / history.run / "inspect"
    with open_store(home) as store:
        files = export_inspect(store, history, build_report(history), folder)
    for file in files:
        print(file, file=out)
    print(f"open with: inspect view --log-dir {folder}", file=out)
    return 0


def run_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``loopdock experiment ...``; the exit status: 0 done, 1 a run left rollouts
    to do (rerun with --resume), a rescore failed on a rollout or a report's cell
    scored under ``--fail-under``, 130 a
    run stopped by Ctrl-C (resume it with --resume) or a rescore (run it again). Errors are raised (ExperimentError) for the CLI to print."""
    if args.experiment_command == "run":
        return _run(args, out, err)
    if args.experiment_command == "rescore":
        return _rescore(args, out, err)
    if args.experiment_command == "report":
        return _report(args, out, err)
    if args.experiment_command == "export":
        return _export(args, out)
    return bench_command(args, out, err)
