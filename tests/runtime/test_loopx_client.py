"""The LoopX client against a fault-injecting stand-in executable.

The stand-in is only for faults the real CLI cannot be made to produce on demand
(timeouts, non-JSON output, N transport failures, contradicting exit codes, malformed
schemas); ``test_loopx_cli.py`` drives the real loopx end to end.

No test waits for real time to pass: a hanging stand-in says when it (and its own child)
runs through a named pipe, the test then moves a mock clock past the client's timeout or
cancels the call itself, and waits for the killed processes on pidfds. The retry
backoff's schedule is checked on a virtual clock; the stand-in's retries run back to back."""

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from loopdock.runtime import _process as process
from loopdock.runtime._process import Completed
from loopdock.runtime.loopx import (
    ATTEMPT_BACKOFF,
    HOST_SURFACE,
    MAX_ATTEMPTS,
    LifecycleResult,
    LoopxClient,
    LoopxFailure,
    LoopxOk,
    LoopxRequestError,
    MalformedOutput,
    Recovery,
    SchedulerHint,
    ShouldRun,
    TaskBody,
    ThreadBinding,
    TodoProgress,
    TransportFailure,
    check_goal_id,
)
from loopdock.runtime.loopx import _client as loopx_client
from loopdock.runtime.loopx._client import loopx_env

# One Python script; what each attempt does comes from actions.json next to it (the last
# action repeats). Every attempt logs its argv, cwd, env and start time to attempts.jsonl.
# A "sleep" attempt starts a child of its own, writes both pids, and then tells the test
# through the named pipe ``started`` that both run.
STANDIN = r'''
import json, os, sys, time
from pathlib import Path

here = Path(__file__).resolve().parent
start = time.time()
with open(here / "attempts.jsonl", "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "time": start,
                          "pid": os.getpid(), "ping": os.environ.get("LOOPX_USAGE_PING"),
                          "env": sorted(os.environ)}) + "\n")
number = sum(1 for _ in open(here / "attempts.jsonl"))
actions = json.loads((here / "actions.json").read_text())
action = actions[min(number, len(actions)) - 1]
if "daemon" in action:  # like LoopX's effect-runtime server: its own session and stdio
    import subprocess
    server = subprocess.Popen([sys.executable, "-P", "-c", "import time; time.sleep(120)"], start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (here / f"daemon-{number}").write_text(str(server.pid))
if "flood" in action:
    stream = getattr(sys, action["flood"])
    while True:
        stream.write("x" * 65536)
if "sleep" in action:
    import subprocess  # only here: it costs more to import than the rest of the script
    child = subprocess.Popen([sys.executable, "-P", "-c", "import time; time.sleep(120)"])
    (here / f"pids-{number}").write_text(f"{os.getpid()} {child.pid}")
    with open(here / "started", "w") as fifo:
        fifo.write(f"{number}\n")
    time.sleep(action["sleep"])
if "stderr" in action:
    sys.stderr.write(action["stderr"])
if "json" in action:
    sys.stdout.write(json.dumps(action["json"]))
if "stdout" in action:
    sys.stdout.write(action["stdout"])
sys.exit(action.get("code", 0))
'''


class StandIn:
    def __init__(self, root: Path):
        self.root = root
        self.script = root / "standin.py"
        self.script.write_text(STANDIN)
        self.project = root / "project"
        self.project.mkdir()
        # The read end stays open (non-blocking), so the stand-in's open() never blocks,
        # and so does an extra write end, so the reader never sees EOF in between.
        fifo = root / "started"
        os.mkfifo(fifo)
        self._read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self._keep_fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        self._lines = b""

    def close(self) -> None:
        os.close(self._keep_fd)
        os.close(self._read_fd)

    async def started(self) -> list[int]:
        """Wait until a "sleep" attempt runs (its child too); its pids, the child's last."""
        while b"\n" not in self._lines:
            await trio.lowlevel.wait_readable(self._read_fd)
            self._lines += os.read(self._read_fd, 4096)
        line, self._lines = self._lines.split(b"\n", 1)
        return self.pids(int(line))

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-IS", str(self.script)]  # stdlib only: no site to load

    def plan(self, *actions: dict) -> None:
        (self.root / "actions.json").write_text(json.dumps(list(actions)))
        (self.root / "attempts.jsonl").unlink(missing_ok=True)

    def attempts(self) -> list[dict]:
        path = self.root / "attempts.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def pids(self, number: int) -> list[int]:
        return [int(p) for p in (self.root / f"pids-{number}").read_text().split()]

    def client(self, **kwargs) -> LoopxClient:
        kwargs.setdefault("timeout", 20)
        return LoopxClient(self.command, project=self.project, **kwargs)


@pytest.fixture
def standin(tmp_path):
    standin = StandIn(tmp_path)
    yield standin
    standin.close()


@pytest.fixture
def immediate_retries(monkeypatch):
    """The stand-in's retries back to back (the backoff's schedule has a test of its own)."""
    monkeypatch.setattr(loopx_client, "ATTEMPT_BACKOFF", (0.0,) * len(ATTEMPT_BACKOFF))


