"""README's walkthrough, run as written: ``loopdock serve`` in one shell, the other block in
another, with the environment the README's Install block exports (its ``export`` lines;
``pip install`` is what scripts/test did already, and Node 22 is the one it installed). The
only change: the port 8765 becomes a free one. Real everything: the `dsh` host (profile
installed by ``dsh-install``), the LoopX CLI on Node 22, Chromium for the GoalBar page.
Offline: temporary HOME (so ``~/.dsh`` and ``~/.loopdock`` are in it), telemetry off, the
ping model, loopback only."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio
from line_reader import Lines
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from trio_websocket import open_websocket

from tests.bridge.test_goalbar_browser import chromium

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PHASE = 240


def sh_blocks(after: str) -> list[str]:
    section = README.split(after, 1)[1]
    return re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)


def install_exports() -> str:
    install = sh_blocks("## Install")[0]
    return "".join(line + "\n" for line in install.splitlines() if line.startswith("export "))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_the_walkthrough_takes_a_dsh_session_to_its_goals_goalbar(tmp_path, node22_bin):
    serve_block, client_block = sh_blocks("## A real DeepSeek Harness host")[:2]
    assert serve_block.strip() == "loopdock serve --port 8765"
    port = free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home), "PATH": os.pathsep.join([str(node22_bin), str(Path(sys.executable).parent), "/usr/bin:/bin"]),
        "LOOPX_USAGE_PING": "0", "DSH_TELEMETRY_OTLP_URL": "http://127.0.0.1:9/v1/logs", "LANG": "C.UTF-8",
    }
    prelude = "set -euo pipefail\n" + install_exports()

    def script(block: str) -> list[str]:
        return ["bash", "-c", prelude + block.replace("8765", str(port))]

    with trio.fail_after(3 * PHASE):
        serve = await trio.lowlevel.open_process(script(serve_block), cwd=tmp_path, env=env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = Lines(serve.stdout, PHASE), Lines(serve.stderr, PHASE)
            await out.until(rf"^loopdock serve: ws://127\.0\.0\.1:{port} ")
            console = (await out.until("console: ")).split("console: ", 1)[1]

            done = await trio.run_process(script(client_block), cwd=tmp_path, env=env, capture_stdout=True,
                                          capture_stderr=True, check=False)
            said = done.stdout.decode()
            assert done.returncode == 0, (said, done.stderr.decode()[-3000:])
            assert "verified with dsh --dump-config: plugin row loopdock-bridge" in said
            assert "\npong: " in said, said  # dsh headless printed the ping model's answer
            url = said.strip().splitlines()[-1]
            session = re.search(r"goalbar\?session=([^#]+)#token=", url)[1]
            assert f"{session} (dsh): loop standard on driver default; completed; 1 turns" in said
            assert f"bound session {session} to goal release-notes" in said
            # serve said what happened: the decision, the session's start and end
            assert f"session_id='{session}'" in await err.until(r"loop decision")
            assert "origin='dsh'" in await err.until(rf"session start.*session_id='{session}'")
            await err.until(rf"session end.*session_id='{session}'")

            # the GoalBar at the printed URL, in a real browser: the goal and the lane's todos
            browser = await trio.to_thread.run_sync(chromium, tmp_path / "chromium-profile")
            try:
                def goalbar():
                    browser.get(url)
                    WebDriverWait(browser, 120, poll_frequency=0.1).until(
                        lambda d: d.find_element(By.ID, "goalbar").is_displayed())
                    return (browser.find_element(By.ID, "goal").get_attribute("textContent"),
                            browser.find_element(By.ID, "counts").text)
                assert await trio.to_thread.run_sync(goalbar) == ("Ship the release notes", "0 done / 2 open / 2")
            finally:
                await trio.to_thread.run_sync(browser.quit)

            # and the console URL serve printed is served, with the same token
            token = console.split("#token=", 1)[1]
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                hello = {"token": token, "role": "goalbar", "protocol": 1, "capabilities": ["live", "console"]}
                await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": hello}))
                assert json.loads(await ws.get_message())["type"] == "welcome"

            serve.send_signal(signal.SIGTERM)
            assert await serve.wait() == 0
        finally:
            if serve.returncode is None:
                serve.kill()
                await serve.wait()
