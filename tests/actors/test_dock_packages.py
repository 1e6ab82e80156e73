"""Loop packages: loops found through entry points and config references.

The unit tests point synthetic entry points at modules written into ``tmp_path``; the
integration test installs the shipped template with pip (offline) and runs its own tests
against the installed copy.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import shutil
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import structlog
import trio

from loopdock.actors.dock._errors import DockError
from loopdock.actors.dock._loops import DriverLoop, StrategyLoop
from loopdock.actors.dock._packages import ENTRY_POINT_GROUP, PackageReport, load_loop_packages

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "examples" / "loop-author-template"

# Written into every synthetic package module, so a module can build loops in one line.
PRELUDE = """\
from loopdock import DriverLoop, StrategyLoop

def setup(ctx):
    pass

def loop(id):
    return StrategyLoop(id=id, setup=setup)
"""


class FakeDock:
    """Stands in for ``rt.dock.register``: refuses a taken id like the real dock does."""

    def __init__(self) -> None:
        self.loops: dict[str, object] = {}

    def register(self, loop):
        if loop.id in self.loops:
            raise DockError("DUPLICATE_LOOP", f"loop {loop.id!r} is already registered")
        self.loops[loop.id] = loop

        def dispose() -> None:
            if self.loops.get(loop.id) is loop:
                del self.loops[loop.id]

        return dispose


@pytest.fixture
def dock():
    return FakeDock()


@pytest.fixture
def package(tmp_path, monkeypatch):
    """``package(name, body)`` writes module ``name`` (PRELUDE + body) and returns an entry
    point naming ``value`` in it. Imported modules are forgotten afterwards, so no test
    sees another's."""
    root = tmp_path / "packages"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    written: list[str] = []

    def make(name: str, body: str, value: str = "LOOPS") -> importlib.metadata.EntryPoint:
        (root / f"{name}.py").write_text(PRELUDE + textwrap.dedent(body))
        written.append(name)
        return importlib.metadata.EntryPoint(name, f"{name}:{value}", ENTRY_POINT_GROUP)

    yield make
    for name in written:
        sys.modules.pop(name, None)


def load(dock, *entry_points, references=()):
    return load_loop_packages(dock.register, references, entry_points=entry_points)


def test_a_good_package_registers_every_loop_and_disposers_unregister_them(dock, package):
    ep = package("ldp_good", "LOOPS = (loop('alpha'), loop('beta'))")
    with structlog.testing.capture_logs() as logs:
        report = load(dock, ep)
    assert isinstance(report, PackageReport)
    assert report.loaded == ("alpha", "beta")
    assert report.warnings == ()
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert set(dock.loops) == {"alpha", "beta"}
    assert len(report.disposers) == 2
    for dispose in report.disposers:
        dispose()
    assert dock.loops == {}


def test_report_dispose_unregisters_everything_loaded(dock, package):
    report = load(dock, package("ldp_one", "LOOPS = loop('solo')"))
    assert report.loaded == ("solo",)  # a single loop, not an iterable, is accepted
    report.dispose()
    assert dock.loops == {}


def test_a_package_that_raises_on_import_is_a_warning_and_others_still_load(dock, package):
    bad = package("ldp_broken", "raise RuntimeError('boom at import')")
    good = package("ldp_fine", "LOOPS = [loop('fine')]")
    with structlog.testing.capture_logs() as logs:
        report = load(dock, bad, good)
    assert report.loaded == ("fine",)
    [warning] = report.warnings
    assert "ldp_broken" in warning and "RuntimeError: boom at import" in warning
    # The same failure is logged, with the package and the reason as fields.
    [event] = [e for e in logs if e["log_level"] == "warning"]
    assert event["event"] == "loop package failed"
    assert "ldp_broken" in event["package"] and "boom at import" in event["reason"]


def test_a_missing_module_or_attribute_is_a_warning(dock, package):
    missing_module = importlib.metadata.EntryPoint("gone", "ldp_not_installed:LOOPS", ENTRY_POINT_GROUP)
    missing_attr = package("ldp_noattr", "OTHER = ()")
    report = load(dock, missing_module, missing_attr)
    assert report.loaded == ()
    gone, noattr = report.warnings
    assert "'gone'" in gone and "ModuleNotFoundError" in gone and "ldp_not_installed" in gone
    assert "ldp_noattr" in noattr and "AttributeError" in noattr and "LOOPS" in noattr


