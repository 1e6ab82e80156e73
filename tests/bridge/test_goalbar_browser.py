"""The GoalBar page in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium), against the bridge and the REAL loopx CLI.

Selenium is synchronous, so every browser step runs in a worker thread while trio serves
the bridge. Waits are selenium's explicit waits on what the page shows (no sleeps). A
double click on Start or Pause is one LoopX mutation (the page sends one request per
action; the service joins identical ones)."""

import functools
import shutil

import pytest
import trio
from selenium import webdriver  # the test extra installs it
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from loopdock.bridge._goalbar import GoalBarHandler, GoalBarService
from loopdock.bridge._server import serve_bridge
from loopdock.runtime.loopx import HOST_SURFACE, LifecycleResult, LoopxClient, LoopxOk

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
