"""Reading a YAML file a person wrote (the dock's config, an experiment): strictly.

PyYAML's safe loader keeps the last of two equal keys in one mapping; a person who wrote
a key twice meant one of them, so it is refused with both lines named. A file is refused
before any value is built if its aliases would expand it past ``MAX_YAML_NODES`` (a
"billion laughs" of a few hundred bytes expands to billions of values); anchors and merge
keys within that bound stay usable. Every failure is one ``YamlFileError`` whose message
names the file and, when known, the line and column, and quotes values cut short
(``short_repr``).
"""

from __future__ import annotations

import os
import reprlib
from typing import Any, BinaryIO

import yaml

from ._errors import LoopdockError

#: The most YAML nodes (keys, values, items) a file may hold with every alias expanded;
#: far above any real config or experiment file.
MAX_YAML_NODES = 100_000
#: The longest quote of a value (or key) in an error message.
MAX_QUOTE = 120


class YamlFileError(LoopdockError):
    """Raised when a YAML file is missing, unreadable, or not valid YAML (the message
    names the file, and the line and column when the parser knows them)."""

    code = "INVALID_YAML"


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_repr(value: object) -> str:
    """``repr(value)`` cut to MAX_QUOTE characters, built from a bounded part of it: at
    most a few items of each container and a few levels deep (reprlib), so shared or
    huge values cost little."""
    short = reprlib.Repr()
    short.maxlevel = 3
    short.maxdict = short.maxlist = short.maxtuple = short.maxset = 4
    short.maxstring = short.maxother = short.maxlong = MAX_QUOTE
    try:
        text = short.repr(value)
    except Exception:  # a repr that fails, e.g. an int past Python's digit limit
        text = f"<{type(value).__name__}>"
    return cut(text, MAX_QUOTE)


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
                    f"found duplicate key {short_repr(key)} (first given on line {first_line[key] + 1})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes the document holds with every alias expanded, up to ``limit + 1``
    (also the answer for an alias inside its own anchor, which never ends).

    An alias is the very node it names, so the document is a graph; each node's size is
    computed once, after its children's, without recursion (no depth limit to hit).
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path: meeting one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > limit:
                return limit + 1
            sizes[key] = size
        elif key in open_nodes:
            return limit + 1
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)]


def _load(file: BinaryIO, name: str) -> Any:
    """``yaml.load`` with the strict loader, after checking the expanded size."""
    loader = _StrictLoader(file)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise YamlFileError(
                f"{name}: more than {MAX_YAML_NODES} values once its aliases are expanded "
                "(or an alias inside its own anchor); not loaded"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml_file(path: str | os.PathLike[str], *, what: str = "file") -> Any:
    """The value in the YAML file at ``path`` (``None`` for an empty file). ``what`` names
    the file's role in the messages (``config file``, ``experiment file``...)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            return _load(file, name)
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
    except RecursionError:  # PyYAML composes nested collections recursively
        raise YamlFileError(f"{name}: nested too deeply") from None
    except ValueError as exc:  # a scalar PyYAML cannot build, e.g. an int past 4300 digits
        raise YamlFileError(f"{name}: {exc}") from None
