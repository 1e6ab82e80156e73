"""Third-party loops shipped as installable Python packages.

A package announces its loops with an entry point in the ``loopdock.loops`` group::

    [project.entry-points."loopdock.loops"]
    my-loops = "my_loops:LOOPS"

and a config (``loopPackages``) may name more by import reference: ``"module.path:attr"``,
or plain ``"module.path"`` for its ``LOOPS`` attribute. Whatever is named is a
``StrategyLoop``/``DriverLoop``, an iterable of them, or a zero-argument callable
returning either.

Loading never fails because of a package: a bad package (it does not import, the
attribute is missing or of the wrong type, a loop is invalid or its id is taken) becomes
a warning naming the package and the reason, and every other loop still registers.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import attrs

from loopdock.runtime import get_logger

from ._errors import DockError
from ._loops import DriverLoop, Loop, StrategyLoop

log = get_logger(__name__)

ENTRY_POINT_GROUP = "loopdock.loops"
DEFAULT_ATTRIBUTE = "LOOPS"

# The same grammar as the config's loopPackages: a dotted module, optionally ":attr.path".
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REFERENCE = re.compile(rf"{_NAME}(\.{_NAME})*(:{_NAME}(\.{_NAME})*)?")

Register = Callable[[Loop], Callable[[], None]]
_END = object()  # end of a package's items (None could be an item, a wrong one)


@attrs.frozen
class PackageReport:
    """What ``load_loop_packages`` did: loop ids registered (in order), one warning per
    failure, and the disposers of every registration."""

    loaded: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    disposers: tuple[Callable[[], None], ...] = ()

    def dispose(self) -> None:
        """Unregister everything that was loaded (newest first)."""
        for dispose in reversed(self.disposers):
            dispose()


def load_loop_packages(
    register: Register,
    references: Sequence[str] = (),
    *,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> PackageReport:
    """Register the loops of every installed package (entry point group
    ``loopdock.loops``; ``entry_points`` replaces the installed set, and only those of
    the group are used) and of every config reference, through ``register``."""
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    loaded: list[str] = []
    warnings: list[str] = []
    disposers: list[Callable[[], None]] = []

    def warn(package: str, reason: str) -> None:
        log.warning("loop package failed", package=package, reason=reason)
        warnings.append(f"{package}: {reason}")

    def load(package: str, entry_point: importlib.metadata.EntryPoint) -> None:
        # Only Exception: KeyboardInterrupt, SystemExit and trio.Cancelled must go on up.
        try:
            items = _loops_of(entry_point.load())
        except Exception as exc:
            warn(package, _reason(exc))
            return
        names: list[str] = []
        while True:
            try:
                # A generator may raise mid-way (e.g. building an invalid loop); the loops
                # it yielded before that stay registered.
                item = next(items, _END)
            except Exception as exc:
                warn(package, _reason(exc))
                break
            if item is _END:
                break
            if not isinstance(item, (StrategyLoop, DriverLoop)):
                warn(package, f"{item!r} is not a StrategyLoop or DriverLoop")
                continue
            try:
                disposers.append(register(item))
            except Exception as exc:
                warn(package, f"loop {item.id!r}: {_reason(exc)}")
                continue
            loaded.append(item.id)
            names.append(item.id)
        if names:
            log.info("loop package loaded", package=package, loops=names)

    for entry_point in entry_points:
        if entry_point.group == ENTRY_POINT_GROUP:
            load(_entry_point_label(entry_point), entry_point)
    for reference in references:
        label = f"config reference {reference!r}"
        if not isinstance(reference, str) or not _REFERENCE.fullmatch(reference):
            warn(label, "expected an import reference 'module.path' or 'module.path:attribute'")
            continue
        value = reference if ":" in reference else f"{reference}:{DEFAULT_ATTRIBUTE}"
        # An EntryPoint does the importing and the attribute walk for both sources alike.
        load(label, importlib.metadata.EntryPoint(reference, value, ENTRY_POINT_GROUP))

    return PackageReport(tuple(loaded), tuple(warnings), tuple(disposers))


def _loops_of(value: object) -> Iterator[object]:
    """The items a package named: one loop, an iterable, or what a factory returns."""
    if callable(value) and not isinstance(value, (StrategyLoop, DriverLoop, type)):
        value = value()
    if isinstance(value, (StrategyLoop, DriverLoop)):
        return iter((value,))
    # A string or a mapping is iterable too, but never a collection of loops.
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{value!r} is not a loop, an iterable of loops or a zero-argument callable returning either"
        )
    return iter(value)


def _entry_point_label(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    owner = f" of {dist.name}" if dist is not None else ""
    return f"entry point {entry_point.name!r}{owner} ({entry_point.value})"


def _reason(exc: Exception) -> str:
    kind = exc.code if isinstance(exc, DockError) else type(exc).__name__
    return f"{kind}: {exc}"
