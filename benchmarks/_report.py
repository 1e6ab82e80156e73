"""Medians and spreads over repeats, ratios, targets, the terminal table and the plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, TextIO

from ._tables import render


def _flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves by dotted path; lists of rows keyed by their ``loop``/``n``."""
    out: dict[str, float] = {}
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "loop" in v for v in value):
        for row in value:
            out.update(_flatten(row, f"{prefix}[{row['loop']}]"))
    return out


def stats(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values),
            "values": values} if values else {"median": None, "min": None, "max": None, "runs": 0, "values": []}


def _ratio_stats(a: list[float], b: list[float]) -> dict[str, Any]:
    # Repeat i of one run over repeat i of the other: both ran every repeat.
    return stats([x / y for x, y in zip(a, b, strict=True) if y])


def compute(results: dict[str, Any]) -> None:
    """Add ``figures`` (median, min, max of every number over repeats), ``ratios`` (per
    repeat, then summarised) and ``targets``."""
    runs = results["runs"]
    figures: dict[str, dict[str, Any]] = {}
    for key, results_list in runs.items():
        flat = [_flatten(r) for r in results_list]
        paths = sorted(set().union(*flat)) if flat else []
        figures[key] = {p: stats([f[p] for f in flat if p in f]) for p in paths}
    results["figures"] = figures

    def series(key: str, path: str) -> list[float]:
        return [_flatten(r).get(path, 0.0) for r in runs.get(key, [])]

    ratios: dict[str, Any] = {}
    if "peer-turns" in runs:
        ratios["turns_vs_peer"] = _ratio_stats(series("turns", "turns_per_s"), series("peer-turns", "turns_per_s"))
        ratios["turns_cpu_vs_peer"] = _ratio_stats(series("peer-turns", "cpu_us_per_turn"), series("turns", "cpu_us_per_turn"))
        ratios["bare_vs_peer"] = _ratio_stats(series("bare", "turns_per_s"), series("peer-bare", "turns_per_s"))
        ratios["bare_cpu_vs_peer"] = _ratio_stats(series("peer-bare", "cpu_us_per_turn"), series("bare", "cpu_us_per_turn"))
    ratios["bare_vs_floor"] = _ratio_stats(series("bare", "turns_per_s"), series("floor-bare", "turns_per_s"))
    for scenario in ("idle", "busy", "saturated", "saturated-ungated"):
        key = f"priority:{scenario}"
        if key in runs:
            ratios[f"automatic_kept:{scenario}"] = _ratio_stats(
                series(key, "automatic_turns_per_s_with_people"), series(key, "automatic_turns_per_s_alone"))
    results["ratios"] = ratios
    results["targets"] = _targets(results)


def _median(results: dict[str, Any], key: str, path: str) -> float | None:
    figure = results["figures"].get(key, {}).get(path)
    return None if figure is None else figure["median"]


def _targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    cfg, quick = results["config"], results["mode"] != "full"
    ratios = results["ratios"]
    targets: list[dict[str, Any]] = []

    def target(id_: str, text: str, measured: float | None, unit: str, ok: bool | None, note: str, size: str) -> None:
        judged = None if quick or measured is None else ok
        if quick:
            note = f"quick run at {size}: not judged" + (f"; {note}" if note else "")
        targets.append({"id": id_, "target": text, "measured": measured, "unit": unit, "passed": judged,
                        "note": note, "size": size})

    sat = "priority:saturated"
    p99 = _median(results, sat, "admission.p99_ms")
    worst = results["figures"].get(sat, {}).get("admission.p99_ms", {}).get("max")
    kept = ratios.get("automatic_kept:saturated", {}).get("median")
    holders = cfg["priority"]["holders"]
    automatic = cfg["priority"]["scenarios"]["saturated"][0]
    size = f"{automatic} automatic agents, {cfg['priority']['rate']} people/s"
    target("human-priority", "a person's followup to an idle agent, CPU saturated by automatic turns: admission p99 <= 20 ms"
           " (open-loop arrivals)", p99, "ms p99 (median of runs)", p99 is not None and p99 <= 20,
           f"worst run {worst:.1f} ms; {holders} idle agents" if worst is not None else "", size)
    target("automatic-kept", "automatic throughput with people arriving >= 80% of without", kept,
           "x without people", kept is not None and kept >= 0.8, "saturated scenario", size)

    m = cfg["memory"]
    kb = _median(results, "memory", "kb_per_agent")
    target("memory", "<= 50 KB RSS per idle agent at N = 10,000 after 100 turns each", kb, "KB per agent",
           kb is not None and kb <= 50, "", f"N={m['n']:,}, {m['history']} turns")
    gc_p99 = _median(results, "memory", "gc.p99_ms")
    target("gc", "GC pauses p99 <= 10 ms there", gc_p99, "ms", gc_p99 is not None and gc_p99 <= 10,
           "", f"N={m['n']:,}")

    h = cfg["history"]
    growth = _median(results, "history", "last_vs_first")
    target("step-cost", f"CPU per turn at turns {h['turns'] - h['block'] + 1:,}-{h['turns']:,} within 1.3x of turns 1-{h['block']}",
           growth, "x", growth is not None and growth <= 1.3, "", f"{h['turns']:,} turns")

    n = cfg["idle"]["n"]
    rss = _median(results, "idle", "rss_mb")
    cpu = _median(results, "idle", "cpu_us_per_agent")
    target("idle-agents", "100,000 idle agents in one process, RSS <= 5 GB", None if rss is None else rss / 1024, "GB",
           rss is not None and rss <= 5 * 1024, f"creation {cpu:.0f} us CPU per agent" if cpu else "", f"N={n:,}")

    same = ratios.get("turns_vs_peer", {}).get("median")
    target("same-work", "turns/s at N = 1,000 >= 2x autogen-core doing the same work", same, "x peer",
           same is not None and same >= 2, "" if same is not None else f"peer {results['peer']['status']}",
           f"N={cfg['turns']['n']:,}")
    bare = ratios.get("bare_vs_peer", {}).get("median")
    target("bare", "bare runtime at N = 1,000 >= 2x autogen-core's echo", bare, "x peer",
           bare is not None and bare >= 2, "" if bare is not None else f"peer {results['peer']['status']}",
           f"N={cfg['bare']['n']:,}")
    return targets


