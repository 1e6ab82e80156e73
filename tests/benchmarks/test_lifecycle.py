"""The lifecycle benchmark at tiny sizes (``loopdock bench --lifecycle``): every phase
runs through the public API and says what it measured; counts are checked, never timings
(the autojump clock runs the in-process phases; the subprocess run uses the real one)."""

import json

import pytest

from loopdock.benchmarks._lifecycle import (
    BACKLOG_SECONDS,
    FLAT_TOLERANCE,
    SIZES,
    explain_tail,
    main,
    run_lifecycle,
    run_registered,
    run_steady,
    steady_verdict,
    targets,
)

REGISTERED = {"n": 300, "active": 30, "creators": 8, "passivate_after": 5.0, "rate": 100.0,
              "messages": 20, "reactivations": 15, "seed": 3}
STEADY = {"n": 200, "creators": 8, "passivate_after": 1.0, "fraction": 0.05, "seconds": 4.0,
          "sample_every": 1.0, "warmup": 1.0, "seed": 4}


async def test_registered_agents_are_passivated_but_the_held_ones_and_every_first_message_is_admitted(autojump_clock):
    labels: list[str] = []
    result = await run_registered(REGISTERED, lambda fraction, label: labels.append(label))
    reg, loop, react = result["registered"], result["open_loop"], result["reactivation"]
    n, active = REGISTERED["n"], REGISTERED["active"]
    assert reg["agents"] == n and reg["passivated"] == n - active and reg["active"] == active
    assert reg["active_at_end"] == active  # the messaged and reactivated ones went back
    assert reg["rss_mb"] > 0 and reg["cpu_us_per_agent"] > 0 and reg["store_mb"] > 0
    # Each message went to a passivated agent, brought it back once, and its turn was admitted.
    assert loop["messages"] == loop["admitted"] == loop["reactivations"] == REGISTERED["messages"]
    assert loop["admission"]["samples"] == loop["sender_late"]["samples"] == REGISTERED["messages"]
    assert loop["admission"]["p50_ms"] <= loop["admission"]["p99_ms"] <= loop["admission"]["max_ms"]
    tail = loop["tail"]
    assert tail["with_gc_pause"] <= tail["slow"] and tail["sender_late"] <= tail["slow"]
    assert tail["neither"] <= tail["slow"] and set(loop["gc"]) >= {"collections", "max_ms", "by_generation"}
    assert loop["stalls"]["not_run"] <= loop["stalls"]["stalls"]
    assert react["agents"] == react["reactivated"] == REGISTERED["reactivations"]
    assert react["cpu_us_per_agent"] > 0 and react["wall"]["samples"] == REGISTERED["reactivations"]
    assert any(label.startswith("registered: 270 of 300 passivated") for label in labels)


async def test_registered_refuses_sizes_that_leave_too_few_passivated_agents():
    with pytest.raises(ValueError, match="too few passivated agents"):
        await run_registered({**REGISTERED, "active": 280}, lambda fraction, label: None)


async def test_steady_samples_the_whole_run_and_every_touch_is_admitted(autojump_clock):
    result = await run_steady(STEADY, lambda fraction, label: None)
    rate = STEADY["n"] * STEADY["fraction"]
    assert result["rate_per_s"] == rate and result["sent"] == int(rate * STEADY["seconds"])
    samples = result["samples"]
    assert [s["t"] for s in samples] == [0.0, 1.0, 2.0, 3.0, 4.0]  # every sample_every, the end included
    assert [s["sent"] for s in samples] == sorted(s["sent"] for s in samples)
    assert all(s["behind"] == s["sent"] - s["admitted"] >= 0 for s in samples)
    assert all(0 <= s["active"] <= STEADY["n"] for s in samples)
    assert samples[0]["active"] == 0  # all passivated before the first touch
    assert 0 < result["reactivations"] <= result["sent"]
    verdict = result["verdict"]
    assert verdict["flat"] == (verdict["growth"] <= FLAT_TOLERANCE)
    assert verdict["kept_up"] == (samples[-1]["behind"] <= rate * BACKLOG_SECONDS)
    assert verdict["why"].startswith("flat" if verdict["flat"] else "not flat")


def _sample(t, rss, sent, admitted, active=5, queued=0, late=1.0):
    return {"t": t, "rss_mb": rss, "sent": sent, "admitted": admitted, "behind": sent - admitted,
            "active": active, "queued": queued, "sender_late_ms": late}


def test_the_steady_verdict_says_why_memory_grew():
    kept = [_sample(0, 100, 0, 0), _sample(10, 200, 100, 100), _sample(20, 205, 200, 199)]
    verdict = steady_verdict(kept, warmup=10, rate=10)
    assert verdict["flat"] and verdict["kept_up"] and verdict["reference_t"] == 10
    assert "it kept up: 1 of 200 messages" in verdict["why"]
    behind = [_sample(0, 100, 0, 0), _sample(10, 200, 100, 50), _sample(20, 900, 200, 60, active=150, queued=140)]
    verdict = steady_verdict(behind, warmup=10, rate=10)
    assert not verdict["flat"] and not verdict["kept_up"]
    assert verdict["why"].startswith("not flat: RSS 200 MB at 10 s -> 900 MB at 20 s (+350.0%")
    assert "140 of 200 messages not admitted" in verdict["why"] and "140 messages queued" in verdict["why"]


