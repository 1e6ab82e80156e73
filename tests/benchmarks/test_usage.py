"""The memory-as-used benchmark at a tiny size: the user's sequence runs through the public
API, every mark is measured, the events stay readable, and the live memory it traces per
agent is bounded (RSS at this size is noise; the traced figure is not)."""

import math

import pytest

from loopdock.benchmarks._usage import main, run_usage


async def test_usage_measures_each_mark_and_keeps_events_readable():
    labels: list[str] = []
    result = await run_usage({"n": 12, "marks": [2, 5], "trace": True}, lambda fraction, label: labels.append(label))
    assert result["n"] == 12
    assert [row["turns"] for row in result["marks"]] == [2, 5]
    assert result["last_agent_turns_read"] == 5  # read back whole from the store
    assert labels[-1] == "usage: 5/5 turns of 12 agents"
    for row in result["marks"]:
        assert math.isfinite(row["kb_per_agent"]) and row["cpu_us_per_turn"] > 0
        # Held per agent (agent, session, a 10-message transcript kept warm): tens of KB, not hundreds.
        assert 0 < row["traced_kb_per_agent"] < 100
        assert len(row["top"]) == 10 and all(":" in top["site"] for top in row["top"])
    assert result["marks"][-1]["warm_agents"] == 12  # the default budget keeps them all warm


def test_usage_command_writes_its_figures(tmp_path, capsys):
    out = tmp_path / "usage.json"
    assert main(["--n", "3", "--marks", "1,2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert '"turns": 2' in printed and out.read_text().strip() == printed.strip()


@pytest.mark.parametrize(("args", "says"), [
    (["--marks", "one,two"], "marks are turn counts separated by commas"),
    (["--marks", "10,0"], "marks must be positive"),
    (["--n", "0"], "a positive number of agents"),
])
def test_usage_command_refuses_bad_input_with_a_usage_error(args, says, capsys):
    with pytest.raises(SystemExit) as exit:
        main(args)
    assert exit.value.code == 2 and says in capsys.readouterr().err


def test_the_usage_phase_measures_each_size_in_its_own_process_and_makes_the_table(tmp_path):
    import json

    from loopdock.benchmarks._tables import is_usage, usage_summary, usage_table, write_docs
    from loopdock.benchmarks._usage import SIZES, run_usage_phase

    results = run_usage_phase("quick", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "bench-usage-quick.json").read_text()) == results
    cfg = SIZES["quick"]
    assert [run["n"] for run in results["runs"]] == cfg["ns"]
    for run in results["runs"]:
        assert [mark["turns"] for mark in run["marks"]] == cfg["marks"]
        assert run["last_agent_turns_read"] == cfg["marks"][-1]
    traced = results["traced"]
    assert traced["n"] == cfg["traced_n"] and len(traced["marks"][-1]["top"]) == 10
    assert is_usage(results)

    table = usage_table(results)
    last = results["runs"][-1]["marks"][-1]
    verdict = "met" if last["kb_per_agent"] <= results["target_kb_per_agent"] else "**missed**"
    # One row per size and mark; the verdict only on the last mark's rows.
    assert f"| {cfg['ns'][-1]:,} | {cfg['marks'][-1]} | " in table and verdict in table
    assert table.count("| met |") + table.count("| **missed** |") == len(cfg["ns"])
    assert traced["marks"][-1]["top"][0]["site"] in table

    summary = usage_summary(results)
    kb = f"{last['kb_per_agent']:.1f} KB per agent with {cfg['ns'][-1]:,} agents"
    assert kb in summary and f"after {cfg['marks'][-1]} turns each" in summary

    checkout = tmp_path / "checkout"
    profile, readme = checkout / "benchmarks" / "PROFILE.md", checkout / "README.md"
    profile.parent.mkdir(parents=True)
    profile.write_text("before\n<!-- bench:usage -->\nstale\n<!-- /bench:usage -->\nafter\n")
    readme.write_text("<!-- bench:usage-summary -->\n<!-- /bench:usage-summary -->\n")
    json_path = tmp_path / "out" / "bench-usage-quick.json"
    assert write_docs(json_path, checkout) == [readme, profile]
    assert profile.read_text() == f"before\n<!-- bench:usage -->\n{table}\n<!-- /bench:usage -->\nafter\n"
    assert readme.read_text() == f"<!-- bench:usage-summary -->\n{summary}\n<!-- /bench:usage-summary -->\n"
