"""Per-provider admission: the configured concurrency holds, and a provider that pushes
back (retried calls) gets fewer rollouts at once, after a cool-down, until they succeed."""

from __future__ import annotations

import io

import trio

from loopdock import Runtime
from loopdock.experiment import parse_experiment, run_in_runtime
from loopdock.experiment._gate import FIRST_COOL_DOWN, ProviderGate
from loopdock.experiment._progress import ProgressDisplay
from loopdock.experiment._runner import Progress
from loopdock.runtime.models import RetryNotice, ScriptedAdapter


async def test_a_throttled_gate_halves_its_limit_waits_and_grows_back(autojump_clock):
    gate = ProviderGate(8)
    gate.throttled()
    assert gate.limit == 4
    entered = trio.current_time()
    async with gate.slot():
        assert trio.current_time() - entered == FIRST_COOL_DOWN
    gate.throttled()
    gate.throttled()
    assert gate.limit == 1
    entered = trio.current_time()
    async with gate.slot():
        # The cool-down doubled with each sign of trouble: 2 then 4 seconds from the last.
        assert trio.current_time() - entered == 4 * FIRST_COOL_DOWN
    for _ in range(10):
        gate.succeeded()
    assert gate.limit == 8 and gate.throttles == 3


async def test_rollouts_of_a_provider_never_exceed_its_concurrency(tmp_path):
    # On trio's real clock: rollouts set up in worker threads (their directories, the
    # store), and a virtual clock would leap ahead while they do.
    running = peak = 0
    full = trio.Event()  # the first time three calls are in flight at once

    async def respond(request):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            full.set()
        # Held until the gate let three in (a gate letting in fewer fails the run's
        # deadline; one letting in more shows in the peak): the peak does not depend on
        # how fast the rollouts set up.
        await full.wait()
        running -= 1
        return "pong: x"

    experiment = parse_experiment(
        {"tasks": [{"id": "t", "input": "x", "target": "x"}], "scorer": "includes", "models": ["slow/s", "ping/ping-1"],
         "loops": ["standard"], "repeats": 12, "concurrency": {"slow": 3}},
        base=tmp_path, default_name="limited",
    )  # fmt: skip
    with trio.fail_after(60):
        async with Runtime.open(tmp_path / "home") as rt:
            summary = await run_in_runtime(rt, experiment, adapters={"slow": ScriptedAdapter(respond)})
    assert summary.scored == 24 and peak == 3


async def test_a_retried_model_call_throttles_its_provider(tmp_path, autojump_clock):
    async def respond(request):
        # What the DeepSeek adapter reports when it retries a 429 itself.
        await request.on_retry(RetryNotice(attempt=1, delay=0.5, error="HTTP 429"))
        return "pong: x"

    experiment = parse_experiment(
        {"tasks": [{"id": "t", "input": "x", "target": "x"}], "scorer": "includes", "models": ["busy/b", "ping/ping-1"],
         "loops": ["standard"], "repeats": 2, "concurrency": {"busy": 4}},
        base=tmp_path, default_name="busy",
    )  # fmt: skip
    async with Runtime.open(tmp_path / "home") as rt:
        summary = await run_in_runtime(rt, experiment, adapters={"busy": ScriptedAdapter(respond)})
    assert summary.scored == 4 and summary.throttles == {"busy": 2}


def test_the_progress_display_draws_bars_on_a_terminal_and_lines_elsewhere():
    progress = Progress("finished", total=4, done=1, failed=0, running=2, spent=0.0,
                        cells=(("ping/ping-1 x standard", 1, 2), ("ping/ping-1 x minimal-first", 0, 2)))  # fmt: skip
    out = io.StringIO()
    display = ProgressDisplay(out, tty=True, currency="USD")
    display(Progress("planned", total=4, done=0, failed=0, running=0, spent=0.0, note="4 to run, 0 already scored"))
    display(progress)
    display(progress)
    lines = out.getvalue().split("\n")
    assert lines[0] == "experiment: 4 rollouts, 4 to run, 0 already scored"
    assert lines[1].startswith("\x1b[2K[######..................] 1/4 scored, 0 failed, 2 running, spent 0 USD")
    assert lines[2] == "\x1b[2K  ping/ping-1 x standard       [############............] 1/2"
    # The second draw moves back over the three lines of the first.
    assert lines[4].startswith("\x1b[3F\x1b[2K[######")
