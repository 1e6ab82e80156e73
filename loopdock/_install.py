"""``loopdock dsh-install`` and ``loopdock dsh-migrate``: loopdock in a DSH profile.

``dsh-install`` copies the bridge plugin under the runtime home (``<home>/dsh-plugin/``,
never a site-packages path, so reinstalling loopdock leaves the profile working), writes
loopdock's rows into the profile's own patch layer (``$DSH_HOME/profiles/NAME/
cordis.patch.yml``, the layer DSH keeps across its upgrades; the user's other rows stay),
then asks ``dsh --profile NAME --dump-config`` for the composed tree and checks that DSH
itself reads the plugin row from that copy (and, in dock mode, its own agent loop
disabled; with ``--ping``, the ping model as default). Installing again replaces
loopdock's rows, nothing else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from loopdock.bridge import PLUGIN_ID, load_or_create_token, migrate_dsh_home, patch_rows, stable_plugin
from loopdock.runtime import InvalidOptionsError, LoopdockError, resolve_home

PATCH_LAYER = "cordis.patch.yml"
DEFAULT_URL = "ws://127.0.0.1:8765"
#: Seconds DSH gets to compose a profile (a cold start of the 300 MB binary).
DUMP_TIMEOUT = 120


class InstallError(LoopdockError):
    """Raised when DSH cannot be found or run, or when the profile DSH reads back does not
    hold what ``dsh-install`` wrote."""

    code = "DSH_INSTALL"


def find_dsh() -> Path:
    """The ``dsh`` command: on PATH, else beside this Python (``pip install 'loopdock[dsh]'``
    in a virtual environment that is not activated)."""
    found = shutil.which("dsh")
    if found:
        return Path(found)
    beside = Path(sys.executable).parent / "dsh"
    if beside.exists():
        return beside
    raise InstallError("no dsh command: install it with pip install 'loopdock[dsh]'")


def dsh_home(value: str | None) -> Path:
    """``--dsh-home``, else ``$DSH_HOME``: DSH itself refuses to run without one."""
    raw = value or os.environ.get("DSH_HOME")
    if not raw:
        raise InvalidOptionsError(
            "DSH needs a home folder: set DSH_HOME (e.g. export DSH_HOME=~/.dsh) or pass --dsh-home"
        )
    return Path(raw).expanduser().absolute()


class _Loader(yaml.SafeLoader):
    """Reads DSH's composed tree, whose rows may hold ``!!js`` expressions (kept as text)."""


_Loader.add_multi_constructor("tag:yaml.org,2002:js", lambda loader, suffix, node: loader.construct_scalar(node))


def composed_rows(dump: str) -> list[dict[str, Any]]:
    """Every row of ``dsh --dump-config`` output (its sections are YAML lists, one after
    the other, under ``# == origin`` comments), in order."""
    rows = yaml.load(dump, Loader=_Loader) or []  # noqa: S506 - a SafeLoader subclass
    return [row for row in rows if isinstance(row, dict)]


def _ours(row: Any) -> bool:
    """A row a loopdock install wrote (and a new one replaces)."""
    if not isinstance(row, Mapping):
        return False
    if row.get("id") == "agent-loop" and row.get("disabled") is True and set(row) == {"id", "disabled"}:
        return True
    config = row.get("config")
    if row.get("id") == "agent-default-model" and isinstance(config, Mapping) and config.get("provider") == "ping":
        return True
    inserted = row.get("insert")
    return isinstance(inserted, list) and any(isinstance(i, Mapping) and i.get("id") == PLUGIN_ID for i in inserted)