@pytest.fixture
def jump_clock():
    """Real time, except that the test moves it past the client's timeout when it chooses."""
    return trio.testing.MockClock(rate=1.0)


# The client's timeout in the hanging tests: never reached in real time, the clock jumps.
HANG_TIMEOUT = 20.0
GUARD = 120.0  # a fail_after for the whole test; the jump takes HANG_TIMEOUT of it


def gone(pid: int) -> bool:
    """True when the process no longer runs (reaped, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


class Exits:
    """pidfds of running processes, opened while they run (so a pid cannot be reused
    under us); ``wait()`` returns once every one of them has exited."""

    def __init__(self, pids):
        self.fds = [os.pidfd_open(pid) for pid in pids]

    async def wait(self) -> None:
        try:
            for fd in self.fds:
                await trio.lowlevel.wait_readable(fd)
        finally:
            for fd in self.fds:
                os.close(fd)


def safe(reason: str, standin: StandIn) -> bool:
    return "/" not in reason and str(standin.root) not in reason and "SECRET" not in reason


OK = {"json": {"ok": True, "hello": "world"}}
# What every should-run answer of loopx 2.1.1 names: the goal and the agent it is about.
FOR_G1_A1 = {"goal_id": "g1", "agent_identity": {"schema_version": "peer_agent_identity_v1", "agent_id": "a1"}}
REFUSED = {"json": {"ok": False, "error_kind": "thread_agent_binding_invalid_request", "error": "x"}, "code": 1}
CRASH = {"stderr": "Traceback: SECRET /home/user/.loopx failed", "code": 2}


# -- argv and the raw result classes ---------------------------------------------------------


async def test_global_options_come_first_and_args_pass_literally(standin, tmp_path):
    standin.plan(OK)
    client = standin.client(runtime_root=tmp_path / "rt", env={**os.environ, "LOOPX_USAGE_PING": "0"})
    with trio.fail_after(30):
        result = await client.run("todo", "add", "--text", "$(touch pwned); echo `x` | cat")
    assert result == LoopxOk({"ok": True, "hello": "world"})
    [attempt] = standin.attempts()
    assert attempt["argv"] == [
        "--registry", ".loopx/registry.json",
        "--runtime-root", str(tmp_path / "rt"),
        "--format", "json",
        "todo", "add", "--text", "$(touch pwned); echo `x` | cat",
    ]
    assert Path(attempt["cwd"]) == standin.project.resolve()
    assert attempt["ping"] == "0"
    assert not (standin.project / "pwned").exists()  # no shell


async def test_without_runtime_root_there_is_no_runtime_root_option(standin):
    standin.plan(OK)
    with trio.fail_after(30):
        await standin.client().run("status")
    assert standin.attempts()[0]["argv"] == ["--registry", ".loopx/registry.json", "--format", "json", "status"]


async def test_the_usage_ping_is_always_off(standin, monkeypatch):
    monkeypatch.setenv("LOOPX_USAGE_PING", "1")
    standin.plan(OK)
    with trio.fail_after(30):
        await standin.client().run("status")  # inherited environment
        await standin.client(env={**os.environ}).run("status")  # explicit environment
    assert [a["ping"] for a in standin.attempts()] == ["0", "0"]


async def test_the_child_sees_no_secret_only_what_loopx_needs(standin, monkeypatch):
    for name in ("DEEPSEEK_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"):
        monkeypatch.setenv(name, "sk-secret")
    monkeypatch.setenv("LOOPX_RUNTIME_ROOT", "/somewhere")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/xdg")
    standin.plan(OK)
    with trio.fail_after(30):
        await standin.client().run("status")  # inherited environment
        await standin.client(env={**os.environ, "LOOPX_EXTRA": "1"}).run("status")  # explicit
    inherited, explicit = (set(a["env"]) for a in standin.attempts())
    for names in (inherited, explicit):
        assert not {n for n in names if "KEY" in n or "TOKEN" in n or "SECRET" in n}, names
        assert {"PATH", "HOME", "LOOPX_USAGE_PING", "LOOPX_RUNTIME_ROOT", "XDG_CONFIG_HOME"} <= names
    assert "LOOPX_EXTRA" in explicit
    # Nothing else of this process's environment came along (Python may add LC_CTYPE).
    assert inherited - {"LC_CTYPE"} <= set(loopx_env(os.environ))


async def test_typed_refusal_is_authoritative_and_never_retried(standin):
    standin.plan(REFUSED, OK)
    with trio.fail_after(30):
        result = await standin.client().run("resolve-agent-thread", retry=True)
    assert isinstance(result, LoopxFailure)
    assert result.error_kind == "thread_agent_binding_invalid_request"
    assert result.reason == "loopx refused: thread_agent_binding_invalid_request"
    assert len(standin.attempts()) == 1


async def test_error_code_is_the_kind_when_there_is_no_error_kind_and_junk_is_dropped(standin):
    standin.plan({"json": {"ok": False, "error_code": "quota_agent_not_registered"}, "code": 1})
    with trio.fail_after(30):
        result = await standin.client().run("quota", "should-run")
    assert isinstance(result, LoopxFailure) and result.error_kind == "quota_agent_not_registered"
    standin.plan({"json": {"ok": False, "error_kind": "/home/x has spaces"}, "code": 1})
    with trio.fail_after(30):
        result = await standin.client().run("quota", "should-run")
    assert isinstance(result, LoopxFailure) and result.error_kind is None
    assert result.reason == "loopx refused"


@pytest.mark.parametrize(
    "action, kind",
    [
        ({"stdout": "SECRET /home/user: not json at all"}, "not-json"),
        ({"stdout": "[1, 2]"}, "not-json"),
        ({"json": {"ok": "yes"}}, "ok-mismatch"),
        ({"json": {"ok": True}, "code": 1}, "ok-mismatch"),
        ({"json": {"ok": False, "error_kind": "x"}}, "ok-mismatch"),
    ],
)
async def test_malformed_output_is_never_retried(standin, action, kind):
    standin.plan(action, OK)
    with trio.fail_after(30):
        result = await standin.client().run("status", retry=True)
    assert isinstance(result, MalformedOutput) and result.kind == kind
    assert safe(result.reason, standin)
    assert len(standin.attempts()) == 1


async def test_nonzero_exit_without_json_is_a_transport_failure_with_a_safe_reason(standin):
    standin.plan(CRASH)
    with trio.fail_after(30):
        result = await standin.client().run("status")
    assert result == TransportFailure("exit code 2 without JSON", "exit")
    assert safe(result.reason, standin)
    assert len(standin.attempts()) == 1  # retry=False by default


@pytest.mark.parametrize("stream, limit", [("stdout", 4 * 1024 * 1024), ("stderr", 1024 * 1024)])
async def test_endless_output_is_too_large_stopped_and_never_retried(standin, stream, limit):
    standin.plan({"flood": stream}, OK)
    with trio.fail_after(30):  # the call's own timeout (20 s) is not what ends it
        result = await standin.client().run("status", retry=True)
    assert result == MalformedOutput(f"{stream} passed {limit} bytes; the command was stopped", "too-large")
    assert safe(result.reason, standin)
    [attempt] = standin.attempts()
    assert gone(attempt["pid"])


async def test_spawn_failure_is_a_transport_failure_without_the_path(tmp_path, immediate_retries):
    missing = tmp_path / "no" / "such" / "loopx"
    client = LoopxClient([str(missing)], project=tmp_path, timeout=5)
    with trio.fail_after(30):
        result = await client.run("status", retry=True)
    assert result == TransportFailure("could not start the loopx command", "spawn")


# -- Retries ---------------------------------------------------------------------------------


async def test_transport_failures_are_retried_after_the_backoff_and_never_after_the_last(
    standin, monkeypatch, autojump_clock
):
    """The schedule, on a virtual clock: each attempt runs a (virtual) second, then
    ATTEMPT_BACKOFF[0], the second attempt, ATTEMPT_BACKOFF[1], the third; nothing after."""
    assert ATTEMPT_BACKOFF == (0.2, 0.75) and MAX_ATTEMPTS == 3
    outcomes = iter([(2, b""), (2, b""), (0, b'{"ok": true}')])
    started: list[float] = []

    async def run_child(argv, *, cwd, env, **limits):
        started.append(trio.current_time())
        await trio.sleep(1.0)
        code, stdout = next(outcomes)
        return Completed(code, stdout, b"")

    monkeypatch.setattr(process, "run_child", run_child)
    t0 = trio.current_time()
    with trio.fail_after(30):
        result = await standin.client().run("heartbeat-prompt", "--thin", retry=True)
    assert result == LoopxOk({"ok": True})
    assert [t - t0 for t in started] == pytest.approx([0.0, 1.2, 2.95])
    assert trio.current_time() - t0 == pytest.approx(3.95)

    # Three failures: the third is the answer, returned at once (no backoff after it).
    outcomes = iter([(2, b"")] * 4)
    started.clear()
    t0 = trio.current_time()
    with trio.fail_after(30):
        result = await standin.client().run("status", retry=True)
    assert result == TransportFailure("exit code 2 without JSON", "exit")
    assert [t - t0 for t in started] == pytest.approx([0.0, 1.2, 2.95])
    assert trio.current_time() - t0 == pytest.approx(3.95)
    assert standin.attempts() == []  # nothing ran for real


async def test_two_transport_failures_then_success_takes_three_attempts(standin, immediate_retries):
    standin.plan(CRASH, CRASH, OK)
    with trio.fail_after(30):
        result = await standin.client().run("heartbeat-prompt", "--thin", retry=True)
    assert isinstance(result, LoopxOk)
    attempts = standin.attempts()
    assert len(attempts) == 3
    assert attempts[0]["argv"] == attempts[1]["argv"] == attempts[2]["argv"]


async def test_retries_stop_after_three_attempts_in_all(standin, immediate_retries):
    standin.plan(CRASH, CRASH, CRASH, OK)
    with trio.fail_after(30):
        result = await standin.client().run("status", retry=True)
    assert result == TransportFailure("exit code 2 without JSON", "exit")
    assert len(standin.attempts()) == 3


async def test_should_run_retries_with_the_same_turn_id(standin, immediate_retries):
    receipt = {
        "ok": True, "should_run": False, "decision": "skip", **FOR_G1_A1,
        "heartbeat_receipt": {"turn_instance_id": "turn-7", "status": "replayed"},
    }
    standin.plan(CRASH, {"json": receipt})
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-7")
    assert isinstance(result, ShouldRun) and result.receipt_status == "replayed"
    first, second = standin.attempts()
    assert first["argv"] == second["argv"]
    assert first["argv"][-2:] == ["--turn-instance-id", "turn-7"]


async def test_mutations_are_never_retried(standin, tmp_path, immediate_retries):
    standin.plan(CRASH, OK)
    with trio.fail_after(30):
        result = await standin.client().goal_lifecycle("g1", "stop", execute=True)
    assert isinstance(result, TransportFailure)
    assert len(standin.attempts()) == 1
    assert standin.attempts()[0]["argv"][-8:] == [
        "goal-lifecycle", "--goal-id", "g1", "--operation", "stop", "--actor-kind", "owner", "--execute"
    ]
    standin.plan(CRASH, OK)
    with trio.fail_after(30):
        result = await standin.client().workflow_skills(tmp_path / "skills", install=True)
    assert isinstance(result, TransportFailure)
    assert len(standin.attempts()) == 1
    # An inspection is read-only, so it is retried.
    standin.plan(CRASH, CRASH, CRASH)
    with trio.fail_after(30):
        await standin.client().workflow_skills(tmp_path / "skills", install=False)
    assert len(standin.attempts()) == 3


async def test_cli_bin_must_be_exactly_one_shell_word(standin, tmp_path):
    standin.plan(OK)
    quoted = "'/home/a b/.agents/runtime/dsh-loopx-plugin/bin/loopx'"
    with trio.fail_after(30):
        await standin.client().workflow_skills(tmp_path / "skills", install=False, cli_bin=quoted)
    argv = standin.attempts()[0]["argv"]
    assert argv[argv.index("--cli-bin") + 1] == quoted  # passed on as given, quotes and all
    for bad in ["/home/a b/loopx", "", "loopx; rm -rf x", "'unbalanced", "loopx\nnext"]:
        with pytest.raises(LoopxRequestError):
            await standin.client().workflow_skills(tmp_path / "skills", install=False, cli_bin=bad)
    assert len(standin.attempts()) == 1  # refused before any call


async def test_cli_argv_is_passed_as_shell_quoted_words(standin, tmp_path):
    # `python -m loopx.cli` is a CLI of three words: each stays one word in the skills.
    standin.plan(OK)
    command = ("/home/a b/bin/python3", "-m", "loopx.cli")
    with trio.fail_after(30):
        await standin.client().workflow_skills(tmp_path / "skills", install=False, cli_argv=command)
    argv = standin.attempts()[0]["argv"]
    assert argv[argv.index("--cli-bin") + 1] == "'/home/a b/bin/python3' -m loopx.cli"
    for bad in [(), ("",), ("python3", "-m\nloopx.cli"), "python3 -m loopx.cli"]:
        with pytest.raises(LoopxRequestError):
            await standin.client().workflow_skills(tmp_path / "skills", install=False, cli_argv=bad)
    with pytest.raises(LoopxRequestError):
        await standin.client().workflow_skills(tmp_path / "skills", install=False, cli_bin="loopx", cli_argv=command)
    assert len(standin.attempts()) == 1  # refused before any call


# -- Timeouts and cancellation ---------------------------------------------------------------


async def test_loopx_s_own_daemon_outlives_a_call_that_ends_by_itself(standin):
    # LoopX's effect-runtime server serves the next call; a stop (timeout, cancellation)
    # still takes it (tests/runtime/test_process.py, leave_on_exit).
    standin.plan({**OK, "daemon": True})
    with trio.fail_after(30):
        assert isinstance(await standin.client().run("status"), LoopxOk)
    daemon = int((standin.root / "daemon-1").read_text())
    try:
        assert not gone(daemon)
    finally:
        os.kill(daemon, signal.SIGKILL)  # this test started it


async def test_timeout_kills_the_child_and_its_children_and_waits(standin, jump_clock):
    standin.plan({"sleep": 120})
    client = standin.client(timeout=HANG_TIMEOUT)
    results = []
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(results, client.run("quota", "should-run")))
            child, grandchild = await standin.started()
            assert results == []  # still waiting for the hanging child
            jump_clock.jump(HANG_TIMEOUT)
        assert results == [TransportFailure(f"timed out after {HANG_TIMEOUT:g}s", "timeout")]
    # Both killed and reaped before the call returned: nothing to wait for.
    assert gone(child) and gone(grandchild)


async def test_a_timeout_is_retried_when_asked(standin, jump_clock, immediate_retries):
    standin.plan({"sleep": 120}, OK)
    client = standin.client(timeout=HANG_TIMEOUT)
    results = []
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(results, client.run("status", retry=True)))
            exits = Exits(await standin.started())
            jump_clock.jump(HANG_TIMEOUT)
        with trio.fail_after(10):
            await exits.wait()
    assert [type(r) for r in results] == [LoopxOk]
    assert len(standin.attempts()) == 2
    assert all(gone(pid) for pid in standin.pids(1))  # the first attempt's, before the second


async def test_caller_cancellation_kills_the_child_and_propagates(standin):
    standin.plan({"sleep": 120})
    client = standin.client(timeout=60)
    results = []
    with trio.fail_after(30):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _append(results, client.run("status", retry=True)))
                child, grandchild = await standin.started()
                scope.cancel()
        assert scope.cancelled_caught and results == []  # no result: the Cancelled propagated
        assert len(standin.attempts()) == 1  # and no retry
    assert gone(child) and gone(grandchild)  # killed and reaped before the Cancelled left


async def _append(results, call):
    results.append(await call)


# -- Typed commands: parsing and rejection ---------------------------------------------------


def heartbeat(body, *, turn="turn-1", schema="heartbeat_agent_input_v1", **extra):
    return {"json": {
        "schema_version": schema, "ok": True, "goal_id": "g1", "agent_id": "a1",
        "turn_instance_id": turn, "task_body": body, **extra,
    }}


BODY = "Advance g1.\n```sh\nLOOPX_TURN=turn-1\nloopx quota should-run --turn-instance-id \"${LOOPX_TURN:?}\"\n```\n"


async def test_heartbeat_prompt_accepts_both_schemas(standin):
    for schema in ("heartbeat_agent_input_v1", "loopx_heartbeat_prompt_v0"):
        standin.plan(heartbeat(BODY, schema=schema, thin=True))
        with trio.fail_after(30):
            result = await standin.client().heartbeat_prompt("g1", "a1", "turn-1")
        assert result == TaskBody(BODY, "turn-1", schema)
    assert standin.attempts()[0]["argv"][-10:] == [
        "heartbeat-prompt", "--thin", "--goal-id", "g1", "--agent-id", "a1",
        "--runtime-profile", "generic_cli", "--turn-instance-id", "turn-1",
    ]


@pytest.mark.parametrize(
    "action",
    [
        heartbeat("no marker at all"),
        heartbeat(BODY + "\nLOOPX_TURN=turn-1\n"),  # two markers
        heartbeat(BODY.replace("LOOPX_TURN=turn-1", "LOOPX_TURN=turn-2")),  # another turn
        heartbeat(BODY + "x" * 32_001),  # too long
        heartbeat(BODY, turn="turn-2"),  # answer for another turn
        heartbeat(BODY, schema="loopx_heartbeat_prompt_v9"),
        heartbeat(None),
    ],
)
async def test_heartbeat_prompt_rejects_bodies_that_break_the_contract(standin, action):
    standin.plan(action)
    with trio.fail_after(30):
        result = await standin.client().heartbeat_prompt("g1", "a1", "turn-1")
    assert isinstance(result, MalformedOutput) and result.kind == "schema"
    assert safe(result.reason, standin)
    assert len(standin.attempts()) == 1


async def test_should_run_parses_the_wait_and_the_settlement_identity(standin):
    identity = {"effect_id": "g1:a1:t9:turn-1", "goal_id": "g1", "agent_id": "a1",
                "todo_id": "t9", "turn_instance_id": "turn-1"}
    plan = {"schema_version": "quota_settlement_plan_v1", "ordered_steps": [{"kind": "validation"}]}
    standin.plan({"json": {
        "ok": True, "should_run": True, "decision": "run", **FOR_G1_A1,
        "heartbeat_receipt": {"turn_instance_id": "turn-1", "status": "committed", "settlement_identity": identity},
        "scheduler_hint": {"action": "run_now", "cold_path_detail": {"local_scheduler": {"recommended_interval_minutes": 3}},
                           "unchanged_poll": {"local_scheduler": "continue"}},
        "interaction_contract": {"cli_channel": {"settlement_plan": plan}},
    }})
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(result, ShouldRun)
    assert (result.should_run, result.decision, result.wait_minutes, result.scheduler_action) == (True, "run", 3.0, "run_now")
    assert (result.receipt_status, result.effect_id, result.todo_id) == ("committed", "g1:a1:t9:turn-1", "t9")
    assert result.settlement_plan == plan


async def test_should_run_admits_a_recovery_turn_that_owes_its_settlement_binding(standin):
    # What loopx 2.1.1 answers while an earlier admitted turn of the agent is unsettled.
    standin.plan({"json": {
        "ok": True, "should_run": True, "decision": "unsettled_host_turn_recovery", **FOR_G1_A1,
        "heartbeat_receipt": {"turn_instance_id": "turn-1", "status": "committed", "settlement_binding_owed": True},
    }})
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(result, ShouldRun)
    assert (result.should_run, result.settlement_owed, result.effect_id) == (True, True, None)


@pytest.mark.parametrize(
    "receipt",
    [
        None,
        {"turn_instance_id": "turn-2", "status": "committed"},
        {"turn_instance_id": "turn-1", "status": "exploded"},
        {"turn_instance_id": "turn-1", "status": "committed"},  # admitted without identity
        {"turn_instance_id": "turn-1", "status": "committed", "settlement_binding_owed": "yes"},
        {"turn_instance_id": "turn-1", "status": "committed", "settlement_identity": {
            "effect_id": "g1:a1:t:turn-2", "goal_id": "g1", "agent_id": "a1", "turn_instance_id": "turn-2"}},
    ],
)
async def test_should_run_rejects_receipts_for_anything_but_this_turn(standin, receipt):
    standin.plan({"json": {"ok": True, "should_run": True, "decision": "run", **FOR_G1_A1, "heartbeat_receipt": receipt}})
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(result, MalformedOutput)
    assert len(standin.attempts()) == 1


async def test_resolve_thread_statuses(standin):
    base = {"schema_version": "loopx_thread_agent_binding_resolution_v0", "host_surface": HOST_SURFACE, "thread_id": "s-1"}
    cases = [
        ({"json": {**base, "ok": True, "status": "missing", "goal_id": None, "agent_id": None, "matches": []}},
         ThreadBinding("missing")),
        ({"json": {**base, "ok": True, "status": "bound", "goal_id": "g", "agent_id": "a",
                   "matches": [{"goal_id": "g", "agent_id": "a"}]}},
         ThreadBinding("bound", "g", "a")),
        ({"json": {**base, "ok": False, "status": "ambiguous", "goal_id": None, "agent_id": None,
                   "error_kind": "thread_agent_binding_ambiguous",
                   "matches": [{"goal_id": "g", "agent_id": "a"}, {"goal_id": "h", "agent_id": "b"}]}, "code": 1},
         ThreadBinding("ambiguous", error_kind="thread_agent_binding_ambiguous")),
        ({"json": {**base, "ok": False, "status": "unavailable", "thread_id": None, "matches": [],
                   "error_kind": "thread_agent_binding_invalid_request"}, "code": 1},
         ThreadBinding("unavailable", error_kind="thread_agent_binding_invalid_request")),
        # A bound answer naming two matches, or another thread, is not trusted.
        ({"json": {**base, "ok": True, "status": "bound", "goal_id": "g", "agent_id": "a",
                   "matches": [{"goal_id": "g", "agent_id": "a"}, {"goal_id": "h", "agent_id": "b"}]}}, MalformedOutput),
        ({"json": {**base, "ok": True, "thread_id": "s-2", "status": "missing", "matches": []}}, MalformedOutput),
        ({"json": {**base, "ok": True, "status": "mystery", "matches": []}}, MalformedOutput),
    ]
    for action, expected in cases:
        standin.plan(action)
        with trio.fail_after(30):
            result = await standin.client().resolve_thread("s-1")
        if isinstance(expected, type):
            assert isinstance(result, expected), action
        else:
            assert result == expected
    assert standin.attempts()[0]["argv"][-5:] == ["resolve-agent-thread", "--host-surface", HOST_SURFACE, "--thread-id", "s-1"]


@pytest.mark.parametrize(
    "thread_id", ["", "has space", "tab\there", "a/b", "a\\b", 'a"b', "a'b", "ctl\x01", "x" * 129, None]
)
async def test_invalid_thread_ids_are_refused_before_any_call(standin, thread_id):
    standin.plan(OK)
    with pytest.raises(LoopxRequestError) as err:
        await standin.client().resolve_thread(thread_id)
    assert err.value.code == "INVALID_LOOPX_REQUEST"
    assert standin.attempts() == []


async def test_invalid_ids_and_operations_are_refused_before_any_call(standin):
    standin.plan(OK)
    client = standin.client()
    for call in (
        lambda: client.should_run("g1", "a1", "turn 1"),
        lambda: client.should_run("g1", "a1", "t" * 129),
        lambda: client.should_run("g/1", "a1", "turn-1"),
        lambda: client.heartbeat_prompt("g1", "a 1", "turn-1"),
        lambda: client.goal_lifecycle("g1", "delete", execute=True),
        lambda: client.todo_progress("", "a1"),
    ):
        with pytest.raises(LoopxRequestError):
            await call()
    assert standin.attempts() == []
    assert client.argv("x")[:3] == standin.command


async def test_version_reads_the_first_line(standin):
    standin.plan({"stdout": "loopx 2.1.1\n"})
    with trio.fail_after(30):
        version = await standin.client().version()
    assert (version.version, version.parts) == ("2.1.1", (2, 1, 1))
    assert standin.attempts()[0]["argv"] == ["--version"]
    standin.plan({"stdout": "SECRET /usr/bin/python 3\n"})
    with trio.fail_after(30):
        bad = await standin.client().version()
    assert isinstance(bad, MalformedOutput) and safe(bad.reason, standin)


# -- LoopX's own identity rules, and answers that break its contract -------------------------

LONG_GOAL = "g" * 150  # LoopX binds it (its only limit is the goal directory's name)


async def test_ids_loopx_accepts_are_accepted(standin):
    base = {"schema_version": "loopx_thread_agent_binding_resolution_v0", "host_surface": HOST_SURFACE,
            "thread_id": "s-1", "ok": True, "status": "bound"}
    standin.plan({"json": {**base, "goal_id": LONG_GOAL, "agent_id": "a1@x:y.z-w_v",
                           "matches": [{"goal_id": LONG_GOAL, "agent_id": "a1@x:y.z-w_v"}]}})
    with trio.fail_after(30):
        binding = await standin.client().resolve_thread("s-1")
    assert binding == ThreadBinding("bound", LONG_GOAL, "a1@x:y.z-w_v")
    receipt = {"turn_instance_id": "turn-1", "status": "committed", "settlement_identity": {
        "effect_id": f"{LONG_GOAL}:a1:t:turn-1", "goal_id": LONG_GOAL, "agent_id": "a1", "todo_id": "t",
        "turn_instance_id": "turn-1"}}
    standin.plan({"json": {"ok": True, "should_run": True, "decision": "run", "goal_id": LONG_GOAL,
                           "agent_identity": {"agent_id": "a1"}, "heartbeat_receipt": receipt}})
    with trio.fail_after(30):
        decision = await standin.client().should_run(LONG_GOAL, "a1", "turn-1")
    assert isinstance(decision, ShouldRun) and decision.should_run
    # Goal ids with a space or a non-ASCII letter work in LoopX too (one path segment).
    for goal_id in ("a b", "ü-goal", "x" * 255):
        assert check_goal_id(goal_id) == goal_id


@pytest.mark.parametrize("goal_id", ["", ".", "..", "a/b", "a\\b", "-x", "nul\0", "x" * 256, "ü" * 128, None])
def test_goal_ids_loopx_cannot_hold_are_refused(goal_id):
    with pytest.raises(LoopxRequestError):
        check_goal_id(goal_id)


async def test_a_binding_whose_agent_id_is_not_an_agent_id_is_refused(standin):
    base = {"schema_version": "loopx_thread_agent_binding_resolution_v0", "host_surface": HOST_SURFACE,
            "thread_id": "s-1", "ok": True, "status": "bound", "goal_id": "g"}
    for agent_id in ("Agent-1", "1a", "a" * 81, "a b", ""):
        standin.plan({"json": {**base, "agent_id": agent_id, "matches": [{"goal_id": "g", "agent_id": agent_id}]}})
        with trio.fail_after(30):
            result = await standin.client().resolve_thread("s-1")
        assert isinstance(result, MalformedOutput), agent_id


IDENTITY = {"effect_id": "g1:a1:t9:turn-1", "goal_id": "g1", "agent_id": "a1", "todo_id": "t9", "turn_instance_id": "turn-1"}


@pytest.mark.parametrize(
    "answer",
    [
        {"goal_id": "g2", "agent_identity": {"agent_id": "a1"}},  # another goal
        {"goal_id": "g1", "agent_identity": {"agent_id": "a2"}},  # another agent
        {"goal_id": "g1"},  # says nothing of the agent
        {**FOR_G1_A1, "heartbeat_receipt": {"turn_instance_id": "turn-1", "status": "committed",
                                            "settlement_identity": IDENTITY, "partial_write": True}},
        {**FOR_G1_A1, "heartbeat_receipt": {"turn_instance_id": "turn-1", "status": "write_failed",
                                            "settlement_identity": IDENTITY}},
        {**FOR_G1_A1, "unsettled_host_turn_recovery": {"prior_turn_instance_id": "has space"}},
        {**FOR_G1_A1, "unsettled_host_turn_recovery": ["resume_prior_turn"]},
    ],
)
async def test_should_run_answers_that_break_the_contract_fail_closed(standin, answer):
    receipt = {"turn_instance_id": "turn-1", "status": "committed", "settlement_identity": IDENTITY}
    standin.plan({"json": {"ok": True, "should_run": True, "decision": "run", "heartbeat_receipt": receipt, **answer}})
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(result, MalformedOutput) and result.kind == "schema"
    assert len(standin.attempts()) == 1


# The scheduler hint of a wait as loopx 2.1.1 answers it (an agent lane with nothing in
# scope), trimmed to what the client reads; tests/actors/test_loopx_continuation.py
# checks the same fields on the real CLI's answers.
WAIT_HINT = {
    "schema_version": "scheduler_hint_v0", "action": "backoff_until_reassigned", "cadence_class": "agent_scope_wait",
    "unchanged_poll": {"limits": {"local_scheduler": 3, "codex_cli_tui": 3},
                       "after_limits": {"local_scheduler": "stop_tick_loop"}},
    "reset_policy": {"reset_token": "aaea0aea9367daa0", "identity_signature": "33ea2db419fb"},
    "cold_path_detail": {"local_scheduler": {
        "recommended_interval_minutes": 10, "max_interval_minutes": 60, "unchanged_poll_backoff_multiplier": 2,
        "example_progression_minutes": [10, 20, 30, 60], "unchanged_poll_limit": 3, "after_limit": "stop_tick_loop",
    }},
}


def wait_answer(hint) -> dict:
    return {"json": {"ok": True, "should_run": False, "decision": "reassignment_required", **FOR_G1_A1,
                     "heartbeat_receipt": {"turn_instance_id": "turn-1", "status": "committed",
                                           "settlement_binding_owed": True},
                     "scheduler_hint": hint}}


async def test_should_run_reads_the_scheduler_hint_a_local_scheduler_follows(standin):
    standin.plan(wait_answer(WAIT_HINT))
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(result, ShouldRun) and not result.should_run
    assert result.scheduler == SchedulerHint(
        action="backoff_until_reassigned", local=None, interval_minutes=10.0, max_interval_minutes=60.0,
        progression_minutes=(10.0, 20.0, 30.0, 60.0), unchanged_poll_limit=3, after_limit="stop_tick_loop",
        reset_token="aaea0aea9367daa0",
    )
    assert (result.wait_minutes, result.scheduler_action) == (10.0, "backoff_until_reassigned")
    assert [result.scheduler.interval_after(n) for n in range(6)] == [10, 20, 30, 60, 60, 60]
    assert not result.scheduler.stops
    # Without the cold-path detail the limit comes from the hot path.
    standin.plan(wait_answer({**WAIT_HINT, "cold_path_detail": None}))
    with trio.fail_after(30):
        hot = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(hot, ShouldRun)
    assert (hot.scheduler.unchanged_poll_limit, hot.scheduler.after_limit, hot.scheduler.interval_after(0)) == (
        3, "stop_tick_loop", None)
    # A stopped goal's hint tells a local scheduler to stop.
    stop = {"action": "stop_until_explicit_resume", "unchanged_poll": {"local_scheduler": "stop"}}
    standin.plan(wait_answer(stop))
    with trio.fail_after(30):
        stopped = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(stopped, ShouldRun) and stopped.scheduler.stops and stopped.scheduler.local == "stop"


@pytest.mark.parametrize(
    "local",
    [
        {"example_progression_minutes": [10, -1]},
        {"example_progression_minutes": [10, "20"]},
        {"example_progression_minutes": "10,20"},
        {"recommended_interval_minutes": float("nan")},
        {"max_interval_minutes": True},
        {"unchanged_poll_limit": -1},
        {"unchanged_poll_limit": 2.5},
        {"unchanged_poll_limit": True},
    ],
)
async def test_a_scheduler_hint_that_breaks_the_contract_fails_closed(standin, local):
    hint = {**WAIT_HINT, "cold_path_detail": {"local_scheduler": {**WAIT_HINT["cold_path_detail"]["local_scheduler"],
                                                                  **local}}}
    standin.plan(wait_answer(hint))
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-1")
    assert isinstance(result, MalformedOutput) and result.kind == "schema"


async def test_should_run_reads_the_recovery_and_a_stopped_goal(standin):
    # The shape loopx 2.1.1 answers for a stopped goal whose earlier turn is unsettled.
    standin.plan({"json": {
        "ok": True, "should_run": True, "decision": "unsettled_host_turn_recovery", **FOR_G1_A1,
        "pause_cause": "goal_stopped", "scheduler_hint": {"action": "stop_until_explicit_resume"},
        "heartbeat_receipt": {"turn_instance_id": "turn-2", "status": "committed", "settlement_binding_owed": True},
        "unsettled_host_turn_recovery": {"repair": "resume_prior_turn", "prior_turn_instance_id": "turn-1",
                                         "binding_id": "todo_1", "reason_code": "required_closeout_receipt_missing"},
    }})
    with trio.fail_after(30):
        result = await standin.client().should_run("g1", "a1", "turn-2")
    assert isinstance(result, ShouldRun) and result.settlement_owed and result.goal_stopped
    assert result.recovery == Recovery("resume_prior_turn", "turn-1", "todo_1", "required_closeout_receipt_missing")


async def test_a_lifecycle_change_written_in_part_is_not_a_result(standin):
    answer = {"ok": True, "before_state": "active", "after_state": "stopped", "changed": True, "written": True,
              "readback": {"status": "verified", "verified": True}}
    standin.plan({"json": {**answer, "partial_write": True}})
    with trio.fail_after(30):
        result = await standin.client().goal_lifecycle("g1", "stop", execute=True)
    assert isinstance(result, MalformedOutput)
    standin.plan({"json": {**answer, "partial_write": False}})
    with trio.fail_after(30):
        result = await standin.client().goal_lifecycle("g1", "stop", execute=True)
    assert isinstance(result, LifecycleResult) and result.readback_verified


async def test_todo_counts_must_add_up(standin):
    standin.plan({"json": {"ok": True, "agent_todos": {"done_count": 1, "open_count": 1, "total_count": 3}}})
    with trio.fail_after(30):
        result = await standin.client().todo_progress("g1", "a1")
    assert isinstance(result, MalformedOutput)
    standin.plan({"json": {"ok": True, "agent_todos": {"done_count": 1, "open_count": 2, "total_count": 3}}})
    with trio.fail_after(30):
        assert await standin.client().todo_progress("g1", "a1") == TodoProgress(1, 2, 3)
