"""Reading a YAML file a person wrote (the dock's config, an experiment): strictly.

PyYAML's safe loader keeps the last of two equal keys in one mapping; a person who wrote
a key twice meant one of them, so it is refused with both lines named. Every failure is
one ``YamlFileError`` whose message names the file and, when known, the line and column.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from ._errors import LoopdockError


class YamlFileError(LoopdockError):
    """Raised when a YAML file is missing, unreadable, or not valid YAML (the message
    names the file, and the line and column when the parser knows them)."""

    code = "INVALID_YAML"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[object, int] = {}
        for key_node, _ in node.value:
            # Merge keys (`<<`) may legitimately be overridden; only literal keys count.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first given on line {first_line[key] + 1})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml_file(path: str | os.PathLike[str], *, what: str = "file") -> Any:
    """The value in the YAML file at ``path`` (``None`` for an empty file). ``what`` names
    the file's role in the messages (``config file``, ``experiment file``...)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            return yaml.load(file, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError:
        raise YamlFileError(f"{what} {name} not found") from None
    except OSError as exc:
        raise YamlFileError(f"cannot read {what} {name}: {exc.strerror or exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise YamlFileError(f"{name}: {where}{exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:  # e.g. a reader error on bytes that are not UTF-8
        raise YamlFileError(f"{name}: {exc}") from None
