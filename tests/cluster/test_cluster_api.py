"""The cluster's API from a harness process, against a real redis-server and a worker."""

from __future__ import annotations

import functools
import json
import signal
from pathlib import Path

import pytest
import trio
from cluster_workers import start_worker, until_event

from loopdock import open_cluster
from loopdock._worker import run_worker


@pytest.fixture
async def worker(redis_server, tmp_path, nursery):
    return await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w1", shards=4, lease_ttl=2.0, worker_id="w1"))


async def test_an_agent_created_through_the_cluster_answers_and_its_log_is_in_redis(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="a1", loop="minimal-first")
            sent = handle.agent.followup("hello there")
            await handle.agent.wait_idle()
            events = await rt.read_events("a1")
    types = [e.type for e in events]
    assert types.count("turn/start") == 1 and types.count("turn/end") == 1
    user = [e for e in events if e.type == "user/message"]
    assert [e.data["id"] for e in user] == [sent.id]
    assert any(e.type == "assistant/message" for e in events)
    end = [e for e in events if e.type == "turn/end"][0]
    assert end.data["reason"]["kind"] == "completed"
    assert [e.seq for e in events] == list(range(len(events)))


async def test_a_second_worker_gets_its_fair_share_and_agents_go_on_on_either(redis_server, tmp_path, nursery):
    with trio.fail_after(60):
        first = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "a", lease_ttl=1.0, worker_id="a"))
        second = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "b", lease_ttl=1.0, worker_id="b"))
        shards = first.ownership.shards
        # The first hands shards over, one per tick.
        await second.ownership.changes.wait_until(lambda: len(second.ownership.tokens) >= shards // 2)
        assert not set(first.ownership.tokens) & set(second.ownership.tokens)
        async with open_cluster(redis_server.url) as rt:
            handles = [await rt.create_agent(session_id=f"s{i}", loop="minimal-first") for i in range(8)]
            for handle in handles:
                handle.agent.followup("hi")
            for handle in handles:
                await handle.agent.wait_idle()
        on_first, on_second = set(first.host.handles), set(second.host.handles)
    assert on_first | on_second == {f"s{i}" for i in range(8)} and not on_first & on_second
    assert on_first and on_second


async def test_a_worker_with_other_loops_is_refused(redis_server, tmp_path, nursery, monkeypatch):
    from loopdock import RegistryMismatchError, _worker

    with trio.fail_after(30):
        await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "a", lease_ttl=1.0, worker_id="a"))
        monkeypatch.setattr(_worker, "fingerprint", lambda dock: "loops=other;drivers=default")
        with pytest.raises(RegistryMismatchError, match="same loop packages"):
            await run_worker(redis_server.url, home=tmp_path / "b", lease_ttl=1.0, worker_id="b")


async def test_a_worker_asking_for_another_shard_count_is_refused(redis_server, tmp_path, worker):
    from loopdock.runtime.cluster import ClusterConfigError

    with pytest.raises(ClusterConfigError, match="has 4 shards"):
        await run_worker(redis_server.url, home=tmp_path / "b", shards=8, worker_id="b")


async def test_creating_on_an_unknown_loop_is_the_workers_refusal(redis_server, worker):
    from loopdock._cluster import ClusterRequestError

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            with pytest.raises(ClusterRequestError) as caught:
                await rt.create_agent(session_id="u1", loop="no-such-loop")
            assert caught.value.code == "UNKNOWN_LOOP"
            assert not await rt.store.aexists("u1")
            handle = await rt.create_agent(session_id="u2", loop="minimal-first")
            with pytest.raises(ClusterRequestError) as again:
                await rt.create_agent(session_id="u2", loop="minimal-first")
            assert again.value.code == "SESSION_EXISTS"
            await handle.dispose()


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/0", "redis://", "redis://h:1/x", "redis://h:99999/0"])
def test_bad_cluster_urls_are_refused_with_what_is_wrong(url):
    from loopdock.runtime.cluster import ClusterUrlError, check_url

    with pytest.raises(ClusterUrlError):
        check_url(url)


