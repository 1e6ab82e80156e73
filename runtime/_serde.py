"""All (de)serialisation between runtime values and wire/JSON shapes: one converter.

The wire follows DSH: camelCase keys, blocks tagged by ``type``, sources tagged by
``kind``. Python values stay snake_case attrs classes.

``converter`` is the only cattrs converter in loopdock. Its policy is JSON's: a string is
a string, an integer an integer (no ``str(5)``, no ``int(True)``, no string iterated into
a tuple), a ``Literal`` one of its values, an opaque ``Mapping[str, Any]`` an object. The
runtime's own values (messages, blocks, sources, session headers) have their hooks here;
a layer above registers the classes of its own wire with ``register_wire_class`` (the
bridge's frames), and each class says whether unknown keys are refused or tolerated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, cast, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ._events import Event, SessionHeader
from ._messages import (
    PERSON,
    Block,
    ImageBlock,
    InvalidMessageError,
    Message,
    ProducerSource,
    ReasoningBlock,
    Role,
    SkillInvocationSource,
    Source,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSource,
    UserSource,
)
from ._names import camel

_BLOCK_TAGS: dict[type, str] = {
    TextBlock: "text",
    ReasoningBlock: "reasoning",
    ImageBlock: "image",
    ToolCallBlock: "tool-call",
    ToolResultBlock: "tool-result",
}
_BLOCK_BY_TAG = {tag: cls for cls, tag in _BLOCK_TAGS.items()}
_BUILTIN_SOURCES: dict[str, type] = {
    "user": UserSource,
    "skill-invocation": SkillInvocationSource,
    "tool": ToolSource,
}


class WireTypeError(TypeError):
    """A JSON value of the wrong kind where a wire class is structured; its message names
    what was expected and what came (fit to show a peer)."""


def json_kind(value: Any) -> str:
    """What JSON calls ``value``'s kind, with its article: "a string", "null", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _strict(expected: type, what: str) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise WireTypeError(f"expected {what}, got {json_kind(value)}")
        return value

    return hook


def _register_json_policy(conv: cattrs.Converter) -> None:
    conv.register_structure_hook(str, _strict(str, "a string"))
    conv.register_structure_hook(int, _strict(int, "an integer"))
    conv.register_structure_hook(bool, _strict(bool, "a boolean"))

    # Opaque JSON objects (DSH's data, messages, agent options): checked to be objects only.
    def is_opaque(tp: Any) -> bool:
        return bool(tp == Mapping[str, Any])

    conv.register_structure_hook_func(is_opaque, _strict(dict, "an object"))
    conv.register_unstructure_hook_func(is_opaque, dict)

    def is_literal(tp: Any) -> bool:
        return get_origin(tp) is Literal

    def literal_hook(tp: Any) -> Callable[[Any, Any], Any]:
        allowed = get_args(tp)

        def hook(value: Any, _: Any) -> Any:
            if isinstance(value, str) and value in allowed:
                return value
            raise WireTypeError(f"expected one of {', '.join(map(repr, allowed))}, got {value!r}"[:200])

        return hook

    conv.register_structure_hook_factory(is_literal, literal_hook)

    def is_homogeneous_tuple(tp: Any) -> bool:
        args = get_args(tp)
        return get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis

    def tuple_hook(tp: Any) -> Callable[[Any, Any], Any]:
        elements = homogenous_tuple_structure_factory(tp, conv)

        def hook(value: Any, _: Any) -> Any:
            if not isinstance(value, list):
                raise WireTypeError(f"expected an array, got {json_kind(value)}")
            return elements(value, tp)

        return hook

    conv.register_structure_hook_factory(is_homogeneous_tuple, tuple_hook)


def register_wire_class(cls: type, *, tolerant: bool = False, overrides: Mapping[str, Any] | None = None) -> None:
    """Give ``converter`` the wire form of an attrs class of a layer above: camelCase keys,
    ``None`` fields left out, an object required, unknown keys refused unless
    ``tolerant``. ``overrides``: cattrs ``override``s by field name (they replace the
    camelCase rename of that field). Register nested classes before the ones holding them."""
    renames: dict[str, Any] = {f.name: override(rename=camel(f.name)) for f in attrs.fields(cls) if "_" in f.name}
    renames.update(overrides or {})
    structure: Callable[[Any, Any], Any] = make_dict_structure_fn(
        cls, converter, _cattrs_forbid_extra_keys=not tolerant, **renames
    )
    unstructure: Callable[[Any], dict[str, Any]] = make_dict_unstructure_fn(cls, converter, **renames)

    def structure_object(value: Any, tp: Any) -> Any:
        if not isinstance(value, dict):
            raise WireTypeError(f"expected an object, got {json_kind(value)}")
        return structure(value, tp)

    def unstructure_object(value: Any) -> dict[str, Any]:
        return {k: v for k, v in unstructure(value).items() if v is not None}

    converter.register_structure_hook(cls, structure_object)
    converter.register_unstructure_hook(cls, unstructure_object)