@pytest.mark.parametrize("value", ["'template-concise'", "42", "{'id': 'x', 'setup': setup}", "None"])
def test_an_attribute_that_is_not_a_loop_is_a_warning(dock, package, value):
    # A string and a mapping are iterable, but never a collection of loops.
    report = load(dock, package("ldp_wrong", f"LOOPS = {value}"))
    assert report.loaded == ()
    [warning] = report.warnings
    assert "ldp_wrong" in warning and "TypeError" in warning and "not a loop" in warning


def test_a_callable_returning_a_list_is_called_once(dock, package):
    ep = package(
        "ldp_factory",
        """
        CALLS = []

        def make_loops():
            CALLS.append(1)
            return [loop('made-1'), loop('made-2')]
        """,
        value="make_loops",
    )
    report = load(dock, ep)
    assert report.loaded == ("made-1", "made-2")
    assert sys.modules["ldp_factory"].CALLS == [1]


def test_a_callable_returning_one_driver_loop_and_a_dotted_attribute(dock, package):
    ep = package(
        "ldp_driver",
        """
        class Driver:
            async def create_agent(self, owner, options): ...
            async def resume(self, owner, options): ...

        class Namespace:
            @staticmethod
            def factory():
                return DriverLoop.from_driver('own-driver', Driver())
        """,
        value="Namespace.factory",
    )
    report = load(dock, ep)
    assert report.loaded == ("own-driver",)
    assert isinstance(dock.loops["own-driver"], DriverLoop)


def test_a_factory_that_raises_is_a_warning(dock, package):
    ep = package("ldp_factory_fails", "def LOOPS():\n    raise ValueError('no loops today')\n")
    report = load(dock, ep)
    assert report.loaded == ()
    # The whole warning: which entry point, what it names, and why it failed.
    assert report.warnings == (
        "entry point 'ldp_factory_fails' (ldp_factory_fails:LOOPS): ValueError: no loops today",
    )


def test_one_wrong_item_does_not_stop_the_packages_other_loops(dock, package):
    ep = package("ldp_mixed", "LOOPS = [loop('first'), 'not-a-loop', loop('last')]")
    report = load(dock, ep)
    assert report.loaded == ("first", "last")
    [warning] = report.warnings
    assert "ldp_mixed" in warning and "'not-a-loop' is not a StrategyLoop or DriverLoop" in warning


def test_an_invalid_loop_is_a_warning_and_the_valid_one_still_registers(dock, package):
    # Building the second loop raises DockError (INVALID_LOOP_ID); the generator form lets
    # the package hand over the first before that happens.
    ep = package(
        "ldp_invalid",
        """
        def LOOPS():
            yield loop('valid')
            yield loop('Not A Valid Id')
        """,
    )
    report = load(dock, ep)
    assert report.loaded == ("valid",)
    assert set(dock.loops) == {"valid"}
    [warning] = report.warnings
    assert "ldp_invalid" in warning and "INVALID_LOOP_ID" in warning and "Not A Valid Id" in warning


def test_a_duplicate_id_is_a_warning_naming_the_package_and_the_loop(dock, package):
    first = package("ldp_first", "LOOPS = [loop('shared'), loop('only-first')]")
    second = package("ldp_second", "LOOPS = [loop('shared'), loop('only-second')]")
    report = load(dock, first, second)
    assert report.loaded == ("shared", "only-first", "only-second")
    [warning] = report.warnings
    assert "ldp_second" in warning and "'shared'" in warning and "DUPLICATE_LOOP" in warning
    # The first package keeps the id; disposing unregisters exactly what was loaded.
    assert dock.loops["shared"] is sys.modules["ldp_first"].LOOPS[0]
    report.dispose()
    assert dock.loops == {}


def test_a_loop_already_in_the_dock_keeps_its_registration(dock, package):
    existing = StrategyLoop(id="taken", setup=lambda ctx: None)
    dock.register(existing)
    report = load(dock, package("ldp_taken", "LOOPS = [loop('taken')]"))
    assert report.loaded == () and report.disposers == ()
    assert "DUPLICATE_LOOP" in report.warnings[0]
    report.dispose()
    assert dock.loops == {"taken": existing}


def test_config_references_module_attribute_and_plain_module(dock, package):
    package("ldp_ref_attr", "CUSTOM = [loop('by-attr')]")
    package("ldp_ref_plain", "LOOPS = (loop('by-plain'),)")
    report = load(dock, references=["ldp_ref_attr:CUSTOM", "ldp_ref_plain"])
    assert report.loaded == ("by-attr", "by-plain")
    assert report.warnings == ()


