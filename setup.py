"""The wheel's package list, derived from the folders (pyproject.toml holds the rest).

The layers live at the repository root (``runtime/``, ``actors/``, ``bridge/``, and the
``benchmarks/`` that ``loopdock bench`` runs) and install under the one ``loopdock``
namespace: ``runtime/`` becomes ``loopdock.runtime``. Every folder with an ``__init__.py``
under them is a package, so a new subpackage cannot be left out of the wheel.
"""

from setuptools import find_packages, setup

LAYERS = ("runtime", "actors", "bridge", "benchmarks")

packages = ["loopdock", *(f"loopdock.{name}" for name in find_packages("loopdock"))]
for layer in LAYERS:
    packages += [f"loopdock.{name}" for name in find_packages(include=[layer, f"{layer}.*"])]

setup(packages=packages, package_dir={f"loopdock.{layer}": layer for layer in LAYERS})