def _make_converter() -> tuple[cattrs.Converter, Callable[[Message], dict[str, Any]]]:
    """The converter, and its Message hook (called directly on the hot path)."""
    conv = cattrs.Converter(omit_if_default=False)
    _register_json_policy(conv)

    def register_camel(cls: type, *, omit_none: bool = True) -> None:
        overrides: dict[str, Any] = {
            f.name: override(rename=camel(f.name)) for f in attrs.fields(cls) if "_" in f.name
        }
        unstructure: Callable[[Any], dict[str, Any]] = make_dict_unstructure_fn(cls, conv, **overrides)
        structure: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, conv, **overrides)

        def unstructure_hook(value: Any) -> dict[str, Any]:
            raw = unstructure(value)
            return {k: v for k, v in raw.items() if v is not None} if omit_none else raw

        conv.register_unstructure_hook(cls, unstructure_hook)
        conv.register_structure_hook(cls, structure)

    for cls in (*_BLOCK_TAGS, UserSource, SkillInvocationSource, ToolSource, SessionHeader):
        register_camel(cls)

    def unstructure_block(block: Block) -> dict[str, Any]:
        return {"type": _BLOCK_TAGS[type(block)], **conv.unstructure(block, type(block))}

    def structure_block(raw: Any, _: Any) -> Block:
        if not isinstance(raw, dict) or raw.get("type") not in _BLOCK_BY_TAG:
            raise InvalidMessageError(f"unknown content block {raw!r}")
        fields = {k: v for k, v in raw.items() if k != "type"}
        return conv.structure(fields, _BLOCK_BY_TAG[raw["type"]])

    def unstructure_source(source: Source) -> dict[str, Any]:
        if isinstance(source, ProducerSource):
            return {"kind": source.kind, **source.fields}
        return cast(dict[str, Any], conv.unstructure(source, type(source)))

    def structure_source(raw: Any, _: Any) -> Source:
        if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
            raise InvalidMessageError(f"a message source needs a string kind, got {raw!r}")
        cls = _BUILTIN_SOURCES.get(raw["kind"])
        if cls is not None:
            return conv.structure(raw, cls)
        return ProducerSource(raw["kind"], {k: v for k, v in raw.items() if k != "kind"})

    conv.register_unstructure_hook(Block, unstructure_block)
    conv.register_structure_hook(Block, structure_block)
    conv.register_unstructure_hook(Source, unstructure_source)
    conv.register_unstructure_hook(ProducerSource, unstructure_source)
    conv.register_structure_hook(Source, structure_source)

    # Every message of every step goes to the wire: the shipped block and source types
    # take a direct path (the same dicts the hooks above make, checked by the tests).
    fast_blocks = _direct_block_hooks()
    fast_sources = _direct_source_hooks()

    def unstructure_message(message: Message) -> dict[str, Any]:
        content = []
        for block in message.content:
            hook = fast_blocks.get(type(block))
            content.append(hook(block) if hook is not None else unstructure_block(block))
        out: dict[str, Any] = {"id": message.id, "role": message.role, "content": content}
        source = message.source
        if source is not None:
            hook = fast_sources.get(type(source))
            out["source"] = hook(source) if hook is not None else unstructure_source(source)
        return out

    def structure_message(raw: Any, _: Any) -> Message:
        if not isinstance(raw, dict):
            raise InvalidMessageError(f"a message must be an object, got {raw!r}")
        try:
            source = raw.get("source")
            role = raw["role"]
            return Message(
                id=raw["id"],
                # The decoder makes a new string per message; an agent keeps its messages.
                role=cast(Role, _ROLES.get(role, role)),  # checked by Message
                content=tuple(_fast_block(b) or structure_block(b, Block) for b in raw["content"]),
                source=(_fast_source(source) or structure_source(source, Source)) if source else None,
            )
        except (KeyError, TypeError, cattrs.BaseValidationError) as exc:
            raise InvalidMessageError(f"malformed message {raw!r}: {exc}") from exc

    conv.register_unstructure_hook(Message, unstructure_message)
    conv.register_structure_hook(Message, structure_message)
    return conv, unstructure_message


