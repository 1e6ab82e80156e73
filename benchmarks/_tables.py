"""Markdown tables from a results JSON, and the docs' generated sections.

``loopdock bench --tables [JSON ...]`` rewrites every block between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in the docs from the JSON: a
``bench-*.json`` fills README.md, benchmarks/README.md and benchmarks/PROFILE.md, a
``bench-cluster-*.json`` docs/cluster.md, a ``bench-tracing-*.json`` the tracing figures of
README.md and benchmarks/PROFILE.md, a ``bench-lifecycle-*.json`` the lifecycle figures of
docs/lifecycle.md and benchmarks/PROFILE.md (by default, the committed full runs in
``benchmarks/results/``). The tables are never copied by hand, and a test checks the
committed docs match the committed JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DOCS = {"README.md": ("summary",), "benchmarks/README.md": ("details",), "benchmarks/PROFILE.md": ("profile",)}
CLUSTER_DOCS = {"docs/cluster.md": ("cluster",)}
TRACING_DOCS = {"README.md": ("tracing-summary",), "benchmarks/PROFILE.md": ("tracing",)}
USAGE_DOCS = {"README.md": ("usage-summary",), "benchmarks/PROFILE.md": ("usage",)}
LIFECYCLE_DOCS = {"docs/lifecycle.md": ("lifecycle-summary",), "benchmarks/PROFILE.md": ("lifecycle",)}
COMMITTED = (
    "benchmarks/results/bench-full.json",
    "benchmarks/results/bench-cluster-full.json",
    "benchmarks/results/bench-tracing-full.json",
    "benchmarks/results/bench-usage-full.json",
    "benchmarks/results/bench-lifecycle-full.json",
)
_VERDICT = {True: "met", False: "**missed**", None: "not judged"}


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def spread(figure: dict[str, Any] | None, digits: int = 1, scale: float = 1.0) -> str:
    """``median (min-max)`` of a figure over its runs."""
    if not figure or figure.get("median") is None:
        return "-"
    med, lo, hi = (figure[k] * scale for k in ("median", "min", "max"))
    if figure["runs"] < 2:
        return fmt(med, digits)
    return f"{fmt(med, digits)} ({fmt(lo, digits)}-{fmt(hi, digits)})"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _source(results: dict[str, Any]) -> str:
    m = results["machine"]
    return (
        f"From `benchmarks/results/bench-{results['mode']}.json`: {results['mode']} run of commit "
        f"`{m.get('git_commit') or '-'}`, {m['date']}, {m['cpu_count']} CPUs ({m.get('cpu_model') or 'unknown CPU'}), "
        f"Python {m['python']}, trio {m['trio']}, autogen-core {m.get('autogen_core') or 'not installed'}; "
        f"load average {m.get('load_average_at_start')} at the start, {m.get('load_average_at_end')} at the end; "
        f"{results['config']['repeats']} runs per repeated figure, shown as median (min-max)."
    )


def targets_table(results: dict[str, Any]) -> str:
    rows = []
    for t in results["targets"]:
        measured = "-" if t["measured"] is None else f"{fmt(t['measured'], 2)} {t['unit']}"
        note = f" ({t['note']})" if t.get("note") else ""
        rows.append([t["target"], measured + note, t["size"], _VERDICT[t["passed"]]])
    return _table(["target", "measured", "at", ""], rows)


def render(results: dict[str, Any]) -> dict[str, str]:
    f, r, cfg = results["figures"], results["ratios"], results["config"]
    out: dict[str, str] = {"Targets": targets_table(results)}

    rows = []
    for label, key in (("loopdock: a turn (ping -> tool -> ping, 15 events persisted)", "turns"),
                       ("autogen-core: the same turn, the same events and store", "peer-turns"),
                       ("loopdock bare: no-op loop, persistence off", "bare"),
                       ("autogen-core bare: echo handler", "peer-bare"),
                       ("a plain trio task per agent (channel hop)", "floor-bare")):
        if key in f:
            rows.append([label, spread(f[key]["turns_per_s"], 0), spread(f[key]["cpu_us_per_turn"], 0),
                         spread(f[key].get("turn.p99_ms"), 1)])
    text = _table(["N = " + f"{cfg['turns']['n']:,} agents, requests one after the other per agent", "requests/s",
                   "CPU us per request", "request p99 ms"], rows)
    lines = [f"- {label}: {spread(r[key], 2)}x" for label, key in (
        ("loopdock turns/s / autogen-core's", "turns_vs_peer"), ("in CPU per turn", "turns_cpu_vs_peer"),
        ("bare: loopdock / autogen-core", "bare_vs_peer"), ("bare, in CPU", "bare_cpu_vs_peer"),
        ("bare: loopdock / a plain trio task", "bare_vs_floor")) if key in r]
    out["Same work and the bare runtime"] = text + "\n\n" + "\n".join(lines)

    rows = []
    for scenario in ("idle", "busy", "saturated", "saturated-ungated"):
        key = f"priority:{scenario}"
        if key not in f:
            continue
        automatic = cfg["priority"]["scenarios"][scenario]
        rows.append([
            scenario + (" (gate off)" if scenario.endswith("ungated") else "") + _censored(f, key, cfg),
            f"{automatic[0]}",
            spread(f[key]["automatic_turns_per_s_alone"], 0), spread(r.get(f"automatic_kept:{scenario}"), 2),
            spread(f[key]["admission.p50_ms"], 2), spread(f[key]["admission.p99_ms"], 1),
            spread(f[key]["admission.max_ms"], 1), spread(f[key]["gc.max_ms"], 1),
        ])
    p = cfg["priority"]
    out["People first, open-loop arrivals"] = (
        f"{p['rate']} people/s (Poisson) for {p['seconds']} s per run at {p['holders']} idle agents, timed from the intended "
        "arrival to the admission of the turn's first step"
        + (f"; a person still waiting {p['drain']} s after the last arrival counts with the wait so far" if "drain" in p else "")
        + ".\n\n"
        + _table(["scenario", "automatic agents", "automatic turns/s without people", "kept with people (x)",
                  "admission p50 ms", "p99 ms", "max ms", "longest GC pause ms"], rows))

    if "history" in f:
        h = f["history"]
        out["CPU per turn against history"] = _table(
            ["one agent, tool-call turns back to back", "CPU us per turn"],
            [[f"turns 1-{cfg['history']['block']}", spread(h["first_block_us"], 0)],
             [f"turns {cfg['history']['turns'] - cfg['history']['block'] + 1:,}-{cfg['history']['turns']:,}",
              spread(h["last_block_us"], 0)],
             ["ratio", spread(h["last_vs_first"], 2) + "x"],
             ["events in memory at the end (of the log's)", f"{fmt(h['events_in_memory']['median'], 0)} of {fmt(h['events']['median'], 0)}"]])

    if "loops" in f:
        lf = f["loops"]
        names = sorted({path.split("]")[0][5:] for path in lf if path.startswith("rows[")})
        rows = [[name, spread(lf[f"rows[{name}].steps_per_turn"], 1), spread(lf[f"rows[{name}].cpu_us_per_turn"], 0),
                 spread(lf[f"rows[{name}].turn.p50_ms"], 1), spread(lf[f"rows[{name}].turn.p99_ms"], 1)] for name in names]
        out["Loops that differ"] = (f"Each loop alone: {cfg['loops']['n']} agents x {cfg['loops']['k']} turns.\n\n"
                                    + _table(["loop", "steps per turn", "CPU us per turn", "turn p50 ms", "turn p99 ms"], rows))

    rows = []
    if "memory" in f:
        m = f["memory"]
        rows.append([f"{cfg['memory']['n']:,} agents, each resumed with {cfg['memory']['history']} turns of history and run one more, then idle",
                     f"{spread(m['kb_per_agent'], 1)} KB per agent", f"GC pause p99 {spread(m['gc.p99_ms'], 2)} ms, "
                     f"max {spread(m['gc.max_ms'], 1)} ms{_gc_cpu(m)}; {fmt(m['warm_agents']['median'], 0)} histories kept warm"])
    if "idle" in f:
        i = f["idle"]
        rows.append([f"{cfg['idle']['n']:,} idle agents (standard loop), created one by one",
                     f"{spread(i['kb_per_agent'], 1)} KB per agent, RSS {spread(i['rss_mb'], 2, 1 / 1024)} GB",
                     f"creation {spread(i['cpu_us_per_agent'], 0)} us CPU per agent"])
    if "latency" in f:
        lat, c = f["latency"], cfg["latency"]
        rows.append([f"{c['n']:,} agents, one model call each of {c['low']}-{c['high']} s (Pareto {c['alpha']}, real seconds)",
                     f"{spread(lat['kb_per_agent_waiting'], 1)} KB per waiting agent",
                     f"{spread(lat['cpu_us_per_call'], 0)} us CPU per call; answer handled {spread(lat['late_ms.p50_ms'], 1)} / "
                     f"{spread(lat['late_ms.p99_ms'], 1)} ms (p50 / p99) after it was due; {fmt(lat['peak_in_flight']['median'], 0)} "
                     f"calls in flight with {fmt(lat['slots_in_use_then']['median'], 0)} admission slots in use"])
    if rows:
        out["Memory and scale (one run each)"] = _table(["workload", "memory", "other"], rows)

    if "bridge" in results["runs"]:
        b = results["runs"]["bridge"][0]
        if b.get("status") == "ok":
            out["Bridge (one run)"] = _table(["round trip over loopback", "p50 ms", "p99 ms"], [
                ["websocket ping -> pong", fmt(b["ping"]["p50_ms"], 3), fmt(b["ping"]["p99_ms"], 3)],
                ["pre-step -> verdict through a HostHandler gate", fmt(b["pre_step_sequential"]["p50_ms"], 3),
                 fmt(b["pre_step_sequential"]["p99_ms"], 3)],
                ["one session event -> the GoalBar frame showing it", fmt(b["goalbar"]["wake_to_frame"]["p50_ms"], 3),
                 fmt(b["goalbar"]["wake_to_frame"]["p99_ms"], 3)],
            ]) + f"\n\nHost events mirrored: {fmt(b['ingest']['events_per_s'], 0)} events/s."
    return out


#: PROFILE.md's figures: (what, run key, path in the figures) -- each row names its source.
PROFILE_FIGURES = (
    ("people: admission p50 ms, saturated, gate on", "priority:saturated", "admission.p50_ms"),
    ("people: admission p50 ms, saturated, gate off", "priority:saturated-ungated", "admission.p50_ms"),
    ("people: admission p99 ms, saturated, gate on", "priority:saturated", "admission.p99_ms"),
    ("people: admission p99 ms, saturated, gate off", "priority:saturated-ungated", "admission.p99_ms"),
    ("automatic turns/s without people, gate on", "priority:saturated", "automatic_turns_per_s_alone"),
    ("automatic turns/s without people, gate off", "priority:saturated-ungated", "automatic_turns_per_s_alone"),
    ("slots that stopped counting (stalled), gate on", "priority:saturated", "gate.stalled"),
    ("longest GC pause ms while people arrived, gate on", "priority:saturated", "gc.max_ms"),
    ("CPU us per turn, turns 1-{block}", "history", "first_block_us"),
    ("CPU us per turn, the last {block} of {turns:,}", "history", "last_block_us"),
    ("events held in memory after {turns:,} turns", "history", "events_in_memory"),
    ("loopdock CPU us per turn (same work)", "turns", "cpu_us_per_turn"),
    ("autogen-core CPU us per turn (same work)", "peer-turns", "cpu_us_per_turn"),
    ("loopdock CPU us per bare turn", "bare", "cpu_us_per_turn"),
    ("autogen-core CPU us per echo", "peer-bare", "cpu_us_per_turn"),
    ("trio task CPU us per hop", "floor-bare", "cpu_us_per_turn"),
    ("KB per idle agent, {n:,} agents after {history}-turn histories", "memory", "kb_per_agent"),
    ("GC pauses over that phase: p99 ms", "memory", "gc.p99_ms"),
    ("GC pauses over that phase: max ms", "memory", "gc.max_ms"),
    ("GC pauses over that phase: the collecting thread's CPU, p99 ms", "memory", "gc.cpu_p99_ms"),
    ("full (generation 2) collections over that phase", "memory", "gc.by_generation"),
    ("KB per idle agent, {idle_n:,} agents", "idle", "kb_per_agent"),
    ("CPU us per latency-bound model call", "latency", "cpu_us_per_call"),
)


def _censored(figures: dict[str, Any], key: str, cfg: dict[str, Any]) -> str:
    """A note for admission figures some of whose waits were cut at the drain time."""
    censored = figures.get(key, {}).get("admission.censored")
    if not censored or not censored["max"]:
        return ""
    return f" (at least: waits cut {cfg['priority']['drain']} s after the last arrival)"


def _gc_cpu(figures: dict[str, Any]) -> str:
    """The collecting thread's CPU time over the pauses (runs from before it was
    recorded have none)."""
    if "gc.cpu_p99_ms" not in figures:
        return ""
    return f" (CPU p99 {spread(figures['gc.cpu_p99_ms'], 2)} ms, max {spread(figures['gc.cpu_max_ms'], 1)} ms)"


def profile_table(results: dict[str, Any]) -> str:
    cfg = results["config"]
    sizes = {**cfg["history"], **cfg["memory"], "idle_n": cfg["idle"]["n"]}
    rows = []
    for label, key, path in PROFILE_FIGURES:
        label = label.format(**sizes) + (_censored(results["figures"], key, cfg) if path.startswith("admission") else "")
        figures = results["figures"].get(key, {})
        if path == "gc.by_generation":
            run = results["runs"].get(key, [{}])[0]
            value = str(run.get("gc", {}).get("by_generation", ["-"] * 3)[2])
        else:
            value = spread(figures.get(path), 1)
        rows.append([label, value, f"`{key}` / `{path}`"])
    return _table(["figure", "median (min-max)", "run / figure in the JSON"], rows)


def blocks(results: dict[str, Any]) -> dict[str, str]:
    """The docs' generated blocks by name."""
    sections = render(results)
    summary = _source(results) + "\n\n" + sections["Targets"]
    details = _source(results) + "\n\n" + "\n\n".join(f"### {name}\n\n{text}" for name, text in sections.items())
    return {"summary": summary, "details": details, "profile": _source(results) + "\n\n" + profile_table(results)}


