"""Built-in tools: file access confined to the agent's cwd, and an opt-in shell.

Every path argument is resolved against ``ToolContext.cwd`` with symlinks followed and
must stay inside it. Error messages show paths relative to cwd only, so a refusal never
tells the model anything about the filesystem outside its directory.

The runtime's home (its session database, every session's transcript, the bridge token)
is refused too, wherever it is: a cwd may well contain it (a home under ``~`` and an agent
working in ``~``), and one ``write_file`` over the database would lose every session.

The confinement check and the file operation are two steps; a process that can swap a
directory for a symlink between them (a race) is outside what this guards against.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import trio

from .._errors import ToolError
from .._logging import get_logger
from .._process import BASE_ENV, Completed, decode, pick_env, run_child
from ._tool import Tool, ToolContext

_log = get_logger(__name__)

MAX_READ_CHARS = 200_000
MAX_LIST_ENTRIES = 5_000
SESSION_ENV_VAR = "DSH_SESSION_ID"  # LoopX skills read the calling session from this
_PATH_HELP = "Path relative to the working directory."

# -- argument checking ----------------------------------------------------------------


def _check_args(tool: str, arguments: Mapping[str, Any], allowed: set[str]) -> None:
    if not isinstance(arguments, Mapping):
        raise ToolError(f"{tool}: arguments must be an object")
    extra = sorted(set(arguments) - allowed)
    if extra:
        raise ToolError(
            f"{tool}: unexpected argument(s) {', '.join(extra)}; "
            f"accepted: {', '.join(sorted(allowed))}"
        )


def _str_arg(tool: str, arguments: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = arguments.get(key, default)
    if value is None:
        raise ToolError(f"{tool}: missing required argument {key!r}")
    if not isinstance(value, str):
        raise ToolError(f"{tool}: argument {key!r} must be a string")
    return value


def _int_arg(tool: str, arguments: Mapping[str, Any], key: str, minimum: int) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    # bool is an int subclass; JSON true is not a line count.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ToolError(f"{tool}: argument {key!r} must be an integer >= {minimum}")
    return value


# -- confinement ----------------------------------------------------------------------


@attrs.frozen
class _Confined:
    path: Path  # absolute, symlinks resolved, inside root
    shown: str  # relative to root, for messages


def _confine(tool: str, ctx: ToolContext, raw: str, home: Path | None) -> _Confined:
    # Resolving a path stats every component of it: called in a worker thread, with the
    # rest of a tool's filesystem calls, so that a slow or hung filesystem under one
    # agent's cwd holds up that call, not the event loop every agent runs on.
    if "\x00" in raw:
        raise ToolError(f"{tool}: path contains a NUL byte")
    root = Path(ctx.cwd).resolve()
    try:
        # An absolute ``raw`` replaces root in the join, then must still land inside it.
        # resolve() follows symlinks, including dangling ones, so a link pointing out
        # of root is caught even when its target does not exist yet.
        resolved = (root / raw).resolve()
    except (OSError, RuntimeError):  # symlink loop and the like
        raise ToolError(f"{tool}: cannot resolve path {raw!r}") from None
    if not resolved.is_relative_to(root):
        _log.warning("tools.path_refused", tool=tool, session_id=ctx.session_id)
        # Deliberately not echoing the path: it may name things outside cwd.
        raise ToolError(f"{tool}: path is outside the working directory; use a path inside it")
    if home is not None and resolved.is_relative_to(home.resolve()):
        _log.warning("tools.home_refused", tool=tool, session_id=ctx.session_id)
        raise ToolError(
            f"{tool}: path is inside the runtime's home (its session database and bridge "
            "token), which agents may not read, list or change"
        )
    shown = resolved.relative_to(root).as_posix() or "."
    return _Confined(resolved, shown)


def _os_error(tool: str, target: _Confined, exc: OSError) -> ToolError:
    # Never str(exc): it carries the absolute path.
    if isinstance(exc, FileNotFoundError):
        reason = "no such file or directory"
    elif isinstance(exc, IsADirectoryError):
        reason = "is a directory"
    elif isinstance(exc, NotADirectoryError):
        reason = "not a directory"
    elif isinstance(exc, PermissionError):
        reason = "permission denied"
    else:
        reason = exc.strerror or type(exc).__name__
    return ToolError(f"{tool}: {target.shown}: {reason}")


# -- read_file ------------------------------------------------------------------------


def _read_lines(path: Path, offset: int, limit: int | None, max_chars: int) -> str:
    """Lines [offset, offset+limit) of the file, at most ``max_chars`` characters.

    Reads incrementally so a huge file (or one huge line) costs at most ``max_chars``
    of memory, not its size.
    """
    parts: list[str] = []
    used = 0
    index = 0  # line being read
    mid_line = False  # inside a skipped line longer than one chunk
    stop_reason: str | None = None
    with open(path, encoding="utf-8", errors="replace") as f:
        while limit is None or index < offset + limit:
            if index < offset:
                chunk = f.readline(65_536)  # bounded: a skipped line may be huge
                if not chunk:
                    if mid_line:  # the last line had no trailing newline
                        index += 1
                    break
                mid_line = not chunk.endswith("\n")
                if not mid_line:
                    index += 1
                continue
            room = max_chars - used
            line = f.readline(room + 1)
            if not line:
                break
            if len(line) > room:
                parts.append(line[:room])
                stop_reason = (
                    f"[truncated: output limit of {max_chars} characters reached inside "
                    f"line {index}; continue with offset={index}]"
                )
                break
            parts.append(line)
            used += len(line)
            index += 1
    text = "".join(parts)
    if stop_reason is None and not parts and offset > 0:
        return f"[no lines at offset {offset}; the file has {index} lines]"
    if stop_reason is not None:
        if not text.endswith("\n"):
            text += "\n"
        text += stop_reason
    return text


def read_file(*, home: Path | None = None) -> Tool:
    """``home``: the runtime's home, refused whatever the cwd."""

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        _check_args("read_file", arguments, {"path", "offset", "limit"})
        raw = _str_arg("read_file", arguments, "path")
        offset = _int_arg("read_file", arguments, "offset", 0) or 0
        limit = _int_arg("read_file", arguments, "limit", 1)

        def read() -> str:
            target = _confine("read_file", ctx, raw, home)
            if target.path.is_dir():
                raise ToolError(f"read_file: {target.shown}: is a directory; use list_dir")
            if target.path.exists() and not target.path.is_file():
                # A FIFO or device would block the worker thread, which cannot be cancelled.
                raise ToolError(f"read_file: {target.shown}: not a regular file")
            try:
                return _read_lines(target.path, offset, limit, MAX_READ_CHARS)
            except OSError as exc:
                raise _os_error("read_file", target, exc) from None

        # Every filesystem call, in the tools' pool (see _confine). A cancelled read is
        # abandoned: its thread may hang on until the filesystem answers, the turn not.
        return await trio.to_thread.run_sync(read, limiter=ctx.threads, abandon_on_cancel=True)

    return Tool(
        name="read_file",
        description=(
            "Read a UTF-8 text file inside the working directory. Returns at most "
            f"{MAX_READ_CHARS} characters; use offset/limit (in lines) to page."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": _PATH_HELP},
                "offset": {"type": "integer", "minimum": 0, "description": "Lines to skip."},
                "limit": {"type": "integer", "minimum": 1, "description": "Most lines to return."},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        run=run,
        read_only=True,
    )


# -- write_file -----------------------------------------------------------------------


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_file(*, home: Path | None = None) -> Tool:
    """``home``: the runtime's home, refused whatever the cwd."""

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        _check_args("write_file", arguments, {"path", "content"})
        raw = _str_arg("write_file", arguments, "path")
        content = _str_arg("write_file", arguments, "content")
        data = content.encode("utf-8")

        def write() -> str:
            target = _confine("write_file", ctx, raw, home)
            if target.path.is_dir():
                raise ToolError(f"write_file: {target.shown}: is a directory")
            try:
                _write(target.path, data)
            except OSError as exc:
                raise _os_error("write_file", target, exc) from None
            return f"wrote {len(data)} bytes to {target.shown}"

        # Every filesystem call, in the tools' pool (see _confine). Never abandoned: a
        # write reported as cancelled must not land afterwards, so a cancel waits for it.
        return await trio.to_thread.run_sync(write, limiter=ctx.threads)

    return Tool(
        name="write_file",
        description=(
            "Write a UTF-8 text file inside the working directory, replacing it if it "
            "exists and creating missing parent directories."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": _PATH_HELP},
                "content": {"type": "string", "description": "The complete new file content."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        run=run,
    )


# -- list_dir -------------------------------------------------------------------------


def _list(path: Path) -> list[str]:
    entries = []
    with os.scandir(path) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir()  # follows symlinks, like ls -F
            except OSError:
                is_dir = False
            entries.append(entry.name + "/" if is_dir else entry.name)
    return sorted(entries)


def list_dir(*, home: Path | None = None) -> Tool:
    """``home``: the runtime's home, refused whatever the cwd."""

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        _check_args("list_dir", arguments, {"path"})
        raw = _str_arg("list_dir", arguments, "path", default=".")

        def listing() -> tuple[_Confined, list[str]]:
            target = _confine("list_dir", ctx, raw, home)
            try:
                return target, _list(target.path)
            except OSError as exc:
                raise _os_error("list_dir", target, exc) from None

        # Every filesystem call, in the tools' pool, abandoned if cancelled (as read_file).
        target, entries = await trio.to_thread.run_sync(listing, limiter=ctx.threads, abandon_on_cancel=True)
        if not entries:
            return f"{target.shown}: (empty directory)"
        if len(entries) > MAX_LIST_ENTRIES:
            dropped = len(entries) - MAX_LIST_ENTRIES
            entries = entries[:MAX_LIST_ENTRIES] + [f"[truncated: {dropped} more entries]"]
        return "\n".join(entries)

    return Tool(
        name="list_dir",
        description=(
            "List a directory inside the working directory, sorted by name; "
            "directories end with '/'."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Directory relative to the working directory.",
                    "default": ".",
                },
            },
            "required": [],
            "additionalProperties": False,
        },
        run=run,
        read_only=True,
    )


def builtin_tools(*, home: Path | None = None) -> tuple[Tool, ...]:
    """The always-safe built-ins, refusing ``home`` (the runtime's). ``shell`` is not among
    them: it needs a policy."""
    return (read_file(home=home), write_file(home=home), list_dir(home=home))


# -- shell ----------------------------------------------------------------------------


def _positive(_instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not value > 0:
        raise ValueError(f"ShellPolicy.{attribute.name} must be > 0, got {value!r}")


def _basenames(_instance: object, _attribute: attrs.Attribute[Any], value: frozenset[str]) -> None:
    for name in value:
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"ShellPolicy.allow takes executable names, not paths: {name!r}")


def _frozen_env(value: Mapping[str, str]) -> Mapping[str, str]:
    env = dict(value)
    for key, val in env.items():
        if not isinstance(key, str) or not isinstance(val, str):
            raise TypeError(f"ShellPolicy.env must map str to str, got {key!r}: {val!r}")
    return MappingProxyType(env)


#: What a shell tool's child inherits from the runtime's environment by default: enough to
#: find programs and run in the user's locale, none of the runtime's credentials.
INHERITED_ENV = BASE_ENV


@attrs.frozen
class ShellPolicy:
    """What the ``shell`` tool may run. The default allows nothing."""

    allow: frozenset[str] = attrs.field(
        default=frozenset(), converter=frozenset, validator=_basenames
    )
    timeout: float = attrs.field(default=30.0, validator=_positive)  # seconds, upper bound
    #: bytes of stdout kept; one more and the program (with all it started) is killed
    max_output: int = attrs.field(default=64_000, validator=_positive)
    #: the same bound for stderr
    max_stderr: int = attrs.field(default=16_000, validator=_positive)
    env: Mapping[str, str] = attrs.field(
        factory=dict, converter=_frozen_env, hash=False
    )  # set on top of the inherited variables below
    #: the runtime's own variables the child sees (everything else, API keys included,
    #: stays with the runtime); ``env`` adds or overrides on top of them
    inherit: frozenset[str] = attrs.field(default=INHERITED_ENV, converter=frozenset)


# Unquoted shell operators. shlex with punctuation_chars splits them out as tokens made
# only of these characters; we have no shell, so rather than pass them through as
# literal arguments (which would surprise a model expecting a pipe) we refuse them.
_OPERATOR_CHARS = frozenset("();<>|&")


def _parse_command(command: str) -> list[str]:
    try:
        argv = shlex.split(command)
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""  # shlex.split does not treat '#' as a comment either
        tokens = list(lexer)
    except ValueError as exc:  # unbalanced quotes, dangling escape
        raise ToolError(f"shell: cannot parse command: {exc}") from None
    if not argv:
        raise ToolError("shell: empty command")
    for token in tokens:
        if token and set(token) <= _OPERATOR_CHARS:
            raise ToolError(
                f"shell: {token!r} is not supported: commands run without a shell, so "
                "pipes, redirections, ';', '&&' and subshells are unavailable; run one "
                "program per call"
            )
    return argv


def _report(result: Completed, policy: ShellPolicy) -> str:
    limits = {"stdout": policy.max_output, "stderr": policy.max_stderr}
    if result.overflow is None:
        head = f"exit code {result.returncode}"
    else:
        limit = limits[result.overflow]
        head = f"killed: {result.overflow} passed its limit of {limit} bytes, so the program was stopped"
    parts = [head]
    for name, data in (("stdout", result.stdout), ("stderr", result.stderr)):
        cut = result.overflow == name
        text = decode(data, cut=cut) or "(empty)"
        if cut:
            text += f"\n[truncated at {limits[name]} bytes]"
        parts += [f"--- {name} ---", text]
    return "\n".join(parts)


def _executable(name: str, given: str, path: str, cwd: Path) -> str:
    executable = shutil.which(name, path=path)
    # A relative PATH entry would resolve against our process cwd, not the agent's.
    if executable is None or not os.path.isabs(executable):
        raise ToolError(f"shell: {name!r} was not found on PATH")
    # Allowing by basename must not allow "./ls" written by the model itself: a path
    # is accepted only if it is the very executable PATH resolves the name to.
    if "/" in given and os.path.realpath(os.path.join(cwd, given)) != os.path.realpath(executable):
        raise ToolError(f"shell: run {name!r} by name; only the executable found on PATH may run")
    return executable


def shell_tool(policy: ShellPolicy) -> Tool:
    """A ``shell`` tool that runs only executables named in ``policy.allow``."""
    allowed = ", ".join(sorted(policy.allow)) or "(none)"

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        _check_args("shell", arguments, {"command", "timeout"})
        command = _str_arg("shell", arguments, "command")
        timeout = policy.timeout
        requested = arguments.get("timeout")
        if requested is not None:
            number = isinstance(requested, (int, float)) and not isinstance(requested, bool)
            if not number or not requested > 0:
                raise ToolError("shell: argument 'timeout' must be a number > 0")
            timeout = min(timeout, float(requested))  # may only lower the policy's bound

        argv = _parse_command(command)
        name = os.path.basename(argv[0])
        if name not in policy.allow:
            raise ToolError(f"shell: {name!r} is not allowed; allowed: {allowed}")

        env = {**pick_env(os.environ, policy.inherit), **policy.env, SESSION_ENV_VAR: ctx.session_id}
        # Looking the program up stats files (a path given under the agent's cwd too): in
        # the tools' pool, so a hung filesystem holds up this call, not the event loop.
        executable = await trio.to_thread.run_sync(
            _executable, name, argv[0], env.get("PATH", os.defpath), ctx.cwd,
            limiter=ctx.threads, abandon_on_cancel=True,
        )
        argv = [executable, *argv[1:]]

        log = _log.bind(session_id=ctx.session_id, call_id=ctx.call_id, program=name)
        log.info("tools.shell.start")
        try:
            # No grace: SIGKILL at once, whatever the program started goes with it.
            with trio.move_on_after(timeout) as deadline:
                result = await run_child(
                    argv,
                    cwd=ctx.cwd,
                    env=env,
                    max_stdout=policy.max_output,
                    max_stderr=policy.max_stderr,
                )
        except OSError as exc:
            raise ToolError(f"shell: cannot run {name!r}: {exc.strerror or type(exc).__name__}") from None
        if deadline.cancelled_caught:
            log.info("tools.shell.timeout", timeout=timeout)
            raise ToolError(f"shell: {name!r} timed out after {timeout:g}s and was killed")
        log.info("tools.shell.exit", returncode=result.returncode, overflow=result.overflow)
        return _report(result, policy)

    return Tool(
        name="shell",
        description=(
            "Run one program (no shell: no pipes, redirections or ';') in the working "
            f"directory. Allowed programs: {allowed}. At most {policy.timeout:g}s; past "
            f"{policy.max_output} bytes of output the program is stopped."
        ),
        parameters={
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "Program and arguments, quoted like a POSIX shell.",
                },
                "timeout": {
                    "type": "number",
                    "description": (
                        f"Seconds before the program is killed (at most {policy.timeout:g})."
                    ),
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        run=run,
    )