# -- the table ----------------------------------------------------------------------------


def print_table(results: dict[str, Any], out: TextIO) -> None:
    m = results["machine"]
    print(file=out)
    print(
        f"loopdock bench ({results['mode']}) {m['date']}  {m['platform']}, {m['cpu_count']} CPUs, "
        f"Python {m['python']}, trio {m['trio']}, autogen-core {m['autogen_core'] or 'not installed'}, "
        f"commit {m['git_commit'] or '-'}; load average {m.get('load_average_at_start')} -> {m.get('load_average_at_end')}",
        file=out,
    )
    for name, text in render(results).items():
        print(f"\n## {name}\n\n{text}", file=out)
    files = results.get("files", {})
    print(f"\nwritten: {', '.join(f for f in (files.get('json'), files.get('png')) if f)}", file=out)
    if files.get("png_skipped"):
        print(f"no plot: {files['png_skipped']}", file=out)
    print(f"took {results['seconds']:.0f} s", file=out)


# -- the plot -------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> str | None:
    """Write the PNG; returns why not (matplotlib missing) or None once written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'loopdock[bench]')"
    figures = results["figures"]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    bars = [("loopdock turn", "turns"), ("autogen-core turn", "peer-turns"), ("loopdock bare", "bare"),
            ("autogen-core echo", "peer-bare"), ("trio task", "floor-bare")]
    shown = [(label, figures[key]["turns_per_s"]) for label, key in bars if key in figures]
    left.bar(range(len(shown)), [f["median"] for _, f in shown],
             yerr=[[f["median"] - f["min"] for _, f in shown], [f["max"] - f["median"] for _, f in shown]])
    left.set_xticks(range(len(shown)), [label for label, _ in shown], fontsize=7, rotation=15)
    left.set(yscale="log", ylabel="per second", title="Throughput at N (median, min-max)")
    scenarios = [s for s in ("idle", "busy", "saturated", "saturated-ungated") if f"priority:{s}" in figures]
    for q, marker in (("p50_ms", "o"), ("p99_ms", "s")):
        values = [figures[f"priority:{s}"][f"admission.{q}"] for s in scenarios]
        middle.errorbar(range(len(scenarios)), [v["median"] for v in values],
                        yerr=[[v["median"] - v["min"] for v in values], [v["max"] - v["median"] for v in values]],
                        fmt=marker + "-", label=q.replace("_ms", ""), capsize=3)
    middle.axhline(20, color="grey", linestyle=":", label="target p99")
    middle.set_xticks(range(len(scenarios)), scenarios, fontsize=7)
    middle.set(yscale="log", ylabel="ms", title="A person's followup -> admission (open loop)")
    middle.legend(fontsize=7)
    if results["runs"].get("history"):
        for run in results["runs"]["history"]:
            blocks = run["cpu_us_per_turn_by_block"]
            right.plot([(i + 1) * run["block"] for i in range(len(blocks))], blocks, alpha=0.6)
        right.set(xlabel="turn", ylabel="CPU us per turn", title="One agent: CPU per turn against history", ylim=(0, None))
    for axes in (left, middle, right):
        axes.grid(True, alpha=0.3)
    m = results["machine"]
    fig.suptitle(f"loopdock bench ({results['mode']}), {m['cpu_count']} CPUs, Python {m['python']}, {m['date'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None