def cluster_table(results: dict[str, Any]) -> str:
    """docs/cluster.md's figures, from a ``loopdock bench --cluster`` JSON."""
    m, cfg, f = results["machine"], results["config"], results["figures"]
    clusters = f["clusters"]
    source = (
        f"From `benchmarks/results/bench-cluster-{results['mode']}.json` (`loopdock bench --cluster`, commit "
        f"`{m.get('git_commit') or '-'}`, {m['date']}, {m['cpu_count']} CPUs; median (min-max) of "
        f"{cfg['repeats']} runs, alternating; one private redis-server with `appendfsync everysec`; "
        f"{cfg['n']} agents, each sending {cfg['k']} followups one after the other's turn ended: model answer, "
        "`list_dir` tool call, answer; CPU time is user + system from /proc, of every process, per turn):"
    )
    embedded = f["embedded_cpu_us_per_turn"]
    one = clusters["1"]
    more = [w for w in clusters if w != "1"]
    rows = [
        ["CPU per turn, one process (embedded, SQLite)", f"{spread(embedded, 0)} us", ""],
        ["CPU per turn, cluster with 1 worker: all processes",
         f"{spread(one['cpu_us_per_turn']['all'], 0)} us: **{spread(one['all_vs_embedded'], 2)}x embedded**",
         f"<= 2x embedded: {_VERDICT[f.get('all_vs_embedded_met')]}"],
        ["workers' CPU per turn with " + ", ".join(more) + " workers vs 1",
         "; ".join(f"{w}: {spread(clusters[w]['workers_vs_one'], 2)}x" for w in more),
         f"each <= 1.1x: {_VERDICT[f.get('workers_vs_one_met')]}"],
        ["turns/s (wall clock, shared 2-core machine: not a target)",
         "embedded " + spread(f["embedded_turns_per_s"], 0) + "; "
         + "; ".join(f"{w} worker{'s' if w != '1' else ''} {spread(clusters[w]['turns_per_s'], 0)}" for w in clusters),
         ""],
    ]
    seq, fo = results["sequential"], results["failover"]
    rows.append([
        "what the cluster adds to one turn (one agent, median)",
        f"{fmt(seq['overhead_ms'])} ms ({fmt(seq['embedded_ms'])} ms embedded, {fmt(seq['cluster_ms'])} ms clustered)",
        "",
    ])
    within = fo["lost_turns"] == 0 and fo["doubled_turns"] == 0 and f["failover_vs_ttl"] < 2
    rows.append([
        f"failover after kill -9 of one of two workers (lease ttl {fo['ttl_s']:g} s)",
        f"every agent answered again after {fmt(fo['all_answered_s'], 2)} s ({fmt(f['failover_vs_ttl'], 2)} x ttl); "
        f"every shard owned again after {fmt(fo['shards_owned_again_s'], 2)} s; {fo['lost_turns']} turns lost, "
        f"{fo['doubled_turns']} doubled",
        f"< 2 x ttl, none lost or doubled: {_VERDICT[within]}",
    ])
    out = [source, _table(["figure", "measured", "target"], rows)]

    split = []
    for w, c in clusters.items():
        cpu = c["cpu_us_per_turn"]
        split.append([f"{w} worker{'s' if w != '1' else ''}", spread(cpu["workers"], 0), spread(cpu["client"], 0),
                      spread(cpu["redis"], 0), spread(cpu["all"], 0), spread(c["all_vs_embedded"], 2) + "x"])
    out.append("CPU per turn by process, us (workers: all of them together):")
    out.append(_table(["cluster", "workers", "client", "redis-server", "all", "vs embedded"], split))

    commands = [[name, spread(c["calls"], 2), spread(c["usec"], 1)] for name, c in one["redis_commands"].items()
                if (c["calls"] or {}).get("median", 0) >= 0.005]
    stats = one["redis_stats"]
    out.append(
        "Redis commands per turn with 1 worker (`INFO commandstats` deltas; a command a script calls is counted "
        "under its own name too, and its time is inside the script's `evalsha`):"
    )
    out.append(_table(["command", "calls per turn", "us per turn"], commands))
    wire_rows = [["redis-server: bytes in, out", f"{spread(stats['total_net_input_bytes'], 0)}, "
                  f"{spread(stats['total_net_output_bytes'], 0)}"],
                 ["redis-server: reads (requests) processed, commands processed",
                  f"{spread(stats['total_reads_processed'], 2)}, {spread(stats['total_commands_processed'], 1)}"]]
    for w, c in clusters.items():
        wire = c.get("wire") or {}
        for role in ("client", "workers"):
            if role in wire:
                r = wire[role]
                wire_rows.append([
                    f"{w} worker{'s' if w != '1' else ''}: {'the client' if role == 'client' else 'the workers, together'}:"
                    " requests (round trips), bytes out, bytes in",
                    f"{spread(r['requests'], 2)}, {spread(r['bytes_out'], 0)}, {spread(r['bytes_in'], 0)}",
                ])
    out.append("Round trips and bytes per turn (Redis's `INFO stats` deltas; each process's requests to Redis are "
               "the TCP data segments it sent, a pipeline being one, from the kernel's counters via `ss`):")
    out.append(_table(["per turn", "measured"], wire_rows))

    p = f.get("projection")
    if p is not None:
        proj = [[n, str(c["workers"]), fmt(c["turns_per_s"], 0), c["limited_by"], fmt(c["clients_cores"], 1)]
                for n, c in p["cores"].items()]
        out.append(
            f"Projected throughput, from the medians above (the workers {fmt(p['worker_us_per_turn'], 0)} us per turn, "
            f"Redis {fmt(p['redis_us_per_turn'], 0)} us, so Redis's ceiling {fmt(p['redis_ceiling_turns_per_s'], 0)} "
            f"turns/s; the client {fmt(p['client_us_per_turn'], 0)} us). Assumptions: "
            + "; ".join(p["assumptions"]) + "."
        )
        out.append(_table(["cores", "workers", "turns/s", "limited by", "client cores needed elsewhere"], proj))
    return "\n\n".join(out)


