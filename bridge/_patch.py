"""The DSH patch file that loads loopdock's bridge plugin: ``loopdock dsh-patch``.

    dsh headless --patch DIR/patch.yml "task"     # --patch before the app's own flags

The patch inserts ``bridge/dsh_plugin/index.mjs`` (by absolute path) with its config (the
runtime's URL and token, dock mode and drivers, the ping adapter, the owned source kinds).
In dock mode it also disables DSH's own ``agent-loop`` row (the plugin re-hosts it as the
``default`` driver); with ``ping`` it makes ``ping/ping-1`` DSH's default model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import yaml

from runtime._home import resolve_home

from ._token import load_or_create_token

PLUGIN_PATH = Path(__file__).resolve().parent / "dsh_plugin" / "index.mjs"
PLUGIN_ID = "loopdock-bridge"
PATCH_FILE = "patch.yml"
DEFAULT_OWNED_KINDS = ("loopx-continuation",)
DSH_ENDPOINT = "/dsh"


def patch_rows(
    url: str,
    token: str,
    *,
    dock: bool = False,
    drivers: Sequence[str] = ("default",),
    ping: bool = False,
    owned_kinds: Sequence[str] = DEFAULT_OWNED_KINDS,
    extra: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The patch as YAML-ready rows; ``extra`` adds plugin config keys (e.g. the tests'
    ``createAgents``/``resumeAgents``)."""
    if not url.startswith(("ws://", "wss://")):
        raise ValueError(f"the bridge URL must be ws:// or wss://, got {url!r}")
    if urlsplit(url).path in ("", "/"):
        url = url.rstrip("/") + DSH_ENDPOINT  # the DSH host's endpoint
    if not drivers:
        raise ValueError("dock mode needs at least one driver")
    config: dict[str, Any] = {
        "url": url,
        "token": token,
        "dock": dock,
        "drivers": list(drivers),
        "ping": ping,
        "ownedKinds": list(owned_kinds),
    }
    config.update(extra or {})
    rows: list[dict[str, Any]] = []
    if ping:
        rows.append({"id": "agent-default-model", "config": {"provider": "ping", "model": "ping-1"}})
    if dock:
        rows.append({"id": "agent-loop", "disabled": True})
    rows.append({"insert": [{"id": PLUGIN_ID, "name": str(PLUGIN_PATH), "config": config}]})
    return rows


def write_patch(out_dir: str | Path, url: str, token: str, **options: Any) -> Path:
    """Write ``out_dir/patch.yml`` (private: it holds the token) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / PATCH_FILE
    text = yaml.safe_dump(patch_rows(url, token, **options), sort_keys=False)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text, encoding="utf-8")
    return path


def dsh_patch_command(
    url: str, out_dir: str, *, dock: bool, drivers: Sequence[str], ping: bool, home: str | None, out: TextIO
) -> Path:
    """``loopdock dsh-patch``: write the patch (token from ``<home>/bridge.token``, made on
    first use like ``loopdock serve`` does) and print how to run DSH with it."""
    token = load_or_create_token(resolve_home(home))  # creates the home if need be
    path = write_patch(out_dir, url, token, dock=dock, drivers=drivers, ping=ping)
    print(f"wrote {path}", file=out)
    print(f"run: DSH_HOME=... DSH_TELEMETRY_MODE=DISABLED dsh headless --patch {path} \"task\"", file=out)
    return path
