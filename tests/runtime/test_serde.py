"""Wire (de)serialisation of messages: the direct path for the shipped block and source
types makes exactly what the cattrs hooks make (same keys, same order), and round-trips."""

from __future__ import annotations

import json

import pytest

from loopdock.runtime._messages import (
    Block,
    ImageBlock,
    InvalidMessageError,
    Message,
    ProducerSource,
    ReasoningBlock,
    SkillInvocationSource,
    Source,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSource,
    UserSource,
)
from loopdock.runtime._serde import (
    _direct_block_hooks,
    _direct_source_hooks,
    converter,
    message_from_wire,
    message_to_wire,
)

BLOCKS = [
    TextBlock("hello"),
    ReasoningBlock("because"),
    ReasoningBlock("because, signed", signature="c2ln"),
    ReasoningBlock("", redacted_data="ZW5j"),
    ImageBlock("image/png", "AAAA"),
    ToolCallBlock("c1", "read_file", '{"path": "x"}'),
    ToolResultBlock("c1", "contents", True),
    ToolResultBlock("c2", "fine"),
]
SOURCES = [
    UserSource(),
    UserSource("rpc-7"),
    SkillInvocationSource("demo"),
    SkillInvocationSource("demo", "other"),
    ToolSource("c1"),
    ProducerSource("loopx-continuation", {"goalId": "g", "turnInstanceId": "t", "n": 1}),
]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: type(b).__name__)
def test_a_block_goes_to_the_wire_as_the_hooks_make_it(block):
    direct = _direct_block_hooks()[type(block)](block)
    hooked = converter.unstructure(block, Block)
    assert json.dumps(direct) == json.dumps(hooked)  # keys and their order


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: f"{type(s).__name__}-{s.kind}")
def test_a_source_goes_to_the_wire_as_the_hooks_make_it(source):
    direct = _direct_source_hooks()[type(source)](source)
    hooked = converter.unstructure(source, Source)
    assert json.dumps(direct) == json.dumps(hooked)


@pytest.mark.parametrize("source", [None, *SOURCES])
def test_messages_round_trip(source):
    message = Message("user", tuple(BLOCKS), source=source)
    wire = message_to_wire(message)
    assert list(wire) == ["id", "role", "content", *(["source"] if source else [])]
    assert message_from_wire(json.loads(json.dumps(wire))) == message


def test_the_direct_read_path_builds_what_cattrs_builds():
    """Messages read back from the store take a direct path for the shipped shapes; it
    must give exactly what the general (cattrs) path gives, and leave the rest to it."""
    from loopdock.runtime import _serde

    samples = [
        Message("user", (TextBlock("hi there"),), UserSource()),
        Message("assistant", (TextBlock("x"), ToolCallBlock("c1", "read_file", '{"path": "a"}'))),
        Message("tool", (ToolResultBlock("c1", "body", True),), ToolSource("c1")),
        Message("tool", (ToolResultBlock("c2", "ok"),), ToolSource("c2")),
        Message("user", (TextBlock("rpc"),), UserSource(rpc_id="r1")),
    ]
    for message in samples:
        wire = message_to_wire(message)
        assert message_from_wire(wire) == message
        for block in wire["content"]:
            fast = _serde._fast_block(block)
            assert fast is None or fast == _serde.converter.structure(block, _serde.Block)
    assert _serde._fast_block({"type": "text", "text": 5}) is None  # cattrs decides odd values
    assert _serde._fast_block({"type": "text", "text": "a", "extra": 1}) is None
    assert _serde._fast_source({"kind": "user", "rpcId": "r1"}) is None


def test_messages_read_back_share_what_every_message_has_alike():
    """An agent keeps its messages: one read back from the store must not hold strings and
    sources of its own for what all messages have alike (its role, a person's source)."""
    from loopdock.runtime._messages import PERSON

    for role in ("user", "assistant", "tool", "system"):
        decoded = message_from_wire(json.loads(json.dumps(message_to_wire(Message(role, (TextBlock("x"),))))))
        assert decoded.role is role
    person = message_from_wire(json.loads(json.dumps(message_to_wire(Message("user", (TextBlock("x"),), PERSON)))))
    assert person.source is PERSON
    with_rpc = message_from_wire(message_to_wire(Message("user", (TextBlock("x"),), UserSource(rpc_id="r1"))))
    assert with_rpc.source == UserSource(rpc_id="r1") and with_rpc.source is not PERSON
    with pytest.raises(InvalidMessageError, match="unknown message role"):
        message_from_wire({"id": "m1", "role": "robot", "content": []})


def test_there_is_one_converter_and_the_bridge_registers_on_it():
    from pathlib import Path

    import loopdock.bridge  # noqa: F401  (registers its frames)
    from loopdock.bridge import Hello
    from loopdock.runtime import converter

    root = Path(__file__).resolve().parents[2]
    made = [str(path.relative_to(root)) for folder in ("runtime", "actors", "bridge", "loopdock", "benchmarks")
            for path in (root / folder).rglob("*.py") if "Converter(" in path.read_text()]
    assert made == ["runtime/_serde.py"]
    # The bridge's frames are structured by that converter, under its JSON policy.
    assert converter.get_structure_hook(Hello) is not None
    with pytest.raises(ExceptionGroup) as refused:  # cattrs' ClassValidationError
        converter.structure({"token": 5, "role": "dsh-host", "protocol": 1, "capabilities": []}, Hello)
    assert [str(e) for e in refused.value.exceptions] == ["expected a string, got a number"]


@pytest.mark.parametrize(
    "content",
    [[{"type": "image", "mediaType": "image/png", "data": 5}], [{"type": "text", "text": ["a"]}], ["text"]],
)
def test_a_message_of_mistyped_blocks_is_an_invalid_message(content):
    # The converter's JSON policy: no str(5); the message path says what it is, one error type.
    with pytest.raises(InvalidMessageError):
        message_from_wire({"id": "m1", "role": "user", "content": content})
