"""Ratios, targets, the terminal table and the PNG plot, from the raw figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO


def _row(rows: list[dict[str, Any]], n: int) -> dict[str, Any] | None:
    return next((row for row in rows if row["n"] == n), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _largest_at_most(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    fitting = [row for row in rows if row["n"] <= n]
    return max(fitting or rows, key=lambda row: row["n"])


def compute(results: dict[str, Any]) -> None:
    """Add ``ratios`` (every figure against the floor and the peer) and ``targets``."""
    floor, peer, many = results["floor"], results["peer"], results["many"]
    peer_ok = peer.get("status") == "ok"
    hop = floor["hop"]
    one = _row(many, 1) or many[0]
    ratios: dict[str, Any] = {
        "step_us": one["us_per_step"],
        "step_cpu_us": one["cpu_us_per_step"],
        "step_vs_floor_hop": _ratio(one["us_per_step"], hop["mean_us"]),
        "step_cpu_vs_floor_hop_cpu": _ratio(one["cpu_us_per_step"], hop["cpu_us"]),
        "step_cpu_vs_peer_message_cpu": _ratio(one["cpu_us_per_step"], peer["sequential"]["cpu_us"]) if peer_ok else None,
        "step_vs_peer_message": _ratio(one["us_per_step"], peer["sequential"]["mean_us"]) if peer_ok else None,
        "per_n": [],
        "priority": [],
    }
    for row in many:
        f = _row(floor["rows"], row["n"]) or {}
        p = (_row(peer["rows"], row["n"]) or {}) if peer_ok else {}
        ratios["per_n"].append({
            "n": row["n"],
            "throughput_vs_floor": _ratio(row["steps_per_s"], f.get("hops_per_s")),
            "throughput_vs_peer": _ratio(row["steps_per_s"], p.get("msgs_per_s")),
            # The same in CPU time (both processes' CPU per operation): robust to neighbours.
            "cpu_throughput_vs_peer": _ratio(p.get("cpu_us_per_msg"), row["cpu_us_per_step"]),
            "admission_p50_vs_floor": _ratio(row["admission"]["p50_ms"], f.get("p50_ms")),
            "admission_p99_vs_floor": _ratio(row["admission"]["p99_ms"], f.get("p99_ms")),
            "turn_p50_vs_peer": _ratio(row["turn"]["p50_ms"], p.get("p50_ms")),
            "turn_p99_vs_peer": _ratio(row["turn"]["p99_ms"], p.get("p99_ms")),
            "memory_vs_floor": _ratio(row["mem_per_idle_agent_kb"], f.get("mem_per_idle_kb")),
            "memory_vs_peer": _ratio(row["mem_per_idle_agent_kb"], p.get("mem_per_idle_kb")),
        })
    for row in results["priority"]["rows"]:
        ratios["priority"].append({
            "scenario": row["scenario"],
            "p99_vs_floor_hop_p99": _ratio(row["admission"]["p99_ms"] * 1e3, hop["p99_us"]),
            "p99_vs_peer_message_p99": (
                _ratio(row["admission"]["p99_ms"] * 1e3, peer["sequential"]["p99_us"]) if peer_ok else None
            ),
        })
    ratios["bridge"] = _bridge_ratios(results)
    results["ratios"] = ratios
    results["targets"] = _targets(results)


def _bridge_ratios(results: dict[str, Any]) -> dict[str, Any] | None:
    """The bridge's round trips against this run's bare trio channel hop, its websocket
    ping (the same connection, answered by the protocol with no handler) and the peer."""
    bridge = results.get("bridge") or {}
    if bridge.get("status") != "ok":
        return None
    hop, peer = results["floor"]["hop"], results["peer"]
    peer_ok = peer.get("status") == "ok"
    pre, ping, wake = bridge["pre_step_sequential"], bridge["ping"], bridge["goalbar"]["wake_to_frame"]
    return {
        "pre_step_p50_vs_floor_hop_p50": _ratio(pre["p50_ms"] * 1e3, hop["p50_us"]),
        "pre_step_p99_vs_floor_hop_p99": _ratio(pre["p99_ms"] * 1e3, hop["p99_us"]),
        "pre_step_p50_vs_ws_ping_p50": _ratio(pre["p50_ms"], ping["p50_ms"]),
        "pre_step_p50_vs_peer_message_p50": _ratio(pre["p50_ms"] * 1e3, peer["sequential"]["p50_us"]) if peer_ok else None,
        "ws_ping_p50_vs_floor_hop_p50": _ratio(ping["p50_ms"] * 1e3, hop["p50_us"]),
        "goalbar_wake_p50_vs_floor_hop_p50": _ratio(wake["p50_ms"] * 1e3, hop["p50_us"]),
    }


def _targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    ratios, many, peer = results["ratios"], results["many"], results["peer"]
    quick = results["mode"] != "full"
    targets = []

    step = ratios["step_cpu_vs_floor_hop_cpu"]
    targets.append({
        "id": "step-cost",
        "target": "one agent step (followup -> admitted -> ping -> tool call -> step end, persisted) <= 20x one bare channel hop",
        "measured": step,
        "unit": "x floor hop (CPU time)",
        "passed": step is not None and step <= 20,
        "note": f"N=1 standard loop: {ratios['step_cpu_us']:.0f} us CPU per step (both threads) vs {results['floor']['hop']['cpu_us']:.1f} us"
        f" per hop; wall clock {ratios['step_us']:.0f} us = {_x(ratios['step_vs_floor_hop'])}",
    })

    row = _largest_at_most(many, 1000)
    throughput = next(r for r in ratios["per_n"] if r["n"] == row["n"])["throughput_vs_peer"]
    targets.append({
        "id": "throughput",
        "target": "aggregate step throughput at N=1,000 >= 2x autogen-core message throughput, same N",
        "at_n": row["n"],
        "measured": throughput,
        "unit": "x peer",
        "passed": None if throughput is None else throughput >= 2,
        "note": (f"peer {peer['status']}" if peer.get("status") != "ok" else "in CPU time: " + _x(
            next(r for r in ratios["per_n"] if r["n"] == row["n"])["cpu_throughput_vs_peer"]))
        + (f"; quick run: at N={row['n']}" if quick and row["n"] != 1000 else ""),
    })

    row = _largest_at_most(many, 10000)
    kb = row["mem_per_idle_agent_kb"]
    targets.append({
        "id": "memory",
        "target": "10,000 agents in one process, <= 50 KB per idle agent",
        "at_n": row["n"],
        "measured": kb,
        "unit": "KB per idle agent (RSS)",
        "passed": kb <= 50,
        "note": f"tracemalloc: {row['tracemalloc_per_agent_kb']:.1f} KB"
        + (f"; quick run: at N={row['n']}" if quick and row["n"] != 10000 else ""),
    })

    spread = next(r for r in results["priority"]["rows"] if r["scenario"] == "spread")
    p99 = spread["admission"]["p99_ms"]
    targets.append({
        "id": "human-priority",
        "target": "human followup admission p99 < 5 ms under 10,000 pending reservations",
        "pending": spread["pending"],
        "measured": p99,
        "unit": "ms p99",
        "passed": p99 < 5,
        "note": f"{spread['pending']} pending over {spread['agents']} agents"
        + ("; quick run: fewer pending" if spread["pending"] < 10000 else ""),
    })
    return targets


# -- the table ------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e5:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}x" if value < 10 else f"{value:.1f}x" if value < 100 else f"{value:,.0f}x"


def _table(out: TextIO, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    print("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths)), file=out)
    for row in rows:
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)), file=out)


def print_table(results: dict[str, Any], out: TextIO) -> None:
    m, floor, peer, ratios = results["machine"], results["floor"], results["peer"], results["ratios"]
    peer_ok = peer.get("status") == "ok"
    print(file=out)
    print(
        f"loopdock bench ({results['mode']}) {m['date']}  {m['platform']}, {m['cpu_count']} CPUs, "
        f"Python {m['python']}, trio {m['trio']}, autogen-core {m['autogen_core'] or 'not installed'}, "
        f"commit {m['git_commit'] or '-'}",
        file=out,
    )
    print(
        f"load average at start {m.get('load_average_at_start')}, at end {m.get('load_average_at_end')}"
        " (other work on this machine inflates wall-clock figures; CPU-time figures are robust to it)",
        file=out,
    )
    hop = floor["hop"]
    print("\nOne request/response, sequential", file=out)
    print(
        f"  floor  trio memory channels: {hop['mean_us']:.1f} us/hop, {hop['cpu_us']:.1f} us CPU"
        f" (p50 {hop['p50_us']:.1f}, p99 {hop['p99_us']:.1f})", file=out,
    )
    if peer_ok:
        s = peer["sequential"]
        print(
            f"  peer   {peer['name']}: {s['mean_us']:.1f} us/message, {s['cpu_us']:.1f} us CPU"
            f" (p50 {s['p50_us']:.1f}, p99 {s['p99_us']:.1f})", file=out,
        )
    else:
        print(f"  peer   {peer['name']}: {peer['status']} ({peer.get('hint', '')})", file=out)
    print(
        f"  ours   one agent step (N=1, standard loop, react driver, tool call, persisted): {ratios['step_us']:.0f} us"
        f" = {_x(ratios['step_vs_floor_hop'])} floor, {_x(ratios['step_vs_peer_message'])} peer;"
        f" {ratios['step_cpu_us']:.0f} us CPU = {_x(ratios['step_cpu_vs_floor_hop_cpu'])} floor,"
        f" {_x(ratios['step_cpu_vs_peer_message_cpu'])} peer",
        file=out,
    )

    k = results["config"]["k"]
    many = results["many"]
    per_n = {r["n"]: r for r in ratios["per_n"]}
    peer_rows = {r["n"]: r for r in peer["rows"]} if peer_ok else {}
    floor_rows = {r["n"]: r for r in floor["rows"]}
    print(f"\nMany agents: K={k} turns each, one tool call per turn, ping model, SQLite persistence on", file=out)
    print(f"  loops: {', '.join(many[-1]['loops'])}", file=out)
    _table(out, ["N", "turns", "steps", "steps/s", "floor hops/s", "peer msgs/s", "÷floor", "÷peer", "CPU us/step", "peer CPU us/msg", "CPU ÷peer"], [
        [f"{r['n']:,}", f"{r['turns']:,}", f"{r['steps']:,}", _f(r["steps_per_s"], 0),
         _f(floor_rows.get(r["n"], {}).get("hops_per_s"), 0), _f(peer_rows.get(r["n"], {}).get("msgs_per_s"), 0),
         _x(per_n[r["n"]]["throughput_vs_floor"]), _x(per_n[r["n"]]["throughput_vs_peer"]),
         _f(r["cpu_us_per_step"], 0), _f(peer_rows.get(r["n"], {}).get("cpu_us_per_msg"), 0),
         _x(per_n[r["n"]]["cpu_throughput_vs_peer"])]
        for r in many
    ])
    print("\nLatency, ms (admit: followup -> step start; turn: followup -> idle; floor/peer: one round trip)", file=out)
    _table(out, ["N", "admit p50", "admit p99", "turn p50", "turn p99", "floor p50", "floor p99", "peer p50", "peer p99", "turn p99÷peer"], [
        [f"{r['n']:,}", _f(r["admission"]["p50_ms"], 3), _f(r["admission"]["p99_ms"], 3),
         _f(r["turn"]["p50_ms"], 3), _f(r["turn"]["p99_ms"], 3),
         _f(floor_rows.get(r["n"], {}).get("p50_ms"), 3), _f(floor_rows.get(r["n"], {}).get("p99_ms"), 3),
         _f(peer_rows.get(r["n"], {}).get("p50_ms"), 3), _f(peer_rows.get(r["n"], {}).get("p99_ms"), 3),
         _x(per_n[r["n"]]["turn_p99_vs_peer"])]
        for r in many
    ])
    print("\nMemory (KB per idle agent: RSS delta after creating N idle agents / N)", file=out)
    _table(out, ["N", "KB/agent", "tracemalloc KB", "floor KB/task", "peer KB/agent", "÷floor", "÷peer", "peak RSS MB"], [
        [f"{r['n']:,}", _f(r["mem_per_idle_agent_kb"]), _f(r["tracemalloc_per_agent_kb"]),
         _f(floor_rows.get(r["n"], {}).get("mem_per_idle_kb")), _f(peer_rows.get(r["n"], {}).get("mem_per_idle_kb")),
         _x(per_n[r["n"]]["memory_vs_floor"]), _x(per_n[r["n"]]["memory_vs_peer"]), _f(r["peak_rss_mb"])]
        for r in many
    ])
    print("\nHuman priority: followup -> admission while automatic reservations are pending", file=out)
    prio = {r["scenario"]: r for r in ratios["priority"]}
    _table(out, ["scenario", "agents", "pending", "busy agents", "busy turns/s", "humans", "p50 ms", "p99 ms", "max ms", "p99÷floor hop p99", "GC >1ms", "GC max ms"], [
        [r["scenario"], f"{r['agents']:,}", f"{r['pending']:,}", f"{r['busy_agents']:,}", _f(r["busy_turns_per_s"], 0),
         f"{r['humans']:,}", _f(r["admission"]["p50_ms"], 3), _f(r["admission"]["p99_ms"], 3),
         _f(r["admission"]["max_ms"], 3), _x(prio[r["scenario"]]["p99_vs_floor_hop_p99"]),
         str(r["gc"]["over_1ms"]), _f(r["gc"]["max_ms"], 1)]
        for r in results["priority"]["rows"]
    ])
    print("\nTargets", file=out)
    for t in results["targets"]:
        verdict = {True: "PASS", False: "MISS", None: "N/A "}[t["passed"]]
        note = f"  ({t['note'].strip()})" if t.get("note", "").strip() else ""
        print(f"  [{verdict}] {t['target']}: {_f(t['measured'], 2)} {t['unit']}{note}", file=out)
    _print_bridge(results, out)
    files = results.get("files", {})
    written = [files.get("json"), files.get("png")]
    print(f"\nwritten: {', '.join(f for f in written if f)}", file=out)
    if files.get("png_skipped"):
        print(f"no plot: {files['png_skipped']}", file=out)
    print(f"took {results['seconds']:.0f} s", file=out)


def _print_bridge(results: dict[str, Any], out: TextIO) -> None:
    bridge = results.get("bridge") or {}
    if bridge.get("status") != "ok":
        print(f"\nBridge: {bridge.get('status', 'not run')}", file=out)
        return
    ratios = results["ratios"]["bridge"]
    hop_us = results["floor"]["hop"]["p50_us"]
    print(
        "\nBridge: a client process speaking the DSH plugin's frames (and a GoalBar page's) over a loopback websocket"
        " to serve_bridge + HostHandler + GoalBarHandler in another process; LoopX replaced by a stand-in",
        file=out,
    )
    ping, pre, burst, wake = bridge["ping"], bridge["pre_step_sequential"], bridge["pre_step_burst"], bridge["goalbar"]["wake_to_frame"]
    _table(out, ["round trip", "samples", "p50 ms", "p99 ms", "max ms", "p50÷floor hop", "p99÷floor hop"], [
        ["websocket ping -> pong (no handler)", f"{ping['samples']:,}", _f(ping["p50_ms"], 3), _f(ping["p99_ms"], 3),
         _f(ping["max_ms"], 3), _x(ratios["ws_ping_p50_vs_floor_hop_p50"]), "-"],
        ["pre-step -> verdict (HostHandler gate), one at a time", f"{pre['samples']:,}", _f(pre["p50_ms"], 3),
         _f(pre["p99_ms"], 3), _f(pre["max_ms"], 3), _x(ratios["pre_step_p50_vs_floor_hop_p50"]),
         _x(ratios["pre_step_p99_vs_floor_hop_p99"])],
        [f"pre-step -> verdict, bursts of {burst['burst_size']} ({_f(burst['verdicts_per_s'], 0)} verdicts/s)",
         f"{burst['samples']:,}", _f(burst["p50_ms"], 3), _f(burst["p99_ms"], 3), _f(burst["max_ms"], 3), "-", "-"],
        ["session event -> GoalBar frame showing it", f"{wake['samples']:,}", _f(wake["p50_ms"], 3),
         _f(wake["p99_ms"], 3), _f(wake["max_ms"], 3), _x(ratios["goalbar_wake_p50_vs_floor_hop_p50"]), "-"],
    ])
    print(
        f"  (floor hop p50 {hop_us:.1f} us; pre-step p50 = {_x(ratios['pre_step_p50_vs_ws_ping_p50'])} the websocket ping"
        + (f", {_x(ratios['pre_step_p50_vs_peer_message_p50'])} an autogen-core message p50)" if ratios["pre_step_p50_vs_peer_message_p50"] else ")"),
        file=out,
    )
    ingest, relay, flood, server = bridge["ingest"], bridge["relay"], bridge["goalbar"], bridge["server"]
    _table(out, ["events", "count", "events/s", "frames/s", "events/frame", "clock stops on"], [
        [f"host -> runtime, mirrored ({ingest['sessions']} sessions)", f"{ingest['events']:,}", _f(ingest["events_per_s"], 0),
         _f(ingest["frames_per_s"], 0), _f(ingest["items_per_frame"], 0), "pong to a ping sent after the last frame"],
        [f"host -> runtime -> GoalBar page (bench relay, {relay['window']:,} in flight)", f"{relay['events']:,}",
         _f(relay["events_per_s"], 0), _f(relay["page_frames"] / relay["seconds"], 0), _f(relay["items_per_page_frame"], 0),
         "the page got the last event"],
        ["host events -> GoalBar frames (coalesced re-reads)", f"{flood['flood_events']:,}", _f(flood["flood_events_per_s"], 0),
         _f(flood["flood_frames_per_s"], 0), _f(flood["events_per_frame"], 0), "the page saw the last event counted"],
    ])
    print(
        f"  relay latency under a full window: p50 {_f(relay['latency']['p50_ms'], 2)} ms, p99 {_f(relay['latency']['p99_ms'], 2)} ms;"
        f" server: {server['ingest_events'] + server['relay_events']:,} events mirrored, {server['gaps']} gaps,"
        f" {server['goalbar_reads']:,} GoalBar reads, {server['cpu_seconds']:.1f} s CPU in all",
        file=out,
    )


# -- the plot -------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> str | None:
    """Write the PNG; returns why not (matplotlib missing) or None once written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'loopdock[bench]')"
    many, floor, peer = results["many"], results["floor"], results["peer"]
    peer_ok = peer.get("status") == "ok"
    ns = [r["n"] for r in many]
    bridge = results.get("bridge") or {}
    bridge_ok = bridge.get("status") == "ok"
    figure, axes_row = plt.subplots(1, 3 if bridge_ok else 2, figsize=(15.5 if bridge_ok else 11, 4.2))
    left, right = axes_row[0], axes_row[1]
    left.plot(ns, [r["steps_per_s"] for r in many], "o-", label="loopdock steps/s")
    left.plot([r["n"] for r in floor["rows"]], [r["hops_per_s"] for r in floor["rows"]], "s--", label="floor: trio channel hops/s")
    if peer_ok:
        left.plot([r["n"] for r in peer["rows"]], [r["msgs_per_s"] for r in peer["rows"]], "^--", label="autogen-core msgs/s")
    left.set(xscale="log", yscale="log", xlabel="agents (N)", ylabel="per second", title="Throughput")
    right.plot(ns, [r["admission"]["p50_ms"] for r in many], "o-", label="loopdock admission p50")
    right.plot(ns, [r["admission"]["p99_ms"] for r in many], "o:", label="loopdock admission p99")
    right.plot(ns, [r["turn"]["p99_ms"] for r in many], "D:", label="loopdock turn p99")
    right.plot([r["n"] for r in floor["rows"]], [r["p99_ms"] for r in floor["rows"]], "s--", label="floor hop p99")
    if peer_ok:
        right.plot([r["n"] for r in peer["rows"]], [r["p99_ms"] for r in peer["rows"]], "^--", label="autogen-core p99")
    right.set(xscale="log", yscale="log", xlabel="agents (N)", ylabel="ms", title="Latency")
    if bridge_ok:
        _plot_bridge(axes_row[2], results)
    for axes in (left, right):
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(fontsize=7)
    m = results["machine"]
    figure.suptitle(
        f"loopdock bench ({results['mode']}), {m['cpu_count']} CPUs, Python {m['python']}, {m['date'][:10]}", fontsize=10
    )
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return None


