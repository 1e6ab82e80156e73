"""The GoalBar page in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium), against the bridge and the REAL loopx CLI.

Selenium is synchronous, so every browser step runs in a worker thread while trio serves
the bridge. Waits are selenium's explicit waits on what the page shows (no sleeps). A
double click on Start or Pause is one LoopX mutation (the page sends one request per
action; the service joins identical ones)."""

import functools
import json
import shutil
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest
import trio
from selenium import webdriver  # the test extra installs it
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from loopdock.bridge._goalbar import GoalBarHandler, GoalBarService
from loopdock.bridge._server import serve_bridge
from loopdock.runtime import Changes
from loopdock.runtime.loopx import HOST_SURFACE, LifecycleResult, LoopxClient, LoopxOk, TransportFailure

TOKEN = "goalbar-browser-token"
SESSION = "dsh-session-browser-1"
PHASE = 90
# Longer than the bar has room for: the page cuts it with an ellipsis, the tooltip has it all.
OBJECTIVE = ("Ship the GoalBar page: show the bound goal's text, its lifecycle state and the agent "
             "lane's progress, with Start and Pause")


def chromium(profile_dir):
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        pytest.fail("Debian's chromium and chromium-driver are needed: rerun scripts/test", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    # Nothing may leave this machine: no background networking, updates, sync or QUIC,
    # and a fresh profile.
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=900,200", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-quic", "--no-first-run", "--disable-default-apps",
                f"--user-data-dir={profile_dir}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


class CountingClient(LoopxClient):
    """The real client, recording each lifecycle mutation it runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.executed: list[str] = []

    async def goal_lifecycle(self, goal_id, operation, *, execute):
        if execute:
            self.executed.append(operation)
        return await super().goal_lifecycle(goal_id, operation, execute=execute)


async def ok(client, *args):
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)
    return result.payload


async def lifecycle_state(client, goal_id):
    preview = await client.goal_lifecycle(goal_id, "stop", execute=False)
    assert isinstance(preview, LifecycleResult)
    return preview.before_state


async def test_the_page_shows_the_bar_and_pause_start_change_loopx(
    loopx_command, loopx_project, loopx_env, loopx_runtime_root, tmp_path
):
    client = CountingClient(loopx_command, project=loopx_project, env=loopx_env, timeout=60,
                            runtime_root=loopx_runtime_root)
    goal, agent = "goal-page", "agent-page"
    with trio.fail_after(PHASE):
        await ok(client, "bootstrap", "--project", ".", "--goal-id", goal, "--objective", OBJECTIVE,
                 "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
        await ok(client, "register-agent", "--goal-id", goal, "--agent-id", agent, "--require-new", "--execute")
        for text in ("[P0] One", "[P1] Two"):
            await ok(client, "todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent",
                     "--claimed-by", agent, "--task-class", "advancement_task", "--text", text)
        await ok(client, "bind-agent-thread", "--goal-id", goal, "--thread-id", SESSION,
                 "--host-surface", HOST_SURFACE, "--agent-id", agent, "--execute")

    browser = await trio.to_thread.run_sync(chromium, tmp_path / "chromium-profile")
    try:
        with trio.fail_after(8 * PHASE):
            async with GoalBarService.open(lambda project: client) as bar, trio.open_nursery() as nursery:
                handler = GoalBarHandler(bar, lambda session_id: loopx_project, nursery)
                port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
                base = f"http://127.0.0.1:{port}/goalbar"

                def wait_for(predicate, timeout=3 * PHASE):
                    return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda d: predicate(d))

                def text(element_id):
                    return browser.find_element(By.ID, element_id).text

                # An unbound session: the bar stays hidden.
                def unbound():
                    browser.get(f"{base}?session=dsh-session-nobody#token={TOKEN}")
                    wait_for(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-status") == "hidden")
                    return browser.find_element(By.ID, "goalbar").is_displayed()
                assert await trio.to_thread.run_sync(unbound) is False

                # The bound session: the bar with its counts; a screenshot as an artifact.
                def bound():
                    browser.get(f"{base}?session={SESSION}#token={TOKEN}")
                    wait_for(lambda d: d.find_element(By.ID, "goalbar").is_displayed()
                             and text("lifecycle") == "active")
                    browser.save_screenshot(str(tmp_path / "goalbar.png"))
                    return (text("counts"), text("pause"), browser.find_element(By.ID, "start").is_displayed(),
                            browser.find_element(By.ID, "progress").get_attribute("max"))
                assert await trio.to_thread.run_sync(bound) == ("0 done / 2 open / 2", "Pause", False, "2")
                assert (tmp_path / "goalbar.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

                # The goal's text from LoopX: whole in the element (what a screen reader
                # reads), cut to one line on screen, whole in the tooltip with the ids.
                def goal_text():
                    goal = browser.find_element(By.ID, "goal")
                    return {
                        "text": goal.get_attribute("textContent"),
                        "title": goal.get_attribute("title"),
                        "source": goal.get_attribute("data-source"),
                        "cut": browser.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth", goal),
                        "label": browser.find_element(By.ID, "goal-label").get_attribute("textContent"),
                        "focusable": goal.get_attribute("tabindex") == "0",
                    }
                assert await trio.to_thread.run_sync(goal_text) == {
                    "text": OBJECTIVE, "title": f"{OBJECTIVE}\ngoal {goal} · agent {agent}", "source": "text",
                    "cut": True, "label": "Goal:", "focusable": True,
                }

                # Pause from the keyboard: the verified state shows, and Start instead of Pause.
                def settled(d):  # the click was answered (the pushed state may come first)
                    return d.find_element(By.TAG_NAME, "body").get_attribute("data-status") == "visible"

                def pause():
                    browser.find_element(By.ID, "pause").send_keys(" ")  # a focused button activates on space
                    wait_for(lambda d: text("lifecycle") == "stopped" and settled(d))
                    return text("start"), browser.find_element(By.ID, "pause").is_displayed()
                assert await trio.to_thread.run_sync(pause) == ("Start", False)
                assert await lifecycle_state(client, goal) == "stopped"

                # A double click is one Start, and then one Pause: one mutation each.
                def double_click(button, state):
                    ActionChains(browser).double_click(browser.find_element(By.ID, button)).perform()
                    wait_for(lambda d: text("lifecycle") == state and settled(d)
                             and not d.find_element(By.ID, button).is_displayed())
                await trio.to_thread.run_sync(double_click, "start", "active")
                assert await lifecycle_state(client, goal) == "active"
                await trio.to_thread.run_sync(double_click, "pause", "stopped")
                assert await lifecycle_state(client, goal) == "stopped"
                assert client.executed == ["stop", "resume", "stop"]
                assert bar.actor_stats(SESSION, loopx_project)["mutations"] == 3
                assert len(bar.locks) == 0
                await trio.to_thread.run_sync(browser.save_screenshot, str(tmp_path / "goalbar-stopped.png"))
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(browser.quit)


# -- Failing closed: locks, read faults, malformed frames, no-op mutations, warnings ---------
#
# Each test below opens one page on one bound goal. The source poll is off (an hour), so
# what the page shows changes only through what the test does: a click, a wake, a Refresh,
# a frame it injects. A probe installed before the page's own script records the page's
# websockets, the frames it sends and any uncaught error.

PROBE = """
(() => {
  const Real = window.WebSocket;
  window.__sockets = []; window.__sent = []; window.__errors = [];
  window.addEventListener("error", (event) => window.__errors.push(String(event.message)));
  window.WebSocket = class extends Real {
    constructor(...args) { super(...args); window.__sockets.push(this); }
    send(data) { window.__sent.push(JSON.parse(data)); return super.send(data); }
  };
})();
"""
QUICK = 60  # a wait for something the page shows within a CLI call or two


class ControlledClient(LoopxClient):
    """The real client, recording each lifecycle mutation, with faults a test switches on:
    reads that get no answer from LoopX (``reads_fail``, or from the next verified
    mutation on), mutations that LoopX leaves unverified (previews), and a gate that holds
    a mutation until the test opens it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.executed: list[str] = []
        self.reads_fail = False
        self.fail_reads_after_execute = False
        self.unverified = False
        self.gate: trio.Event | None = None
        self.executing = trio.Event()

    async def resolve_thread(self, thread_id):
        if self.reads_fail:
            return TransportFailure("no answer from loopx (the test cut it off)", "exit")
        return await super().resolve_thread(thread_id)

    async def goal_lifecycle(self, goal_id, operation, *, execute):
        if not execute:
            return await super().goal_lifecycle(goal_id, operation, execute=False)
        self.executed.append(operation)
        self.executing.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.unverified:  # LoopX's answer then says readback: not_executed
            return await super().goal_lifecycle(goal_id, operation, execute=False)
        result = await super().goal_lifecycle(goal_id, operation, execute=True)
        if self.fail_reads_after_execute:
            self.reads_fail = True
        return result


class StubContinuation:
    """What the GoalBar asks of a session's LoopX continuation, and nothing more; telling
    it about a Start (``start``) or a Pause (``paused``) can be made to fail."""

    def __init__(self):
        self.agent = SimpleNamespace(status="idle")
        self.activation = SimpleNamespace(active=True)
        self.status = None
        self.fail_start = False
        self.fail_paused = False

    @asynccontextmanager
    async def hold(self):
        yield

    def paused(self, reason):
        if self.fail_paused:
            raise RuntimeError("the continuation is gone")

    def request(self):
        pass

    async def start(self):
        if self.fail_start:
            raise RuntimeError("the continuation is gone")


class StubContinuations:
    def __init__(self, continuation):
        self.changes = Changes()
        self._continuation = continuation

    def continuation(self, session_id):
        return self._continuation if session_id == SESSION else None

    def status(self, session_id):
        continuation = self.continuation(session_id)
        return None if continuation is None else continuation.status

    @asynccontextmanager
    async def live(self, session_id):
        yield self.continuation(session_id)


class Page:
    """One GoalBar page in Chromium. Its methods are synchronous (selenium): call them
    through ``trio.to_thread.run_sync``."""

    def __init__(self, browser, url):
        self.browser = browser
        self.url = url

    def wait_for(self, predicate, timeout=QUICK):
        return WebDriverWait(self.browser, timeout, poll_frequency=0.1).until(lambda d: predicate())

    def element(self, element_id):
        return self.browser.find_element(By.ID, element_id)

    def text(self, element_id):
        return self.element(element_id).text

    def attr(self, element_id, name):
        return self.element(element_id).get_attribute(name)

    def status(self):
        return self.browser.find_element(By.TAG_NAME, "body").get_attribute("data-status")

    def js(self, script, *args):
        return self.browser.execute_script(script, *args)

    def sent(self, frame_type):
        return self.js("return window.__sent.filter((f) => f.type === arguments[0]).length", frame_type)

    def errors(self):
        return self.js("return window.__errors")

    def open(self, lifecycle="active"):
        self.browser.get(self.url)
        self.wait_for(lambda: self.element("goalbar").is_displayed() and self.text("lifecycle") == lifecycle
                      and self.status() == "visible", timeout=3 * PHASE)

    def fresh(self, lifecycle):
        """The bar shows a good read: this lifecycle state, not stale, not locked, no action out."""
        return (self.element("goalbar").is_displayed() and self.text("lifecycle") == lifecycle
                and self.attr("goalbar", "data-stale") == "false" and self.attr("goalbar", "data-locked") == "false"
                and self.status() == "visible")

    def refresh(self, lifecycle):
        self.element("refresh").click()
        self.wait_for(lambda: self.fresh(lifecycle))
        return self.element("refresh").is_displayed()

    def inject(self, data):
        """Hand the page a frame as if the runtime had sent it (its own message handler)."""
        self.js("window.__sockets.at(-1).dispatchEvent(new MessageEvent('message', {data: arguments[0]}))", data)


@asynccontextmanager
async def goalbar_page(client, loopx_project, tmp_path, *, todos=("[P0] One", "[P1] Two"), continuations=None):
    """A bound goal with ``todos``; the bridge serving the GoalBar for it; a page."""
    goal, agent = "goal-page", "agent-page"
    with trio.fail_after(PHASE):
        await ok(client, "bootstrap", "--project", ".", "--goal-id", goal, "--objective", OBJECTIVE,
                 "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
        await ok(client, "register-agent", "--goal-id", goal, "--agent-id", agent, "--require-new", "--execute")
        for text in todos:
            await ok(client, "todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent",
                     "--claimed-by", agent, "--task-class", "advancement_task", "--text", text)
        await ok(client, "bind-agent-thread", "--goal-id", goal, "--thread-id", SESSION,
                 "--host-surface", HOST_SURFACE, "--agent-id", agent, "--execute")
    browser = await trio.to_thread.run_sync(chromium, tmp_path / "chromium-profile")
    try:
        await trio.to_thread.run_sync(browser.execute_cdp_cmd, "Page.addScriptToEvaluateOnNewDocument",
                                      {"source": PROBE})
        async with GoalBarService.open(lambda project: client, poll_interval=3600,
                                       continuations=continuations) as bar, trio.open_nursery() as nursery:
            handler = GoalBarHandler(bar, lambda session_id: loopx_project, nursery)
            port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
            page = Page(browser, f"http://127.0.0.1:{port}/goalbar?session={SESSION}#token={TOKEN}")
            yield page, bar, goal
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(browser.quit)


@pytest.fixture
def controlled(loopx_command, loopx_project, loopx_env, loopx_runtime_root):
    return ControlledClient(loopx_command, project=loopx_project, env=loopx_env, timeout=60,
                            runtime_root=loopx_runtime_root)


async def test_a_failed_or_unknown_action_result_stays_locked_until_refresh(controlled, loopx_project, tmp_path):
    client = controlled
    async with goalbar_page(client, loopx_project, tmp_path) as (page, bar, goal):
        with trio.fail_after(8 * PHASE):
            await trio.to_thread.run_sync(page.open)

            # A Pause LoopX does not verify: failed. The bar says so and locks Start/Pause.
            client.unverified = True

            def failed_pause():
                page.element("pause").click()
                page.wait_for(lambda: page.attr("goalbar", "data-locked") == "true" and page.status() == "visible")
                return (page.text("error"), page.element("pause").is_enabled(), page.element("refresh").is_displayed())
            error, enabled, refresh_shown = await trio.to_thread.run_sync(failed_pause)
            assert error.startswith("Pause failed: stop was not verified by LoopX.") and "Refresh" in error
            assert (enabled, refresh_shown) == (False, True)

            # A second click sends nothing (the disabled button fires no click, and the
            # page's own guard holds too).
            def second_click():
                page.js("document.getElementById('pause').click()")
                page.js("document.getElementById('pause').disabled = false; document.getElementById('pause').click()")
                return page.sent("goalbarPause")
            assert await trio.to_thread.run_sync(second_click) == 1

            # Refresh: a fresh read lifts the lock.
            client.unverified = False
            assert await trio.to_thread.run_sync(page.refresh, "active") is False
            assert await trio.to_thread.run_sync(lambda: page.element("pause").is_enabled()) is True
            assert bar.actor_stats(SESSION, loopx_project)["mutations"] == 1
            assert client.executed == ["stop"]

            # An unknown result: the connection drops while a Pause runs in the runtime.
            client.gate = trio.Event()
            client.executing = trio.Event()
            await trio.to_thread.run_sync(lambda: page.element("pause").click())
            await client.executing.wait()  # the runtime is executing that Pause

            def connection_lost():
                page.js("window.__sockets.at(-1).close()")
                # The page reconnects by itself and shows the bar again (the runtime's Pause
                # still running: pending), locked: it cannot know what came of its click.
                page.wait_for(lambda: page.js("return window.__sockets.length") == 2
                              and page.status() == "pending" and page.attr("goalbar", "data-locked") == "true")
                return page.text("error")
            assert "the connection to the runtime was lost before its answer" in await trio.to_thread.run_sync(
                connection_lost)
            client.gate.set()

            def after_the_pause():
                # The Pause ran to its end in the runtime; the page shows it, still locked.
                page.wait_for(lambda: page.text("lifecycle") == "stopped" and page.status() == "visible")
                page.js("document.getElementById('start').click()")
                return (page.element("start").is_displayed(), page.element("start").is_enabled(),
                        page.sent("goalbarStart"), page.attr("goalbar", "data-locked"))
            assert await trio.to_thread.run_sync(after_the_pause) == (True, False, 0, "true")
            assert await trio.to_thread.run_sync(page.refresh, "stopped") is False
            assert await trio.to_thread.run_sync(lambda: page.element("start").is_enabled()) is True
            assert client.executed == ["stop", "stop"]
            assert await lifecycle_state(client, goal) == "stopped"
            assert await trio.to_thread.run_sync(page.errors) == []


async def test_a_read_fault_after_a_good_read_keeps_the_last_row_marked_stale(controlled, loopx_project, tmp_path):
    client = controlled
    async with goalbar_page(client, loopx_project, tmp_path) as (page, bar, goal):
        with trio.fail_after(6 * PHASE):
            await trio.to_thread.run_sync(page.open)
            # LoopX stops answering; a session event asks for a re-read.
            client.reads_fail = True
            assert bar.wake(SESSION) == 1

            def stale():
                page.wait_for(lambda: page.attr("goalbar", "data-stale") == "true")
                return {
                    "shown": page.element("goalbar").is_displayed(),
                    "status": page.status(),
                    "fault": page.text("fault"),
                    "row": (page.text("lifecycle"), page.text("counts")),
                    "actions": (page.element("pause").is_enabled(), page.element("refresh").is_displayed()),
                }
            shown = await trio.to_thread.run_sync(stale)
            assert shown["shown"] is True and shown["status"] == "stale"
            assert shown["fault"].startswith("Stale: LoopX could not be read") and "last good read" in shown["fault"]
            assert shown["row"] == ("active", "0 done / 2 open / 2")
            assert shown["actions"] == (False, True)  # nothing goes out from a stale row

            # LoopX answers again: Refresh shows a good read.
            client.reads_fail = False
            assert await trio.to_thread.run_sync(page.refresh, "active") is False
            assert await trio.to_thread.run_sync(page.errors) == []


async def test_a_malformed_frame_is_shown_as_a_read_fault_never_drawn(controlled, loopx_project, tmp_path):
    client = controlled
    async with goalbar_page(client, loopx_project, tmp_path) as (page, bar, goal):
        with trio.fail_after(6 * PHASE):
            await trio.to_thread.run_sync(page.open)

            def good_state():
                return json.loads(page.browser.find_element(By.TAG_NAME, "body").get_attribute("data-state"))
            good = await trio.to_thread.run_sync(good_state)
            assert good["total"] == 2

            def shown_after(data):
                page.inject(data)
                page.wait_for(lambda: page.attr("goalbar", "data-stale") == "true")
                return (page.text("fault"), page.text("counts"), page.text("lifecycle"), page.status(),
                        page.element("pause").is_enabled(), page.errors())

            def frame(state):
                return json.dumps({"v": 1, "type": "goalbar", "data": {} if state is None else {"state": state}})

            cases = [
                (frame(None), "without a state"),
                (frame({**good, "total": "many"}), "counts that are not whole numbers"),
                (frame({**good, "processed": 5}), "counts that do not add up"),
                (frame({k: v for k, v in good.items() if k != "lifecycleState"}), "without a lifecycle state"),
                (frame({**good, "sessionId": "another-session"}), "a state for another session"),
                (frame({**good, "kind": "sideways"}), "a state of an unknown kind"),
                (json.dumps({"v": 1, "type": "goalbar", "data": {"state": None}})[:-3], "not JSON"),
                (json.dumps([1, 2]), "a malformed frame"),
            ]
            for data, why in cases:
                fault, counts, lifecycle, status, pause, errors = await trio.to_thread.run_sync(shown_after, data)
                assert why in fault and fault.startswith("Stale: the runtime sent"), (why, fault)
                # The last good row, as it was: nothing of the bad frame is drawn.
                assert (counts, lifecycle, status, pause, errors) == ("0 done / 2 open / 2", "active", "stale", False, [])
                assert await trio.to_thread.run_sync(page.refresh, "active") is False


async def test_pause_on_a_goal_already_stopped_runs_no_lifecycle_execute(controlled, loopx_project, tmp_path):
    client = controlled
    async with goalbar_page(client, loopx_project, tmp_path) as (page, bar, goal):
        with trio.fail_after(6 * PHASE):
            await trio.to_thread.run_sync(page.open)
            # Stopped elsewhere (the CLI, from a shell); the page still shows it active.
            await ok(client, "goal-lifecycle", "--goal-id", goal, "--operation", "stop", "--actor-kind", "owner",
                     "--execute")

            def pause():
                page.element("pause").click()
                page.wait_for(lambda: page.text("lifecycle") == "stopped" and page.status() == "visible")
                return page.text("notice"), page.attr("goalbar", "data-locked")
            assert await trio.to_thread.run_sync(pause) == ("The goal is already paused.", "false")
            assert client.executed == []  # refused on LoopX's preview: no --execute at all
            assert bar.actor_stats(SESSION, loopx_project)["mutations"] == 1
            assert await lifecycle_state(client, goal) == "stopped"


async def test_driver_sync_and_post_read_failures_are_distinct_warnings(controlled, loopx_project, tmp_path):
    client = controlled
    continuation = StubContinuation()
    async with goalbar_page(client, loopx_project, tmp_path, continuations=StubContinuations(continuation)) as (
        page, bar, goal
    ):
        with trio.fail_after(10 * PHASE):
            await trio.to_thread.run_sync(page.open)

            def act(button, lifecycle, *, locked="false", stale="false"):
                page.element(button).click()
                page.wait_for(lambda: page.sent("goalbar" + button.capitalize()) >= 1
                              and page.attr("goalbar", "data-locked") == locked
                              and page.attr("goalbar", "data-stale") == stale
                              and page.status() in ("visible", "stale") and page.text("lifecycle") == lifecycle)
                warnings = page.browser.find_elements(By.CSS_SELECTOR, "#warnings .warning")
                return [(w.get_attribute("data-code"), w.text) for w in warnings]

            # Pause, and LoopX stopped the goal, but the continuation could not be told.
            continuation.fail_paused = True
            [(code, paused_text)] = await trio.to_thread.run_sync(act, "pause", "stopped")
            assert code == "driver-sync-failed"
            assert paused_text.startswith("Paused in LoopX, but this session's continuation could not be told")
            continuation.fail_paused = False

            # Start, and LoopX resumed the goal, but the bar cannot be read back: the last
            # row, stale, locked until Refresh.
            client.fail_reads_after_execute = True
            [(code, post_read_text)] = await trio.to_thread.run_sync(
                functools.partial(act, "start", "stopped", locked="true", stale="true"))
            assert code == "post-read-failed"
            assert post_read_text.startswith("Started in LoopX, but the bar could not be read back afterwards")
            client.fail_reads_after_execute = client.reads_fail = False
            assert await trio.to_thread.run_sync(page.refresh, "active") is False
            assert await trio.to_thread.run_sync(
                lambda: page.browser.find_elements(By.CSS_SELECTOR, "#warnings .warning")) == []

            # Pause again, then Start: LoopX resumed it, but the continuation could not be
            # re-armed. The bar is read back fine, so nothing is locked.
            assert await trio.to_thread.run_sync(act, "pause", "stopped") == []
            continuation.fail_start = True
            [(code, start_text)] = await trio.to_thread.run_sync(act, "start", "active")
            assert code == "driver-sync-failed"
            assert start_text.startswith("Started in LoopX, but this session's continuation could not be re-armed")
            assert await trio.to_thread.run_sync(lambda: page.element("pause").is_enabled()) is True

            # Three different texts: nobody mistakes one case for another.
            assert len({paused_text, post_read_text, start_text}) == 3
            assert client.executed == ["stop", "resume", "stop", "resume"]
            assert await lifecycle_state(client, goal) == "active"
            assert await trio.to_thread.run_sync(page.errors) == []