def merged_layer(existing: Any, ours: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The profile's patch layer with loopdock's old rows replaced by ``ours``."""
    kept = [row for row in (existing if isinstance(existing, list) else []) if not _ours(row)]
    return [*kept, *ours]


def _dump(dsh: Path, profile: str, home: Path) -> str:
    env = {**os.environ, "DSH_HOME": str(home), "DSH_TELEMETRY_MODE": os.environ.get("DSH_TELEMETRY_MODE", "DISABLED")}
    try:
        done = subprocess.run(
            [str(dsh), "--profile", profile, "--dump-config"], env=env, capture_output=True, text=True,
            timeout=DUMP_TIMEOUT, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"cannot run {dsh} --profile {profile} --dump-config: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[0]
        raise InstallError(f"dsh --profile {profile} --dump-config failed ({done.returncode}): {last[:300]}")
    return done.stdout


def verify(rows: Sequence[Mapping[str, Any]], plugin: Path, url: str, *, dock: bool, ping: bool) -> list[str]:
    """What DSH's composed tree shows of the install, one sentence each; InstallError for
    the first thing missing."""
    said: list[str] = []
    found = [row for row in rows if row.get("id") == PLUGIN_ID]
    if len(found) != 1:
        raise InstallError(f"DSH reads {len(found)} {PLUGIN_ID} rows in the profile, expected 1")
    name = str(found[0].get("name", ""))
    if name.removeprefix("file://") != str(plugin):
        raise InstallError(f"DSH loads {PLUGIN_ID} from {name!r}, not from {plugin}")
    config = found[0].get("config") or {}
    if config.get("url") != url.rstrip("/") + "/dsh" and config.get("url") != url:
        raise InstallError(f"DSH's {PLUGIN_ID} row connects to {config.get('url')!r}, not {url}")
    said.append(f"plugin row {PLUGIN_ID}: loads {plugin}, connects to {config.get('url')}")
    loops = [row for row in rows if row.get("id") == "agent-loop"]
    if dock:
        if not loops or loops[-1].get("disabled") is not True:
            raise InstallError("DSH's own agent-loop row is still enabled: dock mode cannot take the factory slot")
        said.append("dock mode: DSH's agent-loop row is disabled (the plugin hosts it as driver 'default')")
    if ping:
        models = [row for row in rows if row.get("id") == "agent-default-model"]
        if not models or (models[-1].get("config") or {}).get("provider") != "ping":
            raise InstallError("DSH's default model is not the ping model")
        said.append("default model: ping/ping-1 (offline)")
    return said


def install_command(
    *,
    profile: str,
    url: str,
    home: str | None,
    dsh_home_arg: str | None,
    dock: bool,
    drivers: Sequence[str],
    ping: bool,
    out: TextIO,
) -> Path:
    """``loopdock dsh-install``: see the module docstring. Returns the profile's patch layer."""
    if not profile or "/" in profile or profile.startswith("."):
        raise InvalidOptionsError(f"--profile must be a profile name, got {profile!r}")
    dsh = find_dsh()
    home_dir = dsh_home(dsh_home_arg)
    runtime_home = resolve_home(home)
    token = load_or_create_token(runtime_home)
    plugin = stable_plugin(runtime_home)
    rows = patch_rows(url, token, dock=dock, drivers=drivers, ping=ping, plugin=plugin)
    _dump(dsh, profile, home_dir)  # DSH makes a shipped profile (web, headless, ...) on first use
    layer = home_dir / "profiles" / profile / PATCH_LAYER
    if not layer.is_file():
        raise InstallError(f"DSH has no profile {profile!r} under {home_dir} (no {layer})")
    existing = yaml.load(layer.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506
    text = "# loopdock's rows are rewritten by `loopdock dsh-install`; keep your own rows apart.\n"
    text += yaml.safe_dump(merged_layer(existing, rows), sort_keys=False)
    layer.chmod(0o600)  # it now holds the bridge token
    layer.write_text(text, encoding="utf-8")
    said = verify(composed_rows(_dump(dsh, profile, home_dir)), plugin, url, dock=dock, ping=ping)
    print(f"installed loopdock into DSH profile {profile!r} ({layer})", file=out)
    for line in said:
        print(f"  verified with dsh --dump-config: {line}", file=out)
    # `dsh` as the user would type it: by name if PATH finds this one, else its path (a
    # venv that is not activated)
    on_path = shutil.which("dsh")
    command = "dsh" if on_path and Path(on_path).resolve() == dsh.resolve() else str(dsh)
    print(f"next: loopdock serve --port {url.rsplit(':', 1)[-1].split('/')[0]}   then   "
          f"DSH_HOME={home_dir} {command} {profile}", file=out)
    return layer


def migrate_command(dsh_home_arg: str | None, out: TextIO) -> int:
    """``loopdock dsh-migrate``: move old dock bindings into plugin records; 1 if a live
    DSH process held a session that needed it (run it again once DSH stopped)."""
    results = migrate_dsh_home(dsh_home(dsh_home_arg))
    if not results:
        print("nothing to migrate", file=out)
    busy = 0
    for result in results:
        if result.outcome == "busy":
            busy += 1
            print(f"busy {result.session_id}: a DSH process holds it; run dsh-migrate again once it stopped", file=out)
        else:
            where = (
                f"loop {result.binding.loop} on driver {result.binding.driver or '-'}"
                if result.binding else "no valid binding"
            )
            print(f"migrated {result.session_id}: {where}", file=out)
    return 1 if busy else 0