def _tracing_source(results: dict[str, Any]) -> str:
    m, cfg = results["machine"], results["config"]
    return (
        f"From `benchmarks/results/bench-tracing-{results['mode']}.json` (`loopdock bench --tracing`, commit "
        f"`{m.get('git_commit') or '-'}`, {m['date']}, {m['cpu_count']} CPUs; median (min-max) of "
        f"{cfg['repeats']} runs each, off and on alternating, each a fresh process; {cfg['n']} agents x "
        f"{cfg['k']} turns of the `turns` workload; load average {m.get('load_average_at_start')} at the start, "
        f"{m.get('load_average_at_end')} at the end)"
    )


def tracing_table(results: dict[str, Any]) -> str:
    """What tracing costs a turn, from a ``loopdock bench --tracing`` JSON."""
    f = results["figures"]
    rows = [
        ["tracing off (the default: no provider)", spread(f["off_cpu_us_per_turn"], 0), "-"],
        ["tracing on (SDK provider, batch processor, spans counted and dropped)", spread(f["on_cpu_us_per_turn"], 0),
         spread(f["on_vs_off"], 2) + "x"],
        ["added by the spans", spread(f["added_cpu_us_per_turn"], 0), ""],
    ]
    spans = f["spans_per_turn"]["median"]
    return (
        _tracing_source(results) + ":\n\n"
        + _table(["CPU per turn (whole process)", "us per turn", "on / off, run by run"], rows)
        + f"\n\nSpans exported per turn: {fmt(spans, 1)} (the turn, two model calls, one tool call)."
    )