async def test_the_cluster_pages_example_runs_as_written(redis_server, worker, capsys):
    import re

    page = (Path(__file__).parents[2] / "docs" / "cluster.md").read_text()
    [snippet] = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    snippet = snippet.replace("redis://127.0.0.1:6379/0", redis_server.url).replace("trio.run(main)", "")
    namespace: dict = {}
    exec(compile(snippet, "docs/cluster.md", "exec"), namespace)
    with trio.fail_after(30):
        await namespace["main"]()
    printed = capsys.readouterr().out.split("\n")
    assert printed[0].startswith("0 ")
    assert printed[-2].endswith("turn/end")


async def test_cancel_ends_the_running_turn_aborted_and_resume_keeps_the_bound_loop(redis_server, tmp_path, nursery):
    from loopdock._cluster import ClusterRequestError
    from loopdock.runtime.tools import ShellPolicy

    await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w", shards=4, lease_ttl=2.0, worker_id="w",
        shell=ShellPolicy(allow=frozenset({"sleep"}))))
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="c1", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 30"}')
            await until_event(handle.agent, lambda e: e.type == "tool/call")
            handle.agent.cancel()
            await handle.agent.wait_idle()
            await handle.dispose()
            with pytest.raises(ClusterRequestError) as switched:
                await rt.resume_agent(resume_session_id="c1", loop="standard")
            resumed = await rt.resume_agent(resume_session_id="c1", loop="minimal-first")
            resumed.agent.followup("again")
            await resumed.agent.wait_idle()
            events = await rt.read_events("c1")
    assert switched.value.code == "LOOP_SWITCH"
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["aborted", "completed"]


async def test_an_error_in_the_clients_body_comes_out_as_itself(redis_server, worker):
    from loopdock._cluster import ClusterRequestError

    with trio.fail_after(30), pytest.raises(ClusterRequestError, match="no-such-loop"):
        async with open_cluster(redis_server.url) as rt:
            await rt.create_agent(session_id="x1", loop="no-such-loop")


async def test_a_worker_actor_that_fails_once_is_restarted(autojump_clock):
    from loopdock._worker import essential

    attempts = []

    async def flaky(*, task_status=trio.TASK_STATUS_IGNORED):
        attempts.append(trio.current_time())
        if len(attempts) == 1:
            raise RuntimeError("once")
        task_status.started()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(essential, flaky, "flaky")
        assert len(attempts) == 2  # restarted after its backoff, and serving
        nursery.cancel_scope.cancel()


async def test_a_worker_actor_that_keeps_failing_stops_the_worker(autojump_clock):
    from loopdock._worker import WorkerStoppedError, essential

    async def broken(*, task_status=trio.TASK_STATUS_IGNORED):
        raise RuntimeError("always")

    with pytest.raises(WorkerStoppedError, match="broken kept failing"):
        await essential(broken, "broken")


async def test_a_lease_lost_and_taken_again_delivers_the_queued_message_once(redis_server, tmp_path, nursery):
    from loopdock.runtime.cluster import keys
    from loopdock.runtime.tools import ShellPolicy

    w = await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w", shards=4, lease_ttl=1.0, worker_id="w",
        shell=ShellPolicy(allow=frozenset({"sleep"}))))
    with trio.fail_after(60):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="q1", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 30"}')
            await until_event(handle.agent, lambda e: e.type == "tool/started")
            queued = handle.agent.followup("queued behind the long turn")
            await rt.wait_sent()
            # Handed to the agent, not durable yet.
            await w.ownership.changes.wait_until(lambda: queued.id in w.ownership.pending)
            shard = keys.shard_of("q1", rt.shards)
            first = w.ownership.tokens[shard]
            await rt._redis.delete([keys.lease(shard)])  # the lease is gone (as if it expired)
            # Lost, then taken again.
            await w.ownership.changes.wait_until(lambda: w.ownership.tokens.get(shard) not in (None, first))
            # The open turn goes on: its cut call may have run, so a person is asked.
            [again] = await handle.agent.wait_approvals()
            await again.answer("refuse", reason="enough")
            await handle.agent.wait_idle()
            events = await rt.read_events("q1")
    ids = [e.data["id"] for e in events if e.type == "user/message"]
    assert ids.count(queued.id) == 1
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed", "completed"]


async def test_an_unreachable_cluster_is_one_clear_error_for_a_worker_and_a_client(tmp_path):
    import socket

    from loopdock.runtime.cluster import ClusterUnreachableError

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    with trio.fail_after(30):
        with pytest.raises(ClusterUnreachableError, match="cannot reach the cluster's Redis"):
            await run_worker(url, home=tmp_path / "w", worker_id="w")
        with pytest.raises(ClusterUnreachableError):
            async with open_cluster(url):
                raise AssertionError("the body must not run")


