"""What a user installs is what the suite tests: the wheel holds every module and file of
the layer folders, under the one ``loopdock`` name, and the suite imports that install.

``scripts/test`` builds the wheel, installs it (not editable) and exports its path as
``LOOPDOCK_TEST_WHEEL``; run without it, the wheel is built from the tree (the
``wheel_file`` fixture, tests/conftest.py). What each extra's fresh install runs:
tests/loopdock/test_installed_commands.py.
"""

import email.parser
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest

import loopdock
import loopdock.runtime

ROOT = Path(__file__).resolve().parents[1]
# Each folder of the repository and the package it installs as (setup.py).
FOLDERS = {"loopdock": "loopdock", "runtime": "loopdock/runtime", "actors": "loopdock/actors",
           "bridge": "loopdock/bridge", "benchmarks": "loopdock/benchmarks"}
# Kept in the repository, not shipped: the benchmarks' committed results and write-ups.
NOT_SHIPPED = ("benchmarks/results/", "benchmarks/README.md", "benchmarks/PROFILE.md")


@pytest.fixture(scope="session")
def wheel(wheel_file) -> zipfile.ZipFile:
    with zipfile.ZipFile(wheel_file) as archive:
        yield archive


def _source_files() -> dict[str, Path]:
    """Every file of the layer folders (as the tree has it) under the name the wheel must give it."""
    files = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*"):
            relative = path.relative_to(ROOT).as_posix()
            if path.is_dir() or "__pycache__" in path.parts or relative.startswith(NOT_SHIPPED):
                continue
            files[str(PurePosixPath(package, path.relative_to(ROOT / folder).as_posix()))] = path
    return files


def test_every_module_and_file_of_the_layer_folders_is_in_the_wheel(wheel):
    shipped = set(wheel.namelist())
    expected = _source_files()
    assert "loopdock/runtime/cluster/__init__.py" in expected  # the walk itself sees subpackages
    assert "loopdock/bridge/dsh_plugin/index.mjs" in expected  # and data files
    assert sorted(set(expected) - shipped) == []
    # and each as the tree has it (a stale build/ folder once shipped old copies)
    stale = [name for name, path in expected.items() if wheel.read(name) != path.read_bytes()]
    assert stale == []


def test_the_wheel_puts_only_loopdock_into_site_packages(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert tops - dist_info == {"loopdock"}
    (info,) = dist_info
    assert wheel.read(f"{info}/top_level.txt").decode().split() == ["loopdock"]
    # Nothing else is shipped beside the layer folders' own files (no tests, no build leftovers).
    assert sorted(n for n in wheel.namelist() if not n.startswith(info) and n not in _source_files()) == []


def test_the_wheels_metadata_names_its_console_command_and_extras(wheel):
    (info,) = {name.split("/")[0] for name in wheel.namelist() if ".dist-info/" in name}
    meta = email.parser.Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
    assert {"dsh", "cluster", "mcp", "otel", "test"} <= set(meta.get_all("Provides-Extra"))
    # Tracing's extra: the API, the SDK and its OTLP HTTP exporter, none needed without it.
    otel = {r.split(">")[0].strip() for r in meta.get_all("Requires-Dist") if "extra == \"otel\"" in r}
    assert otel == {"opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"}
    assert not any(r.startswith("opentelemetry") for r in meta.get_all("Requires-Dist") if "extra ==" not in r)
    assert "loopdock = loopdock._cli:main" in wheel.read(f"{info}/entry_points.txt").decode()


def test_the_suite_imports_the_installed_wheel_not_the_tree(wheel):
    package = Path(loopdock.__file__).resolve().parent
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert package == site_packages / "loopdock", f"loopdock imported from {package}, not installed: run scripts/test"
    assert Path(loopdock.runtime.__file__).resolve().parent == package / "runtime"
    # The install is this wheel, file for file.
    installed = {str(f) for f in metadata.distribution("loopdock").files or () if str(f).startswith("loopdock/")}
    in_wheel = {n for n in wheel.namelist() if n.startswith("loopdock/") and not n.endswith("/")}
    assert in_wheel <= installed
    differing = [n for n in in_wheel if (package.parent / n).read_bytes() != wheel.read(n)]
    assert differing == []
