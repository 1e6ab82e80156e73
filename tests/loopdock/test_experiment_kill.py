"""A run killed with SIGKILL mid-way resumes: what was scored stays scored (and is not
run again), what was in flight or not started runs as a new attempt.

The run is a real ``loopdock experiment run`` process. Its model (``stand_models.py``,
written beside the experiment) answers the fast samples at once and, in the first run,
holds the slow ones forever after saying so on stderr; the test kills the process once
it has seen every fast sample scored and every slow one held. Each model call is also
appended to a file, to count the calls of the second run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio
from terminal import ctrl_c_as_at_a_terminal

from loopdock.experiment._history import read_run
from loopdock.runtime._store import SessionStore

STAND_MODELS = '''
import os
import sys

import trio

from loopdock.runtime.models import Finish, TextDelta, Usage


class Stand:
    async def stream(self, request):
        text = request.messages[-1].text
        with open(os.environ["STAND_CALLS"], "a") as calls:
            calls.write(text + "\\n")
        if text.startswith("slow") and os.environ.get("STAND_BLOCK") == "1":
            print(f"stand: holding {text}", file=sys.stderr, flush=True)
            await trio.sleep_forever()
        yield TextDelta(f"pong: {text}")
        yield Usage(10, 2)
        yield Finish("stop")


def make():
    return Stand()
'''

EXPERIMENT = """
name: killed
tasks:
  - id: t
    samples:
      - {id: f1, input: fast one, target: fast one}
      - {id: f2, input: fast two, target: fast two}
      - {id: f3, input: fast three, target: fast three}
      - {id: s1, input: slow one, target: slow one}
      - {id: s2, input: slow two, target: slow two}
scorer: includes
models: [{provider: stand, model: s1, adapter: "stand_models:make"}]
loops: [standard]
concurrency: 10
"""

RUN = "import sys; from loopdock._cli import main; sys.exit(main())"


def _command(experiment: Path, home: Path, *extra: str) -> list[str]:
    return [sys.executable, "-P", "-c", RUN, "experiment", "run", str(experiment), "--home", str(home), *extra]


def _state(home: Path):
    with SessionStore.open(home / "sessions.db") as store:
        history = read_run(store, "killed")
        seqs = {r.session_id: store.last_seq(r.session_id) for r in history.results}
    return history, seqs


async def test_a_run_killed_mid_way_resumes_without_repeating_what_was_scored(tmp_path):
    (tmp_path / "stand_models.py").write_text(STAND_MODELS)
    experiment = tmp_path / "killed.yml"
    experiment.write_text(EXPERIMENT)
    home = tmp_path / "home"
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "STAND_CALLS": str(calls), "STAND_BLOCK": "1"}
    with trio.fail_after(120):
        process = await trio.lowlevel.open_process(
            _command(experiment, home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path
        )
        assert process.stderr is not None
        scored, held, buffer = 0, 0, b""
        try:
            while scored < 3 or held < 2:
                chunk = await process.stderr.receive_some()
                assert chunk, f"the run ended early: {buffer.decode(errors='replace')}"
                buffer += chunk
                lines = buffer.decode(errors="replace").splitlines()
                scored = sum(1 for line in lines if "scored 1: task t sample f" in line)
                held = sum(1 for line in lines if line.startswith("stand: holding slow"))
        finally:
            process.send_signal(signal.SIGKILL)
            await process.wait()
    assert process.returncode == -signal.SIGKILL

    history, seqs_before = _state(home)
    latest = history.latest()
    assert sorted(r.sample for r in latest.values() if r.done) == ["f1", "f2", "f3"]
    # The held rollouts have no score: whatever of them reached the disk is unfinished.
    assert all(r.status == "incomplete" for r in latest.values() if r.sample.startswith("s"))
    attempts_before = dict(history.attempts)
    calls.write_text("")

    env["STAND_BLOCK"] = "0"
    with trio.fail_after(120):
        again = await trio.run_process(
            _command(experiment, home, "--resume"), capture_stdout=True, capture_stderr=True, env=env, cwd=tmp_path,
            check=False,
        )  # fmt: skip
    assert again.returncode == 0, again.stderr.decode()
    assert "5 rollouts, 3 scored before, 2 scored now, 0 failed" in again.stdout.decode()
    # Zero model calls for the scored rollouts; one for each rollout that was in flight.
    assert sorted(calls.read_text().splitlines()) == ["slow one", "slow two"]
    history, seqs_after = _state(home)
    for session_id, seq in seqs_before.items():
        assert seqs_after[session_id] == seq, session_id  # no scored session was touched
    latest = history.latest()
    assert all(r.done for r in latest.values()) and len(latest) == 5
    for result in latest.values():
        if result.sample.startswith("s"):
            assert result.attempt == attempts_before.get(result.key, 0) + 1


async def test_ctrl_c_ends_with_one_line_naming_the_resume_command_and_exit_130(tmp_path):
    (tmp_path / "stand_models.py").write_text(STAND_MODELS)
    experiment = tmp_path / "killed.yml"
    experiment.write_text(EXPERIMENT)
    home = tmp_path / "home"
    env = {**os.environ, "STAND_CALLS": str(tmp_path / "calls.txt"), "STAND_BLOCK": "1"}
    with trio.fail_after(120):
        process = await trio.lowlevel.open_process(
            _command(experiment, home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
            preexec_fn=ctrl_c_as_at_a_terminal,
        )
        assert process.stderr is not None
        buffer = b""
        try:
            while buffer.count(b"stand: holding slow") < 2 or buffer.count(b"scored 1: task t sample f") < 3:
                chunk = await process.stderr.receive_some()
                assert chunk, f"the run ended early: {buffer.decode(errors='replace')}"
                buffer += chunk
            before = len(buffer)
            process.send_signal(signal.SIGINT)  # what Ctrl-C sends
            while chunk := await process.stderr.receive_some():
                buffer += chunk
        finally:
            if process.returncode is None:
                process.kill()
        await process.wait()
    after = buffer[before:].decode()
    assert process.returncode == 130, after
    assert after.splitlines() == [
        f"interrupted: 3/5 rollouts scored; go on with: loopdock experiment run {experiment} --resume --home {home}"
    ]
    # The held rollouts ended without a score: the resume the line names runs them again.
    history, _ = _state(home)
    assert sorted(r.sample for r in history.latest().values() if not r.done) == ["s1", "s2"]