def tracing_summary(results: dict[str, Any]) -> str:
    """README's one sentence on what tracing costs."""
    f = results["figures"]
    return (
        f"Measured with `loopdock bench --tracing` (commit `{results['machine'].get('git_commit') or '-'}`, "
        f"{results['config']['repeats']} runs each), the cheapest tool-call turn there is (the offline ping "
        f"model, an in-memory tool) takes {spread(f['on_vs_off'], 2)}x the CPU with spans on (an SDK provider "
        f"exporting nowhere) as with tracing off: {fmt(f['added_cpu_us_per_turn']['median'], 0)} us more per "
        "turn, which a real model's latency dwarfs (benchmarks/PROFILE.md)."
    )


def usage_table(results: dict[str, Any]) -> str:
    """Memory per agent as a user measures it, from a ``loopdock bench --usage`` JSON."""
    m, target = results["machine"], results["target_kb_per_agent"]
    last = max(results["config"]["marks"])
    rows = []
    for run in results["runs"]:
        for mark in run["marks"]:
            verdict = _VERDICT[mark["kb_per_agent"] <= target] if mark["turns"] == last else ""
            rows.append([
                f"{run['n']:,}", str(mark["turns"]), fmt(mark["kb_per_agent"]), verdict,
                fmt(mark["cpu_us_per_turn"], 0), f"{mark['warm_agents']:,}",
            ])
    traced = results["traced"]
    top = traced["marks"][-1]
    sites = [[row["site"], fmt(row["bytes_per_agent"], 0), fmt(row["objects_per_agent"], 1)] for row in top["top"]]
    return (
        f"From `benchmarks/results/bench-usage-{results['mode']}.json` (`loopdock bench --usage`, commit "
        f"`{m.get('git_commit') or '-'}`, {m['date']}, {m['cpu_count']} CPUs, one run per size, each a fresh "
        f"process; load average {m.get('load_average_at_start')} at the start, {m.get('load_average_at_end')} "
        "at the end):\n\n"
        + _table(["agents", "turns each", "KB per agent (RSS)", f"<= {target} KB after {last} turns",
                  "CPU us per turn, so far", "histories warm"], rows)
        + f"\n\nWhat {traced['n']:,} agents hold after {top['turns']} turns each (tracemalloc, the same "
        f"sequence traced): {fmt(top['traced_kb_per_agent'])} KB per agent of live Python memory, beside "
        f"{fmt(top['kb_per_agent'])} KB of RSS (tracing's own bookkeeping included). The ten biggest "
        "allocation sites:\n\n"
        + _table(["allocation site", "bytes per agent", "blocks per agent"], sites)
    )