async def test_a_create_cancelled_after_the_call_is_still_carried_out(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            with trio.move_on_after(0) as scope:  # cancelled at its first wait: the request is queued by then
                await rt.create_agent(session_id="late", loop="minimal-first")
            assert scope.cancelled_caught
            await rt.wait_sent()
            agent = rt.get_agent("late")
            await until_event(agent, lambda e: True)  # the worker answers nobody, and creates it
            assert await rt.store.aexists("late")
            agent.followup("so it is there")
            await agent.wait_idle()
            ends = [e.data["reason"]["kind"] for e in await rt.read_events("late") if e.type == "turn/end"]
    assert ends == ["completed"]


async def test_closing_the_client_writes_what_followup_queued(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="f1", loop="minimal-first")
            sent = handle.agent.followup("last words")  # returns before the message is in Redis
        async with open_cluster(redis_server.url) as again:
            event = await until_event(again.get_agent("f1"), lambda e: e.type == "user/message")
    assert event.data["id"] == sent.id


async def test_the_worker_command_says_an_unreachable_cluster_in_one_line(tmp_path):
    import socket
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-P", "-m", "loopdock", "worker", "--cluster", url, "--home", str(tmp_path / "w")],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    assert done.returncode == 2 and done.stdout == b""
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("loopdock: CLUSTER_UNREACHABLE: cannot reach the cluster's Redis: ")


async def test_a_message_vetoed_at_pre_step_on_a_worker_is_settled_once(redis_server, tmp_path, nursery):
    from loopdock.runtime.cluster import keys

    config = {"loopPackages": ["gated_loops"]}  # tests/gated_loops.py
    with trio.fail_after(30):
        worker = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "w", config=config, shards=4, worker_id="w"))
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="v1", loop="gated")
            vetoed = handle.agent.followup("work over the weekend")
            await handle.agent.wait_idle()  # the veto settles the message: nothing left to wait for
            handle.agent.followup("work on monday")
            await handle.agent.wait_idle()
            events = await rt.read_events("v1")
            assert vetoed.id in await rt._redis.smembers(keys.done("v1"))  # recorded, so a redelivery is dropped
            pending = await rt._redis.xpending(keys.inbox(keys.shard_of("v1", 4), "human"), keys.GROUP)
    ends = [e.data["reason"] for e in events if e.type == "turn/end"]
    assert [r["kind"] for r in ends] == ["blocked", "completed"]
    assert ends[0]["messageIds"] == [vetoed.id]
    assert pending.pending == 0 and vetoed.id not in worker.ownership.pending


async def test_fork_from_a_client_copies_whole_turns_and_the_fork_lives_on_its_own(redis_server, worker):
    from loopdock._cluster import ClusterRequestError

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="src", loop="minimal-first")
            for text in ("first", "second"):
                handle.agent.followup(text)
                await handle.agent.wait_idle()
            source = await rt.read_events("src")
            second_start = [e.seq for e in source if e.type == "turn/start"][1]
            assert await rt.fork_session("src", "whole") == "whole"
            await rt.fork_session("src", "half", upto_seq=second_start + 1)  # inside the second turn
            whole, half = await rt.read_events("whole"), await rt.read_events("half")
            headers = {h.id: h for h in await rt.list_sessions()}

            forked = await rt.resume_agent(resume_session_id="whole")
            forked.agent.followup("only in the fork")
            await forked.agent.wait_idle()
            assert await rt.read_events("src") == source

            with pytest.raises(ClusterRequestError) as exists:
                await rt.fork_session("src", "whole")
            with pytest.raises(ClusterRequestError) as missing:
                await rt.fork_session("no-such-session", "orphan")
            assert not await rt.store.aexists("orphan")
    assert [(e.type, e.data) for e in whole] == [(e.type, e.data) for e in source]
    first_end = [e.seq for e in source if e.type == "turn/end"][0]
    assert [(e.type, e.data) for e in half] == [(e.type, e.data) for e in source[: first_end + 1]]
    assert headers["whole"].parent_session == "src" and headers["whole"].forked_events == len(source)
    assert (exists.value.code, missing.value.code) == ("SESSION_EXISTS", "SESSION_NOT_FOUND")


