"""The DSH patch file that loads loopdock's bridge plugin: ``loopdock dsh-patch``.

    dsh headless --patch DIR/patch.yml "task"     # --patch before the app's own flags

The patch inserts the plugin (by absolute path) with its config (the runtime's URL and
token, dock mode and drivers, the ping adapter, the owned source kinds). ``loopdock
dsh-patch`` points it at the copy under the runtime home (``stable_plugin``), never into
site-packages: reinstalling loopdock (``pip install -e``, an upgrade, another venv) would
move or remove that path and leave the patch loading nothing.
In dock mode it also disables DSH's own ``agent-loop`` row (the plugin re-hosts it as the
``default`` driver); with ``ping`` it makes ``ping/ping-1`` DSH's default model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import yaml

from loopdock.runtime import get_logger, resolve_home

from ._token import load_or_create_token

PLUGIN_PATH = Path(__file__).resolve().parent / "dsh_plugin" / "index.mjs"
PLUGIN_ID = "loopdock-bridge"
PATCH_FILE = "patch.yml"
DEFAULT_OWNED_KINDS = ("loopx-continuation",)
DSH_ENDPOINT = "/dsh"
#: The folder under the runtime home holding the installed copy of the plugin.
PLUGIN_DIR = "dsh-plugin"
_PLUGIN_FILES = ("index.mjs", "package.json")

log = get_logger(__name__)


def stable_plugin(home: Path) -> Path:
    """The plugin's ``index.mjs`` copied to ``<home>/dsh-plugin/`` (refreshed when this
    loopdock ships another one), for patches and profiles to load: a path that survives
    reinstalling loopdock. Returns the copy's path."""
    target = home / PLUGIN_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name in _PLUGIN_FILES:
        shipped = (PLUGIN_PATH.parent / name).read_bytes()
        copy = target / name
        if not copy.exists() or copy.read_bytes() != shipped:
            draft = target / f".{name}.new"
            draft.write_bytes(shipped)
            draft.replace(copy)  # a DSH starting meanwhile reads the old file or the new one
            log.info("dsh plugin copied", path=str(copy))
    return target / "index.mjs"


def patch_rows(
    url: str,
    token: str,
    *,
    dock: bool = False,
    drivers: Sequence[str] = ("default",),
    ping: bool = False,
    owned_kinds: Sequence[str] = DEFAULT_OWNED_KINDS,
    extra: Mapping[str, Any] | None = None,
    plugin: Path = PLUGIN_PATH,
) -> list[dict[str, Any]]:
    """The patch as YAML-ready rows; ``extra`` adds plugin config keys (e.g. the tests'
    ``createAgents``/``resumeAgents``); ``plugin`` is the ``index.mjs`` to load."""
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
    rows.append({"insert": [{"id": PLUGIN_ID, "name": str(plugin), "config": config}]})
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
    first use like ``loopdock serve`` does; the plugin copied under the home) and print how
    to run DSH with it."""
    runtime_home = resolve_home(home)
    token = load_or_create_token(runtime_home)  # creates the home if need be
    plugin = stable_plugin(runtime_home)
    path = write_patch(out_dir, url, token, dock=dock, drivers=drivers, ping=ping, plugin=plugin)
    print(f"wrote {path} (plugin: {plugin})", file=out)
    dsh_home = os.environ.get("DSH_HOME") or os.path.expanduser("~/.dsh")
    print(f"run: DSH_HOME={dsh_home} DSH_TELEMETRY_MODE=DISABLED dsh headless --patch {path} \"task\"", file=out)
    return path