def test_bad_config_references_are_warnings_naming_the_reference(dock, package):
    package("ldp_ref_ok", "LOOPS = [loop('ok')]")
    report = load(dock, references=["not a reference", "ldp_ref_absent", "ldp_ref_ok"])
    assert report.loaded == ("ok",)
    malformed, absent = report.warnings
    assert "'not a reference'" in malformed and "import reference" in malformed
    assert "'ldp_ref_absent'" in absent and "ModuleNotFoundError" in absent


def test_entry_points_of_other_groups_are_ignored(dock, package):
    ep = package("ldp_other_group", "LOOPS = [loop('elsewhere')]")
    other = importlib.metadata.EntryPoint(ep.name, ep.value, "console_scripts")
    report = load(dock, other)
    assert report == PackageReport()
    assert "ldp_other_group" not in sys.modules  # not even imported


def test_keyboard_interrupt_propagates(dock, package):
    # Only Exception becomes a warning; an interrupt (or trio.Cancelled) must not be eaten.
    ep = package("ldp_interrupt", "def LOOPS():\n    raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load(dock, ep)


def test_a_register_function_that_is_interrupted_propagates(package):
    def register(loop):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_loop_packages(register, entry_points=[package("ldp_reg", "LOOPS = [loop('x')]")])


# -- the template, installed for real -------------------------------------------------


async def run(args, **kwargs):
    # pip is slow to start, but minutes of silence mean something is stuck.
    with trio.fail_after(180):
        return await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False, **kwargs)


async def test_the_template_installs_is_discovered_and_passes_its_own_test(tmp_path, monkeypatch):
    # Work on a copy, as an author would (cp -R): pip builds in-tree and would otherwise
    # leave build/ and *.egg-info in the repository.
    source = tmp_path / "my-loop"
    shutil.copytree(TEMPLATE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path / "site"
    # No build isolation and no index: nothing is downloaded, the venv's setuptools builds
    # it; --check-build-dependencies turns a too-old setuptools into a clear error.
    installed = await run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--check-build-dependencies", "--disable-pip-version-check", "--quiet",
         "--target", str(site), str(source)],
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr.decode()

    # Discovery through the installed metadata, exactly as an installed package is seen.
    found = [
        ep
        for dist in importlib.metadata.distributions(path=[str(site)])
        for ep in dist.entry_points.select(group=ENTRY_POINT_GROUP)
    ]
    assert [(ep.name, ep.value) for ep in found] == [("template", "loopdock_loop_template:LOOPS")]
    monkeypatch.syspath_prepend(str(site))
    try:
        dock = FakeDock()
        report = load_loop_packages(dock.register, entry_points=found)
        assert report.loaded == ("template-concise",)
        assert report.warnings == ()
        assert found[0].dist.name == "loopdock-loop-template"
        # `pip install -e '.[test]'`, as its README says, brings what its own test imports
        extras = {r.replace(" ", "") for r in found[0].dist.requires or ()}
        assert {'pytest>=8.0;extra=="test"', 'pytest-trio>=0.8;extra=="test"'} <= extras, extras
        # With the site on sys.path, the default (installed entry points) finds it too.
        again = load_loop_packages(FakeDock().register)
        assert "template-concise" in again.loaded
        loop = dock.loops["template-concise"]
        assert isinstance(loop, StrategyLoop) and loop.label

        # The template's own tests, against the installed copy (the site is on sys.path,
        # its src/ is not), run here as its pytest would run them: every test_* function
        # of every tests/test_*.py, async ones in trio (the template sets trio_mode).
        config = tomllib.loads((source / "pyproject.toml").read_text())
        assert config["tool"]["pytest"]["ini_options"]["trio_mode"] is True
        ran = []
        for path in sorted((source / "tests").glob("test_*.py")):
            spec = importlib.util.spec_from_file_location(f"template_tests_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for name, test in vars(module).items():
                if name.startswith("test_") and inspect.iscoroutinefunction(test):
                    scratch = tmp_path / "work" / name
                    scratch.mkdir(parents=True)
                    await test(**({"tmp_path": scratch} if "tmp_path" in inspect.signature(test).parameters else {}))
                    ran.append(name)
        assert ran == ["test_template_loop_composes_a_concise_read_only_agent"]
        imported_from = sys.modules["loopdock_loop_template"].__file__
        assert Path(imported_from).is_relative_to(site), imported_from
    finally:
        sys.modules.pop("loopdock_loop_template", None)