def test_the_tail_is_explained_by_pauses_and_late_senders():
    done = [(0.0, 0.001), (1.0, 1.020), (2.0, 2.030), (3.0, 3.040)]  # three slow ones (> 5 ms)
    lateness = {0.0: 0.0, 1.0: 0.0, 2.0: 0.015, 3.0: 0.0}
    windows = [(1.005, 0.010, 2)]  # a 10 ms pause inside the second message's wait
    tail = explain_tail(done, lateness, windows)
    assert (tail["slow"], tail["with_gc_pause"], tail["sender_late"], tail["not_run"], tail["neither"]) == (3, 1, 1, 0, 1)
    assert tail["gc_ms_inside_slow"] == pytest.approx(10.0)
    # The loop stalled 20 ms inside the last one's wait with 1 ms of CPU: the process was not run.
    # A stall as long that used its CPU (the loop busy) explains nothing by itself.
    busy = (1.0, 0.02, 0.015)
    tail = explain_tail(done, lateness, windows, [(3.01, 0.02, 0.001), busy])
    assert (tail["not_run"], tail["neither"]) == (1, 0)


def test_the_phase_command_refuses_bad_params(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--phase", "steady", "--params", "[1, 2]"])
    assert exit.value.code == 2 and "--params must be a JSON object" in capsys.readouterr().err


def test_the_lifecycle_run_has_every_phase_and_judges_nothing_in_quick_mode(tmp_path):
    from loopdock.benchmarks._tables import is_lifecycle, lifecycle_summary, lifecycle_table, write_docs

    results = run_lifecycle("quick", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "bench-lifecycle-quick.json").read_text()) == results
    cfg = SIZES["quick"]
    reg, steady = results["registered"], results["steady"]
    assert reg["n"] == cfg["registered"]["n"] and steady["n"] == cfg["steady"]["n"]
    assert reg["registered"]["passivated"] == cfg["registered"]["n"] - cfg["registered"]["active"]
    assert reg["open_loop"]["admitted"] == cfg["registered"]["messages"]
    assert steady["sent"] == int(cfg["steady"]["n"] * cfg["steady"]["fraction"] * cfg["steady"]["seconds"])
    assert [t["passed"] for t in results["targets"]] == [None] * 4  # quick mode judges no target
    assert "extrapolated to N = 1,000,000" in results["targets"][0]["note"]  # measured far below it
    assert all(load is not None for load in (reg["load_average"], steady["load_average"],
                                             results["machine"]["load_average_at_start"]))
    assert is_lifecycle(results)

    table, summary = lifecycle_table(results), lifecycle_summary(results)
    assert f"{cfg['registered']['n']:,}" in table and "not judged" in table
    assert results["targets"][3]["note"] in table  # the steady verdict, in words
    assert f"bench-lifecycle-{results['mode']}.json" in summary

    checkout = tmp_path / "checkout"
    profile, lifecycle_doc = checkout / "benchmarks" / "PROFILE.md", checkout / "docs" / "lifecycle.md"
    profile.parent.mkdir(parents=True)
    lifecycle_doc.parent.mkdir(parents=True)
    profile.write_text("before\n<!-- bench:lifecycle -->\nstale\n<!-- /bench:lifecycle -->\nafter\n")
    lifecycle_doc.write_text("## Measured\n<!-- bench:lifecycle-summary -->\n<!-- /bench:lifecycle-summary -->\n")
    written = write_docs(tmp_path / "out" / "bench-lifecycle-quick.json", checkout)
    assert sorted(written) == sorted([profile, lifecycle_doc])
    assert profile.read_text() == f"before\n<!-- bench:lifecycle -->\n{table}\n<!-- /bench:lifecycle -->\nafter\n"
    assert lifecycle_doc.read_text() == (
        f"## Measured\n<!-- bench:lifecycle-summary -->\n{summary}\n<!-- /bench:lifecycle-summary -->\n")


def test_targets_are_judged_on_a_full_run_and_extrapolated_below_a_million():
    registered = {
        "n": 300_000,
        "registered": {"passivated": 299_000, "rss_mb": 400.0, "rss_before_mb": 50.0, "bytes_per_registered": 1300.0},
        "open_loop": {"admission": {"p99_ms": 4.0}, "admitted": 10, "messages": 10, "rate_per_s": 200.0},
        "reactivation": {"cpu_us_per_agent": 500.0},
    }
    steady = {"n": 100_000, "params": {"fraction": 0.01, "seconds": 600.0},
              "verdict": {"growth": 0.02, "flat": True, "kept_up": False, "why": "flat: ...; it did not keep up"}}
    rss, p99, react, flat = targets("full", registered, steady)
    assert rss["passed"] is True and "extrapolated to N = 1,000,000: 1.26 GB" in rss["note"]
    assert p99["passed"] is False  # 4 ms, but not at N = 1,000,000
    assert react["passed"] is None
    assert flat["passed"] is False and flat["note"] == "flat: ...; it did not keep up"
    assert [t["passed"] for t in targets("quick", registered, steady)] == [None] * 4


def test_the_committed_lifecycle_figures_are_generated_from_the_committed_json():
    from pathlib import Path

    from loopdock.benchmarks import _tables

    root = Path(__file__).resolve().parents[2]
    results = json.loads((root / "benchmarks/results/bench-lifecycle-full.json").read_text())
    assert results["mode"] == "full" and _tables.is_lifecycle(results)
    assert [t["passed"] is not None for t in results["targets"]] == [True, True, False, True]  # all but CPU judged
    generated = {"lifecycle": _tables.lifecycle_table(results),
                 "lifecycle-summary": _tables.lifecycle_summary(results)}
    for doc, names in _tables.LIFECYCLE_DOCS.items():
        text = (root / doc).read_text()
        for name in names:
            assert f"<!-- bench:{name} -->\n{generated[name]}\n<!-- /bench:{name} -->" in text, (doc, name)
    # docs/lifecycle.md no longer calls the million-agent benchmarks a later phase.
    assert "1,000,000-agent benchmark" not in (root / "docs/lifecycle.md").read_text()