# Reading a transcript back from the store builds every message again: the shipped
# block and source shapes, exactly as the hooks above write them, are built directly
# (anything else, extra keys included, goes through cattrs as before; tests compare both).


_ROLES: dict[str, Role] = {role: role for role in get_args(Role)}


def _fast_block(raw: Any) -> Block | None:
    if type(raw) is not dict:
        return None
    tag = raw.get("type")
    if tag == "text" and len(raw) == 2:
        text = raw.get("text")
        return TextBlock(text) if type(text) is str else None
    if tag == "tool-call" and len(raw) == 4:
        call_id, name, arguments = raw.get("callId"), raw.get("name"), raw.get("arguments")
        if type(call_id) is str and type(name) is str and type(arguments) is str:
            return ToolCallBlock(call_id, name, arguments)
    elif tag == "tool-result" and len(raw) == 4:
        call_id, content, is_error = raw.get("callId"), raw.get("content"), raw.get("isError")
        if type(call_id) is str and type(content) is str and type(is_error) is bool:
            return ToolResultBlock(call_id, content, is_error)
    return None


def _fast_source(raw: Any) -> Source | None:
    if type(raw) is not dict:
        return None
    kind = raw.get("kind")
    if kind == "user" and len(raw) == 1:
        return PERSON  # frozen: one instance serves every person's message
    if kind == "tool" and len(raw) == 2 and type(raw.get("callId")) is str:
        return ToolSource(raw["callId"])
    return None


def _direct_block_hooks() -> dict[type, Callable[[Any], dict[str, Any]]]:
    def image(b: ImageBlock) -> dict[str, Any]:
        return {"type": "image", "mediaType": b.media_type, "data": b.data}

    def reasoning(b: ReasoningBlock) -> dict[str, Any]:
        out = {"type": "reasoning", "text": b.text}
        if b.signature is not None:
            out["signature"] = b.signature
        if b.redacted_data is not None:
            out["redactedData"] = b.redacted_data
        return out

    return {
        TextBlock: lambda b: {"type": "text", "text": b.text},
        ReasoningBlock: reasoning,
        ImageBlock: image,
        ToolCallBlock: lambda b: {"type": "tool-call", "callId": b.call_id, "name": b.name, "arguments": b.arguments},
        ToolResultBlock: lambda b: {"type": "tool-result", "callId": b.call_id, "content": b.content, "isError": b.is_error},
    }


def _direct_source_hooks() -> dict[type, Callable[[Any], dict[str, Any]]]:
    def user(s: UserSource) -> dict[str, Any]:
        return {"kind": "user"} if s.rpc_id is None else {"rpcId": s.rpc_id, "kind": "user"}

    return {
        UserSource: user,
        SkillInvocationSource: lambda s: {"name": s.name, "form": s.form, "kind": "skill-invocation"},
        ToolSource: lambda s: {"callId": s.call_id, "kind": "tool"},
        ProducerSource: lambda s: {"kind": s.kind, **s.fields},
    }


converter, _message_to_wire = _make_converter()


def message_to_wire(message: Message) -> dict[str, Any]:
    # Every recorded message goes through here: its hook, without cattrs' dispatch.
    return _message_to_wire(message)


def message_from_wire(raw: Any) -> Message:
    return converter.structure(raw, Message)


def source_to_wire(source: Source) -> dict[str, Any]:
    return cast(dict[str, Any], converter.unstructure(source, Source))


def source_from_wire(raw: Any) -> Source:
    # A Union is a valid cattrs target (its hook is registered above); the stubs take classes only.
    return converter.structure(raw, Source)  # type: ignore[arg-type]


def header_to_wire(header: SessionHeader) -> dict[str, Any]:
    return cast(dict[str, Any], converter.unstructure(header, SessionHeader))


def header_from_wire(raw: Any) -> SessionHeader:
    return converter.structure(raw, SessionHeader)


def event_to_wire(event: Event) -> dict[str, Any]:
    return {"type": event.type, "seq": event.seq, "time": event.time, "data": event.data}


def event_from_wire(raw: Any) -> Event:
    return Event(type=raw["type"], seq=raw["seq"], time=raw["time"], data=raw["data"])
