"""``loopdock bench --cluster --quick``: sanity of the figures, never timings."""

from __future__ import annotations

import io
import json
import os

import pytest

from loopdock.benchmarks import _tables
from loopdock.benchmarks._cluster import run_cluster, tcp_counters
from loopdock.benchmarks._common import process_cpu_seconds


def test_the_quick_cluster_benchmark_reports_consistent_figures(tmp_path):
    out = io.StringIO()
    result = run_cluster("quick", tmp_path, out)
    assert json.loads((tmp_path / "bench-cluster-quick.json").read_text()) == result
    f = result["figures"]
    assert set(result["runs"]) == {"embedded", "cluster-1", "cluster-2", "cluster-4"}
    for runs in result["runs"].values():
        assert [run["turns_per_s"] > 0 for run in runs] == [True]
    assert result["failover"]["lost_turns"] == result["failover"]["doubled_turns"] == 0

    for workers in (1, 2, 4):
        (run,) = result["runs"][f"cluster-{workers}"]
        cpu = run["cpu_us_per_turn"]
        assert len(run["cpu_us_per_turn_each_worker"]) == workers
        assert cpu["workers"] == pytest.approx(sum(run["cpu_us_per_turn_each_worker"]))
        assert cpu["all"] == pytest.approx(cpu["workers"] + cpu["client"] + cpu["redis"])
        assert all(part >= 0 for part in (cpu["workers"], cpu["client"], cpu["redis"]))
        # Redis saw every turn's messages and log entries: a followup is one XADD by the
        # client, and each turn appends its events (more than one) inside commit scripts.
        commands = run["redis"]["commands"]
        assert commands["xadd"]["calls"] > 1
        assert commands["evalsha"]["calls"] > 0
        assert all(c["calls"] > 0 and c["usec"] >= 0 for c in commands.values())
        stats = run["redis"]["stats"]
        assert stats["total_net_input_bytes"] > 0 and stats["total_net_output_bytes"] > 0
        assert stats["total_commands_processed"] > 0 and stats["total_reads_processed"] > 0
        # The client and each worker talked to Redis during the turns, in both directions.
        client = run["wire"]["client"]
        assert client["requests"] > 0 and client["bytes_out"] > 0 and client["bytes_in"] > 0
        assert len(run["wire"]["workers"]) == workers
        assert all(w["requests"] > 0 and w["bytes_in"] > 0 for w in run["wire"]["workers"])
        # What every process sent is what Redis received (a turn's worth, per turn).
        sent = client["bytes_out"] + sum(w["bytes_out"] for w in run["wire"]["workers"])
        assert sent == pytest.approx(stats["total_net_input_bytes"], rel=0.2)

    c1 = f["clusters"]["1"]
    assert c1["cpu_us_per_turn"]["all"]["median"] > 0
    embedded = f["embedded_cpu_us_per_turn"]["median"]
    assert c1["all_vs_embedded"]["median"] == pytest.approx(c1["cpu_us_per_turn"]["all"]["median"] / embedded)
    assert c1["workers_vs_one"]["median"] == pytest.approx(1.0)
    for w in ("2", "4"):
        c = f["clusters"][w]
        assert c["workers_vs_one"]["median"] == pytest.approx(
            c["cpu_us_per_turn"]["workers"]["median"] / c1["cpu_us_per_turn"]["workers"]["median"])
    assert isinstance(f["all_vs_embedded_met"], bool) and isinstance(f["workers_vs_one_met"], bool)

    p = f["projection"]
    eight, many = p["cores"]["8"], p["cores"]["32"]
    assert eight["workers"] == 7 and many["workers"] == 31
    # The quick run's few turns may leave redis-server's CPU below the clock's tick.
    ceiling = p["redis_ceiling_turns_per_s"]
    if p["redis_us_per_turn"] > 0:
        assert ceiling == pytest.approx(1e6 / p["redis_us_per_turn"])
    else:
        assert ceiling is None
    for c in (eight, many):
        assert c["workers_bound"] == pytest.approx((c["workers"]) * 1e6 / p["worker_us_per_turn"])
        assert c["turns_per_s"] == pytest.approx(min(x for x in (c["workers_bound"], ceiling) if x is not None))
    assert many["turns_per_s"] >= eight["turns_per_s"]
    assert p["assumptions"]

    text = out.getvalue()
    assert "target 2x" in text and "target 1.1x" in text and "projected on 32 cores" in text
    table = _tables.cluster_table(result)
    assert "<= 2x embedded" in table and "each <= 1.1x" in table and "1.7x" not in table
    assert "| xadd |" in table and "Projected throughput" in table


def test_tcp_counters_see_a_connection_and_its_bytes():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as conn:
            peer, _ = server.accept()
            with peer:
                conn.sendall(b"PING\r\n")
                assert peer.recv(10) == b"PING\r\n"
                peer.sendall(b"+PONG\r\n")
                assert conn.recv(10) == b"+PONG\r\n"
                counters = tcp_counters(port)
    if counters is None:
        pytest.skip("no ss on this machine")
    mine = [c for (pid, _), c in counters.items() if pid == os.getpid()]
    assert mine == [{"bytes_acked": 7, "bytes_received": 7, "data_segs_out": 1, "data_segs_in": 1}] \
        or (len(mine) == 1 and mine[0]["data_segs_out"] == 1 and mine[0]["bytes_received"] == 7)


def test_cpu_time_of_a_process_that_is_gone_is_unknown():
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-P", "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert process_cpu_seconds(int(child.stdout)) is None
    mine = process_cpu_seconds(os.getpid())
    assert mine is not None and mine > 0