async def test_fork_of_a_session_live_on_another_worker_copies_its_durable_turns(redis_server, tmp_path, nursery):
    from loopdock.runtime.cluster import shard_of

    with trio.fail_after(60):
        a = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "a", shards=4, lease_ttl=1.0, worker_id="a"))
        b = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "b", shards=4, lease_ttl=1.0, worker_id="b"))
        # The first hands shards over, one per tick.
        await b.ownership.changes.wait_until(lambda: len(b.ownership.tokens) >= 2)
        on_a = next(f"s{i}" for i in range(100) if shard_of(f"s{i}", 4) in a.ownership.tokens)
        on_b = next(f"f{i}" for i in range(100) if shard_of(f"f{i}", 4) in b.ownership.tokens)
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id=on_a, loop="minimal-first")
            handle.agent.followup("on a")
            await handle.agent.wait_idle()
            await rt.fork_session(on_a, on_b)
            forked = await rt.resume_agent(resume_session_id=on_b)
            forked.agent.followup("on b")
            await forked.agent.wait_idle()
            source, fork = await rt.read_events(on_a), await rt.read_events(on_b)
    assert on_a in a.host.handles and on_b in b.host.handles
    assert [(e.type, e.data) for e in fork[: len(source)]] == [(e.type, e.data) for e in source]
    assert [e.data["content"][0]["text"] for e in fork if e.type == "user/message"] == ["on a", "on b"]


async def test_wait_idle_reads_the_log_only_when_nothing_is_outstanding(redis_server, worker, monkeypatch):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r1", loop="minimal-first")
            read = rt.store.aload_events
            reads: list[str] = []

            async def counted(session_id, *args, **kwargs):
                reads.append(session_id)
                return await read(session_id, *args, **kwargs)

            monkeypatch.setattr(rt.store, "aload_events", counted)
            handle.agent.followup("one")
            await handle.agent.wait_idle()
            # A message was outstanding: the watcher's reads bring every event from the
            # cursor on, so a catch-up read first would read them twice.
            assert reads == []

            other = rt.get_agent("r1")  # nothing sent through it: it reads the log up to now
            await other.wait_idle()
            assert reads == ["r1"]
            seen = [e.type for e in await read("r1")][: other._cursor]
    assert seen.count("turn/start") == seen.count("turn/end") == 1
    assert seen[-1] == "turn/end"


async def test_wait_idle_follows_the_marks_not_the_events_unless_a_reservation_is_open(redis_server, worker):
    from loopdock.runtime._messages import ProducerSource, user_message
    from loopdock.runtime.cluster import keys

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="m1", loop="minimal-first")
            watcher = rt.watcher
            read_streams: list[str] = []
            xread = watcher._xread

            async def spy(streams):
                read_streams.extend(streams)
                return await xread(streams)

            watcher._xread = spy  # type: ignore[method-assign]
            sent = handle.agent.followup("one")
            await handle.agent.wait_idle()
            assert keys.marks("m1") in read_streams and keys.log("m1") not in read_streams
            events = await rt.read_events("m1")
            assert handle.agent._cursor == len(events) and events[-1].type == "turn/end"
            assert sent.id in [e.data.get("id") for e in events if e.type == "user/message"]
            # One mark per commit that added events, under the log id of its last event:
            # together they name the message, and the turn closed last.
            marks = await rt._redis.xrange(keys.marks("m1"))
            assert marks and str(marks[-1].identifier) == keys.log_id(len(events) - 1)
            folded = [json.loads(m.field_values["k"]) for m in marks]
            assert sent.id in [i for m in folded for i in m["c"]]
            assert [m["o"] for m in folded if m["o"] is not None][-1] is False

            read_streams.clear()
            reservation = handle.agent.reserve(user_message("two", source=ProducerSource(kind="test-producer")))
            await handle.agent.wait_idle()  # a reservation is open: its events settle it
            assert keys.log("m1") in read_streams
            assert reservation.state == "admitted"