def usage_summary(results: dict[str, Any]) -> str:
    """README's sentence on memory per agent as a user measures it."""
    last = max(results["config"]["marks"])
    at = [
        f"{fmt(mark['kb_per_agent'])} KB per agent with {run['n']:,} agents"
        for run in results["runs"] for mark in run["marks"] if mark["turns"] == last
    ]
    return (
        f"Memory as a user measures it (`loopdock bench --usage`, commit "
        f"`{results['machine'].get('git_commit') or '-'}`: `Runtime.open()` with its defaults, every agent "
        f"sent {last} followups in rounds, handles kept, RSS after a full collection) is {' and '.join(at)} "
        f"after {last} turns each (target <= {results['target_kb_per_agent']} KB; the `memory` row "
        "above resumes seeded histories with a tuned collector instead; benchmarks/PROFILE.md)."
    )


def _lifecycle_source(results: dict[str, Any]) -> str:
    m, reg, steady = results["machine"], results["registered"], results["steady"]
    return (
        f"From `benchmarks/results/bench-lifecycle-{results['mode']}.json` (`loopdock bench --lifecycle`, commit "
        f"`{m.get('git_commit') or '-'}`, {m['date']}, {m['cpu_count']} CPUs ({m.get('cpu_model') or 'unknown CPU'}), "
        f"Python {m['python']}; each phase a fresh process, run with `nice -n 19` beside other work on the same "
        f"machine: load average {m.get('load_average_at_start')} at the start, {reg.get('load_average')} after the "
        f"registered phase, {steady.get('load_average')} after the steady one)"
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def lifecycle_targets(results: dict[str, Any]) -> str:
    rows = []
    for t in results["targets"]:
        measured = f"{fmt(t['measured'], 2)} {t['unit']}"
        rows.append([t["target"], measured + (f" ({t['note']})" if t.get("note") else ""), t["at"], _VERDICT[t["passed"]]])
    return _table(["target", "measured", "at", ""], rows)


def lifecycle_table(results: dict[str, Any]) -> str:
    """benchmarks/PROFILE.md's lifecycle figures, from a ``loopdock bench --lifecycle`` JSON."""
    reg, steady = results["registered"], results["steady"]
    p, r, loop, react = reg["params"], reg["registered"], reg["open_loop"], reg["reactivation"]
    adm, late, pauses, tail, stalls = (loop["admission"], loop["sender_late"], loop["gc"], loop["tail"],
                                       loop["stalls"])
    rows = [
        ["agents registered / passivated / held active", f"{r['agents']:,} / {r['passivated']:,} / {r['active']:,}"],
        ["RSS, total (after a full collection)", f"{fmt(r['rss_mb'] / 1024, 2)} GB ({fmt(r['rss_before_mb'])} MB before "
         "the first agent)"],
        ["RSS per registered agent", f"{fmt(r['bytes_per_registered'], 0)} B"],
        ["the store on disk", f"{fmt(r['store_mb'])} MB"],
        [f"creation, {p['creators']} creators at once, passivation after {p['passivate_after']:g} s included",
         f"{fmt(r['created_per_s'], 0)} agents/s created, {fmt(r['created_and_passivated_per_s'], 0)} agents/s "
         f"created and passivated, {fmt(r['cpu_us_per_agent'], 0)} us CPU per agent"],
        [f"first message -> admission, open loop, {fmt(loop['rate_per_s'], 0)} messages/s to "
         f"{loop['messages']:,} different passivated agents",
         f"p50 {fmt(adm['p50_ms'], 2)} ms, p99 {fmt(adm['p99_ms'], 2)} ms, max {fmt(adm['max_ms'], 1)} ms; "
         f"{loop['admitted']:,} of {loop['messages']:,} admitted"],
        ["the sender's lateness over that window (the process not running when a send was due)",
         f"p50 {fmt(late['p50_ms'], 2)} ms, p99 {fmt(late['p99_ms'], 2)} ms, max {fmt(late['max_ms'], 1)} ms"],
        ["collector pauses over that window",
         f"{pauses['collections']:,} (generations {', '.join(map(str, pauses['by_generation']))}), longest "
         f"{fmt(pauses['max_ms'], 1)} ms, {fmt(pauses['total_ms'], 1)} ms in all"],
        [f"the loop's stalls over that window (a 1 ms ticker woken over {fmt(stalls['over_ms'], 0)} ms late)",
         f"{stalls['stalls']:,}, longest {fmt(stalls['max_ms'], 1)} ms, {fmt(stalls['total_ms'], 0)} ms in all; "
         f"{stalls['not_run']:,} of them ({fmt(stalls['not_run_ms'], 0)} ms) with the loop's thread using less "
         f"than half the CPU (the process not run); the OS took the CPU from it "
         f"{loop['involuntary_context_switches']:,} times"],
        [f"admissions slower than {fmt(tail['slow_ms'], 0)} ms, and what they waited through",
         f"{tail['slow']:,}: {tail['with_gc_pause']:,} through a collector pause, {tail['sender_late']:,} sent more "
         f"than 1 ms late, {tail['not_run']:,} through a stall in which the process was not run, "
         f"{tail['neither']:,} none of these"],
        ["CPU per message over that window (reactivation, the turn, passivating again: all the process did)",
         f"{fmt(loop['cpu_us_per_message'], 0)} us"],
        [f"reactivation, `activate()` of {react['agents']:,} passivated agents one after the other",
         f"{fmt(react['cpu_us_per_agent'], 0)} us CPU per agent (wall p50 {fmt(react['wall']['p50_ms'], 2)} ms, "
         f"p99 {fmt(react['wall']['p99_ms'], 2)} ms); passivating them again {fmt(react['passivation_cpu_us_per_agent'], 0)} "
         "us CPU per agent"],
    ]
    sp, verdict = steady["params"], steady["verdict"]
    per_admitted, collector = steady["cpu_us_per_admitted"] / 1e6, steady["gc"]
    step = max(1, round(60 / sp["sample_every"])) if sp["seconds"] >= 120 else 1
    # One row a minute, the last, and the one holding the longest collector pause.
    every = steady["samples"]
    longest = max(every, key=lambda sample: sample["gc"]["max_ms"])
    samples = [sample for i, sample in enumerate(every) if i % step == 0 or sample is every[-1] or sample is longest]
    t_digits = 0 if sp["sample_every"] >= 1 else 1
    sample_rows = [[fmt(s["t"], t_digits), fmt(s["rss_mb"], 0), f"{s['active']:,}", f"{s['queued']:,}", f"{s['sent']:,}",
                    f"{s['behind']:,}", fmt(s["sender_late_ms"], 1), fmt(s["admission"]["p99_ms"], 1),
                    fmt(s["gc"]["max_ms"], 1)]
                   for s in samples]
    return (
        _lifecycle_source(results) + ":\n\n"
        + f"**Registered agents** (N = {reg['n']:,}, the first {p['active']:,} held active with `keep_active()`, "
        f"the rest passivated {p['passivate_after']:g} s after their creation):\n\n"
        + _table(["figure", "measured"], rows)
        + f"\n\n**Steady churn**: {steady['n']:,} agents, all passivated, then {fmt(steady['rate_per_s'], 0)} "
        f"followups per second ({sp['fraction']:.0%} of them) to random agents for {_duration(sp['seconds'])}, "
        f"`passivate_after` {sp['passivate_after']:g} s; {steady['reactivations']:,} reactivations, "
        f"the process busy {steady['cpu_share']:.0%} of the time (CPU time / wall time, both threads), "
        f"{fmt(per_admitted * 1e6, 0)} us of CPU per touch admitted: keeping up with {fmt(steady['rate_per_s'], 0)} "
        f"touches/s at that cost takes {fmt(per_admitted * steady['rate_per_s'], 2)} CPUs (derived: CPU time / "
        f"touches admitted x rate); the collector paused it {collector['collections']:,} times, "
        f"{fmt(collector['total_ms'] / 1e3, 1)} s in all, the longest pause {fmt(collector['max_ms'], 0)} ms. "
        f"**{verdict['why']}.**\n\n"
        + _table(["s", "RSS MB", "active agents", "messages queued", "sent", "not yet admitted",
                  "sender late, max ms", "admission p99 ms", "longest GC pause ms"], sample_rows)
        + "\n\n" + lifecycle_targets(results)
    )


def lifecycle_summary(results: dict[str, Any]) -> str:
    """docs/lifecycle.md's measured figures (its "Measured" section)."""
    reg = results["registered"]
    r, loop, react = reg["registered"], reg["open_loop"], reg["reactivation"]
    return (
        _lifecycle_source(results) + f": {reg['n']:,} agents registered, {r['passivated']:,} of them passivated, "
        f"took {fmt(r['rss_mb'] / 1024, 2)} GB of RSS ({fmt(r['bytes_per_registered'], 0)} B per registered agent); "
        f"a first message to a passivated agent was admitted after {fmt(loop['admission']['p50_ms'], 2)} ms at the "
        f"median and {fmt(loop['admission']['p99_ms'], 1)} ms at p99 (open loop, {fmt(loop['rate_per_s'], 0)}/s); "
        f"bringing one back cost {fmt(react['cpu_us_per_agent'], 0)} us of CPU. benchmarks/PROFILE.md has every "
        "figure and what explains the tail.\n\n" + lifecycle_targets(results)
    )


def is_lifecycle(results: dict[str, Any]) -> bool:
    return "registered" in results and "steady" in results


def is_usage(results: dict[str, Any]) -> bool:
    return "traced" in results and "target_kb_per_agent" in results


def is_cluster(results: dict[str, Any]) -> bool:
    return "cluster-1" in results.get("runs", {})


def is_tracing(results: dict[str, Any]) -> bool:
    return "on" in results.get("runs", {}) and "off" in results["runs"]


def replace_blocks(text: str, generated: dict[str, str]) -> str:
    for name, body in generated.items():
        pattern = re.compile(rf"(<!-- bench:{name} -->\n)(?:.*?\n)?(<!-- /bench:{name} -->)", re.S)
        text, count = pattern.subn(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
        if count == 0 and f"<!-- bench:{name} -->" in text:
            raise ValueError(f"unterminated bench block {name!r}")
    return text


def write_docs(json_path: Path, root: Path) -> list[Path]:
    """Regenerate the tables of the docs under ``root`` (a loopdock checkout) from ``json_path``."""
    results = json.loads(Path(json_path).read_text())
    if is_cluster(results):
        generated, docs = {"cluster": cluster_table(results)}, CLUSTER_DOCS
    elif is_lifecycle(results):
        generated = {"lifecycle": lifecycle_table(results), "lifecycle-summary": lifecycle_summary(results)}
        docs = LIFECYCLE_DOCS
    elif is_usage(results):
        generated, docs = {"usage": usage_table(results), "usage-summary": usage_summary(results)}, USAGE_DOCS
    elif is_tracing(results):
        generated = {"tracing": tracing_table(results), "tracing-summary": tracing_summary(results)}
        docs = TRACING_DOCS
    else:
        generated, docs = blocks(results), DOCS
    written = []
    for doc, names in docs.items():
        path = root / doc
        text = path.read_text()
        new = replace_blocks(text, {name: generated[name] for name in names})
        if new != text:
            path.write_text(new)
        written.append(path)
    return written