def _plot_bridge(axes: Any, results: dict[str, Any]) -> None:
    """The bridge's round trips (p50 and p99) next to this run's floor hop."""
    bridge, hop = results["bridge"], results["floor"]["hop"]
    rows = [
        ("floor hop", hop["p50_us"] / 1e3, hop["p99_us"] / 1e3),
        ("ws ping", bridge["ping"]["p50_ms"], bridge["ping"]["p99_ms"]),
        ("pre-step", bridge["pre_step_sequential"]["p50_ms"], bridge["pre_step_sequential"]["p99_ms"]),
        (f"pre-step\nburst {bridge['pre_step_burst']['burst_size']}", bridge["pre_step_burst"]["p50_ms"], bridge["pre_step_burst"]["p99_ms"]),
        ("GoalBar\nwake", bridge["goalbar"]["wake_to_frame"]["p50_ms"], bridge["goalbar"]["wake_to_frame"]["p99_ms"]),
    ]
    x = range(len(rows))
    axes.bar([i - 0.2 for i in x], [r[1] for r in rows], 0.4, label="p50")
    axes.bar([i + 0.2 for i in x], [r[2] for r in rows], 0.4, label="p99")
    axes.set_xticks(list(x), [r[0] for r in rows], fontsize=7)
    axes.set(yscale="log", ylabel="ms", title="Bridge round trips (loopback websocket)")
    axes.grid(True, axis="y", which="major", alpha=0.3)
    axes.legend(fontsize=7)
