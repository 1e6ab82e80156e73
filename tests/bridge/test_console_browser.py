"""The console page, and the GoalBar page's connection states, in a real headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, driven by selenium), against the handlers
``loopdock serve`` composes and the REAL loopx CLI.

A DSH host is played by a websocket client speaking the host's side of the protocol (the
real DSH host reaching the console is the README walkthrough's test). Selenium is
synchronous: every browser step runs in a worker thread while trio serves. Waits are
selenium's explicit waits on what the page shows (no sleeps)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import trio
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait
from trio_websocket import open_websocket

from loopdock import LoopxSettings, Runtime
from loopdock._bridge import compose_handlers, goalbar_service
from loopdock.bridge._server import serve_bridge
from loopdock.runtime.loopx import HOST_SURFACE, LoopxOk

from .test_goalbar_browser import chromium

TOKEN = "console-browser-token"
PHASE = 120
ROOT = Path(__file__).resolve().parents[2]


def frame(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


async def ok(client, *args):
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)


async def test_the_console_shows_every_agent_live_and_filters(tmp_path, loopx_env, loopx_command, loopx_project):
    settings = LoopxSettings(env=loopx_env, command=tuple(loopx_command), initialize=False)
    browser = await trio.to_thread.run_sync(chromium, tmp_path / "chromium-profile")
    browser.set_window_size(1100, 330)
    try:
        with trio.fail_after(6 * PHASE):
            async with Runtime.open(tmp_path / "home", loopx=settings,
                                    config={"sessionLoops": {"dsh-review": "minimal-first"}}) as rt:
                client = rt.loopx.client_for(loopx_project)
                await ok(client, "bootstrap", "--project", ".", "--goal-id", "release", "--objective",
                         "Write the release notes", "--adapter-kind", "read_only_project_map_v0",
                         "--adapter-status", "connected-read-only")
                await ok(client, "register-agent", "--goal-id", "release", "--agent-id", "notes", "--require-new", "--execute")
                for text in ("[P0] Draft", "[P1] Review"):
                    await ok(client, "todo", "add", "--goal-id", "release", "--project", ".", "--role", "agent",
                             "--claimed-by", "notes", "--task-class", "advancement_task", "--text", text)
                await ok(client, "bind-agent-thread", "--goal-id", "release", "--thread-id", "dsh-review",
                         "--host-surface", HOST_SURFACE, "--agent-id", "notes", "--execute")

                live = rt.subscribe_live()
                async with goalbar_service(rt) as service, trio.open_nursery() as nursery:
                    console = await compose_handlers(rt, service, loopx_project, nursery, live)
                    port = await nursery.start(functools.partial(serve_bridge, console, token=TOKEN))
                    writer = await rt.create_agent(session_id="writer-1", cwd=str(loopx_project))
                    writer.agent.followup("hello")
                    await writer.agent.wait_idle()

                    def wait_for(predicate, timeout=90):
                        return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda d: predicate(d))

                    def row(session_id):
                        # read in one script: the page redraws its rows on every change
                        rows = browser.execute_script(
                            "return [...document.querySelectorAll('#rows tr')]"
                            ".map(tr => [...tr.cells].map(td => td.innerText.trim()))")
                        return next((r for r in rows if r and r[0] == session_id), None)

                    def runtime_row():
                        browser.get(f"http://127.0.0.1:{port}/console#token={TOKEN}")
                        wait_for(lambda d: (r := row("writer-1")) is not None and r[8] == "no goal bound")
                        return row("writer-1")
                    assert await trio.to_thread.run_sync(runtime_row) == [
                        "writer-1", "runtime", "standard", "default", "idle", "0", "1", "completed", "no goal bound",
                    ]

                    # A DSH host announces an agent: it shows up live, with the dock's
                    # choice and the goal LoopX binds to its session.
                    async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as host:
                        await host.send_message(frame("hello", {"token": TOKEN, "role": "dsh-host", "protocol": 1,
                                                                "capabilities": ["dock", "live", "events"]}))
                        assert json.loads(await host.get_message())["type"] == "welcome"
                        await host.send_message(frame("select", {"op": "create", "sessionId": "dsh-review"}, id="s1"))
                        assert json.loads(await host.get_message())["data"]["loop"] == "minimal-first"
                        await host.send_message(frame("live", {"items": [
                            {"type": "agent/created", "agentId": "dsh-review",
                             "data": {"source": "startup", "sessionId": "dsh-review", "cwd": str(loopx_project)}},
                            {"type": "agent/status", "agentId": "dsh-review", "data": {"status": "running"}},
                            {"type": "agent/inbox/inserted", "agentId": "dsh-review",
                             "data": {"message": {"id": "m1", "role": "user", "content": [], "source": {"kind": "user"}}}},
                        ]}))
                        await host.send_message(frame("events", {"items": [
                            {"sessionId": "dsh-review", "event": {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}},
                        ]}))

                        def dsh_row():
                            wait_for(lambda d: (r := row("dsh-review")) is not None and "Write the release notes" in r[8])
                            browser.save_screenshot(str(tmp_path / "console.png"))
                            return row("dsh-review")
                        assert await trio.to_thread.run_sync(dsh_row) == [
                            "dsh-review", "dsh", "minimal-first", "default", "running", "1", "1", "–",
                            "Write the release notes · active · 0/2",
                        ]
                        assert (tmp_path / "console.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

                        def filtered():
                            box = browser.find_element(By.ID, "filter")
                            box.send_keys("minimal")
                            wait_for(lambda d: row("writer-1") is None)
                            shown = [r for r in (row("dsh-review"),) if r]
                            count = browser.find_element(By.ID, "count").text
                            box.clear()
                            box.send_keys(" ")  # an input event with an empty needle: everything again
                            wait_for(lambda d: row("writer-1") is not None)
                            return len(shown), count
                        assert await trio.to_thread.run_sync(filtered) == (1, "1 of 2 agents")

                        # The agent ends: its row goes.
                        await host.send_message(frame("live", {"items": [
                            {"type": "agent/disposed", "agentId": "dsh-review", "data": {}}]}))
                        await trio.to_thread.run_sync(lambda: wait_for(lambda d: row("dsh-review") is None))
                    if os.environ.get("LOOPDOCK_DOCS_SCREENSHOTS"):  # refreshing docs/console.png
                        (ROOT / "docs" / "console.png").write_bytes((tmp_path / "console.png").read_bytes())
                    await writer.dispose()
                    nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(browser.quit)


WRITE = 'call: write_file {"path": "%s", "content": "hello"}'


async def test_the_console_answers_approval_questions_once_across_pages(tmp_path):
    browser = await trio.to_thread.run_sync(chromium, tmp_path / "chromium-profile")
    browser.set_window_size(1100, 400)
    try:
        with trio.fail_after(4 * PHASE):
            async with Runtime.open(tmp_path / "home") as rt:
                live = rt.subscribe_live()
                async with goalbar_service(rt) as service, trio.open_nursery() as nursery:
                    console = await compose_handlers(rt, service, tmp_path, nursery, live)
                    port = await nursery.start(functools.partial(serve_bridge, console, token=TOKEN))
                    work = tmp_path / "work"
                    work.mkdir()
                    handle = await rt.create_agent(session_id="careful-1", cwd=str(work),
                                                   agent_options={"approvals": {"default": "hints"}})
                    agent = handle.agent
                    url = f"http://127.0.0.1:{port}/console#token={TOKEN}"

                    def wait_for(predicate, timeout=60):
                        return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda d: predicate(d))

                    # The questions each page shows: [approval id, its text, Approve disabled?]
                    # (``page``: a page this one opened, reached through its window).
                    questions_js = """
                        const doc = arguments[0] ? window[arguments[0]].document : document;
                        return [...doc.querySelectorAll('#rows tr.approval[data-agent="careful-1"]')].map(tr =>
                            [tr.dataset.approval, tr.innerText.trim(), tr.querySelector('button.approve').disabled]);"""

                    def questions(page=None):
                        return browser.execute_script(questions_js, page)

                    def opened():
                        browser.get(url)
                        wait_for(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-status") == "live"
                                 and d.find_elements(By.CSS_SELECTOR, '#rows tr[data-agent="careful-1"]'))
                        return questions()
                    assert await trio.to_thread.run_sync(opened) == []

                    # 1. The question shows under its agent; Approve answers it: it goes, the call runs.
                    agent.followup(WRITE % "notes.txt")
                    [approval] = await agent.wait_approvals()

                    def shown():
                        wait_for(lambda d: questions())
                        browser.save_screenshot(str(tmp_path / "approval.png"))
                        return questions()
                    [(shown_id, text, disabled)] = await trio.to_thread.run_sync(shown)
                    assert shown_id == approval.id and not disabled
                    assert "write_file" in text and '"path": "notes.txt"' in text, text
                    assert "write_file is not declared read-only" in text, text
                    assert (work / "notes.txt").exists() is False  # the turn waits for the click

                    def approve():
                        browser.find_element(
                            By.CSS_SELECTOR, f'tr.approval[data-approval="{approval.id}"] button.approve').click()
                        wait_for(lambda d: questions() == [])
                    await trio.to_thread.run_sync(approve)
                    await agent.wait_idle()
                    assert (work / "notes.txt").read_text() == "hello"
                    events = await agent.session.read_events()
                    assert [e.data for e in events if e.type == "approval/answered"] == [
                        {"id": approval.id, "decision": "approve"}]
                    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed"]

                    # 2. Two pages, one question: both click Approve in the same instant (one
                    # script, before either hears back); one wins, the other clicked a stale
                    # button and shows APPROVAL_CLOSED; the question leaves both.
                    def second_page():
                        browser.execute_script("window.pageB = window.open(arguments[0], 'pageB')", url)
                        wait_for(lambda d: d.execute_script(
                            "const b = window.pageB; return b && b.document.body && b.document.body.dataset.status")
                            == "live")
                    await trio.to_thread.run_sync(second_page)
                    assert len(browser.window_handles) == 2
                    agent.followup(WRITE % "second.txt")
                    [second] = await agent.wait_approvals()

                    def race():
                        wait_for(lambda d: questions() and questions("pageB"))
                        assert [q[0] for q in questions()] == [q[0] for q in questions("pageB")] == [second.id]
                        disabled = browser.execute_script("""
                            const sel = 'tr.approval[data-approval="' + arguments[0] + '"] button.approve';
                            const pages = [document, window.pageB.document];
                            pages.forEach(doc => doc.querySelector(sel).click());
                            return pages.map(doc => doc.querySelector(sel).disabled);""", second.id)
                        wait_for(lambda d: questions() == [] and questions("pageB") == [])
                        notices_js = """return [document, window.pageB.document].map(doc =>
                            [...doc.querySelectorAll('#notices li')].map(li => li.innerText));"""
                        wait_for(lambda d: sum(map(len, d.execute_script(notices_js))) == 1)
                        statuses = browser.execute_script(
                            "return [document, window.pageB.document].map(doc => doc.body.dataset.status)")
                        browser.save_screenshot(str(tmp_path / "closed.png"))
                        return disabled, browser.execute_script(notices_js), statuses
                    disabled, notices, statuses = await trio.to_thread.run_sync(race)
                    assert disabled == [True, True]  # each button, once clicked, waits for its result
                    [notice] = [n for page in notices for n in page]
                    assert f"Answer to {second.id} of careful-1 failed: APPROVAL_CLOSED" in notice, notice
                    assert statuses == ["live", "live"]  # a typed error on the page, not a broken page
                    await agent.wait_idle()
                    assert (work / "second.txt").read_text() == "hello"
                    assert [e.data for e in await agent.session.read_events()
                            if e.type == "approval/answered" and e.data["id"] == second.id] == [
                        {"id": second.id, "decision": "approve"}]
                    assert (tmp_path / "closed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

                    # 3. Refuse asks for a reason; the model reads it as the call's error.
                    agent.followup(WRITE % "third.txt")
                    [third] = await agent.wait_approvals()

                    def refuse():
                        wait_for(lambda d: [q[0] for q in questions()] == [third.id])
                        row = f'tr.approval[data-approval="{third.id}"]'
                        browser.find_element(By.CSS_SELECTOR, f"{row} button.refuse").click()
                        box = wait_for(lambda d: d.find_element(By.CSS_SELECTOR, f"{row} input.reason"))
                        box.send_keys("not that file", Keys.ENTER)
                        wait_for(lambda d: questions() == [])
                    await trio.to_thread.run_sync(refuse)
                    await agent.wait_idle()
                    assert not (work / "third.txt").exists()
                    results = [(b.content, b.is_error) for m in await agent.read_transcript() if m.role == "tool"
                               for b in m.content]
                    assert results[-1] == ("refused by a person: not that file", True)
                    await handle.dispose()
                    nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(browser.quit)


async def _page_server(page: str, *, task_status=trio.TASK_STATUS_IGNORED):
    """Serves ``page`` for a plain GET and never answers a websocket handshake: the page
    stays connecting for as long as the test looks."""
    body = (ROOT / "bridge" / page).read_bytes()

    async def handle(stream):
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await stream.receive_some()
            if not chunk:
                return
            head += chunk
        if b"upgrade: websocket" in head.lower():
            await trio.sleep_forever()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                              b"Connection: close\r\n\r\n" % len(body) + body)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def test_the_pages_show_a_skeleton_while_connecting_a_refused_token_and_a_lost_runtime(tmp_path):
    browser = await trio.to_thread.run_sync(chromium, tmp_path / "chromium-profile")
    try:
        with trio.fail_after(4 * PHASE):
            async with trio.open_nursery() as nursery:
                def wait_for(predicate, timeout=60):
                    return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda d: predicate(d))

                def state():
                    body = browser.find_element(By.TAG_NAME, "body")
                    return body.get_attribute("data-status"), browser.find_element(By.ID, "status").text

                # 1. connecting: an outline of what is coming, never a blank page
                for page, path, skeleton in (("goalbar/index.html", "/goalbar?session=s1", "skeleton"),
                                             ("console/index.html", "/console", "rows")):
                    port = await nursery.start(_page_server, page)

                    def connecting(path=path, port=port, skeleton=skeleton):
                        browser.get(f"http://127.0.0.1:{port}{path}#token={TOKEN}")
                        wait_for(lambda d: d.find_element(By.ID, skeleton).is_displayed())
                        shown = browser.find_elements(By.CSS_SELECTOR, f"#{skeleton} span")
                        return state(), len(shown) > 0 and shown[0].is_displayed()
                    (status, text), outlined = await trio.to_thread.run_sync(connecting)
                    assert status == "connecting" and text.startswith("Connecting") and outlined, (page, status, text)

                # 2. a wrong token: said plainly, and the page stops there
                async with Runtime.open(tmp_path / "home") as rt:
                    live = rt.subscribe_live()
                    async with goalbar_service(rt) as service, trio.open_nursery() as inner:
                        console = await compose_handlers(rt, service, tmp_path, inner, live)
                        scope = trio.CancelScope()

                        async def serve(task_status=trio.TASK_STATUS_IGNORED):
                            with scope:
                                await serve_bridge(console, token=TOKEN, task_status=task_status)
                        port = await inner.start(serve)
                        for path in ("/goalbar?session=s1", "/console"):
                            def refused(path=path):
                                browser.get(f"http://127.0.0.1:{port}{path}#token=not-the-token")
                                wait_for(lambda d: state()[0] == "refused")
                                return state()[1]
                            assert "refused this page's token" in await trio.to_thread.run_sync(refused)

                        # 3. the runtime goes away under an open page: it says so, and retries
                        def live_page():
                            # (a query of its own: a change of the fragment alone would not reload)
                            browser.get(f"http://127.0.0.1:{port}/console?again=1#token={TOKEN}")
                            wait_for(lambda d: state()[0] == "live")
                        await trio.to_thread.run_sync(live_page)
                        scope.cancel()
                        text = await trio.to_thread.run_sync(lambda: wait_for(
                            lambda d: state()[0] == "error" and state()[1]))
                        assert text.startswith(f"Cannot reach the runtime at 127.0.0.1:{port}"), text
                        inner.cancel_scope.cancel()
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(browser.quit)
