"""One contract, three kinds: the in-process ``AgentActor``, the cluster's ``RemoteAgent``
and the DSH proxy ``DshAgent`` each satisfy ``loopdock.Agent``, structurally: checked by
the strict type checker, as a user's code would be, and at run time, signature by
signature. What each kind does with the contract is tested with the kind
(tests/actors/test_agent.py, tests/cluster/test_cluster_contract.py,
tests/bridge/test_dsh_agent.py and its e2e)."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from loopdock import Agent, AgentReservation, ProducerSource, Runtime, UserSource, user_message
from loopdock._cluster import RemoteAgent
from loopdock.actors import AgentActor
from loopdock.bridge import DshAgent, HostHandler
from loopdock.bridge._host_handler import HostAgent

ROOT = Path(__file__).resolve().parents[2]
KINDS = [AgentActor, RemoteAgent, DshAgent]
MEMBERS = ["followup", "steer", "inject", "cancel", "reserve", "withdraw", "wait_idle"]

CHECKED = """\
from loopdock import Agent, AgentReservation, Reservation
from loopdock.actors import AgentActor
from loopdock._cluster import RemoteAgent, RemoteReservation
from loopdock.bridge import DshAgent


def kinds(embedded: AgentActor, remote: RemoteAgent, dsh: DshAgent) -> list[Agent]:
    return [embedded, remote, dsh]


def reservations(embedded: Reservation, remote: RemoteReservation) -> list[AgentReservation]:
    return [embedded, remote]
"""
# A control: the checker must see a signature that differs (here, cancel without a cause).
CONTROL = """\
from loopdock import Agent
from loopdock.actors import AgentActor


class NoCause(AgentActor):
    def cancel(self, *, keep_inbox: bool = True) -> None: ...  # type: ignore[override]


def wrong(agent: NoCause) -> Agent:
    return agent
"""


def test_every_kind_satisfies_the_contract_for_the_type_checker(tmp_path):
    (tmp_path / "checked.py").write_text(CHECKED)
    (tmp_path / "control.py").write_text(CONTROL)
    cache = tmp_path / "cache"
    warm = Path(sys.prefix) / ".mypy_cache"  # what scripts/test's check left: a faster start
    if warm.is_dir():
        shutil.copytree(warm, cache)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
         "checked.py", "control.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [e.split(":")[0] for e in errors] == ["control.py"], done.stdout + done.stderr
    assert 'expected "Agent"' in errors[0]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("member", MEMBERS)
def test_every_kind_has_the_contracts_signatures(kind, member):
    expected, actual = getattr(Agent, member), getattr(kind, member)
    assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(expected)

    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(actual) == shape(expected)


async def test_an_agent_of_this_process_and_a_dsh_proxy_are_agents_at_run_time(tmp_path):
    with trio.fail_after(60):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await rt.create_agent(session_id="a1")
            agent = handle.agent
            sent = [agent.inject("quiet"), agent.steer("now"), agent.followup("later")]
            reservation = agent.reserve(user_message("automatic", source=ProducerSource("test-producer")))
            await agent.wait_idle()
            proxy = DshAgent(HostHandler(rt.dock), HostAgent("d1", "d1", None, "c1"), tmp_path, frozenset())
            assert isinstance(agent, Agent) and isinstance(proxy, Agent)
            assert isinstance(reservation, AgentReservation) and await reservation.wait() == "admitted"
    assert all(m.source == UserSource() for m in sent)  # a str is a person's message