async def test_a_message_settled_while_its_batch_was_checked_is_not_handled_again(redis_server, worker, monkeypatch):
    from loopdock.runtime._serde import message_to_wire
    from loopdock.runtime.cluster import InboxMessage

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="d1", loop="minimal-first")
            first = handle.agent.followup("once")
            await handle.agent.wait_idle()

            # The race, injected: this worker's commit of `first` lands while the batch's
            # done-check is in flight, so the check answers "not done", and `first` is no
            # longer pending by the time its second copy is handled.
            async def stale_done(messages):
                for message in messages:
                    if message.id == first.id:
                        worker.host.ownership.settled(message.id)
                return set()

            monkeypatch.setattr(worker.host, "_done", stale_done)
            rt.post(InboxMessage(first.id, "followup", "d1", {"message": message_to_wire(first)}))  # a retry
            second = handle.agent.followup("after it")  # same lane, so handled after the retry
            await handle.agent.wait_idle()
            events = await rt.read_events("d1")
    assert [e.data["id"] for e in events if e.type == "user/message"] == [first.id, second.id]


async def test_a_resume_read_with_messages_to_its_session_still_checks_the_loop(redis_server, worker):
    from loopdock.runtime._ids import MESSAGE_IDS
    from loopdock.runtime._messages import ProducerSource, user_message
    from loopdock.runtime._serde import message_to_wire
    from loopdock.runtime.cluster import InboxMessage, keys

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="v1", loop="minimal-first")
            await handle.dispose()
            resume = InboxMessage(MESSAGE_IDS.new(), "resume", "v1", {"loop": "standard"})
            work = user_message("automatic", source=ProducerSource(kind="test"))
            inject = InboxMessage(work.id, "inject", "v1", {"message": message_to_wire(work)}, "auto")
            # One read brings both: the worker makes the batch's agents live before it
            # hands messages over, but not one the batch resumes (the resume checks its loop).
            shard = keys.shard_of("v1", rt.shards)
            async with rt._redis.pipeline(transaction=True) as pipe:
                for message in (resume, inject):
                    pipe.xadd(keys.inbox(shard, message.lane), message.to_fields())
            reply = await rt._redis.blpop([keys.reply(resume.id)], timeout=20)
    assert reply is not None
    answer = json.loads(reply[1])
    assert (answer["ok"], answer["code"]) == (False, "LOOP_SWITCH")



async def test_the_worker_command_hides_its_environment_and_stops_cleanly_at_once(
        redis_server, tmp_path, nursery, monkeypatch):
    # The worker owns its process, as serve does: the programs its agents run cannot read
    # its keys in /proc/<pid>/environ. A stop sent as soon as it is ready is a clean one.
    secret = "sk-worker-secret-0123456789"
    monkeypatch.setenv("DEEPSEEK_API_KEY", secret)  # in the worker's initial environment
    worker = await start_worker(nursery, redis_server.url, tmp_path / "w", "hidden")
    shown = await trio.Path(f"/proc/{worker.process.pid}/environ").read_bytes()
    worker.signal(signal.SIGINT)
    with trio.fail_after(30):
        assert await worker.process.wait() == 0
    assert secret.encode() not in shown and b"PATH=" in shown


async def test_a_cancelled_worker_hands_its_shards_back_and_leaves_at_once(redis_server, tmp_path, nursery):
    # run_worker's contract, and `loopdock worker`'s on SIGINT/SIGTERM (it cancels it): the
    # leases are deleted, not left to expire. The cancellation used to reach the Redis
    # client's own connections too, and the leave then failed ("Connection lost"), quietly.
    from loopdock.runtime.cluster import keys

    stopping, ended = trio.CancelScope(), trio.Event()

    async def run(*, task_status=trio.TASK_STATUS_IGNORED):
        try:
            with stopping:
                await run_worker(redis_server.url, home=tmp_path / "w", shards=4, lease_ttl=60.0, worker_id="w",
                                 task_status=task_status)
        finally:
            ended.set()

    with trio.fail_after(30):
        w = await nursery.start(run)
        await w.ownership.changes.wait_until(lambda: len(w.ownership.tokens) == 4)
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="h1", loop="minimal-first")
            handle.agent.followup("hello")
            await handle.agent.wait_idle()
            assert set(await rt.workers()) == {"w"}
            stopping.cancel()
            await ended.wait()
            # A minute before the leases would expire: gone because the worker let go.
            assert await rt._redis.exists([keys.lease(shard) for shard in range(4)]) == 0
            assert await rt.workers() == {}
