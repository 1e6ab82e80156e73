"""Transcript snapshots: stable under later appends, equal to the tuple they stand for,
and their running totals equal the sums ping would otherwise compute."""

from hypothesis import given
from hypothesis import strategies as st

from loopdock.runtime._messages import Message, TextBlock, ToolCallBlock
from loopdock.runtime._transcript import Transcript, tool_call_count, word_count


def message(words: int, calls: int) -> Message:
    blocks = [TextBlock(" ".join(["w"] * words))] if words else []
    blocks += [ToolCallBlock(f"c{i}", "tool", "{}") for i in range(calls)]
    return Message("assistant", tuple(blocks))


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=30), st.integers(0, 30))
def test_a_snapshots_totals_are_the_sums_of_its_messages(shapes, cut):
    messages = [message(w, c) for w, c in shapes]
    transcript = Transcript(messages[: min(cut, len(messages))])
    view = transcript.snapshot()
    for m in messages[min(cut, len(messages)) :]:
        transcript.append(m)  # later appends do not show in the snapshot
    expected = tuple(messages[: min(cut, len(messages))])
    assert view == expected and tuple(view) == expected and len(view) == len(expected)
    assert hash(view) == hash(expected)
    assert word_count(view) == word_count(expected) == sum(m.word_count for m in expected)
    assert tool_call_count(view) == tool_call_count(expected) == sum(len(m.tool_calls) for m in expected)
    if expected:
        assert view[-1] is expected[-1] and view[1:] == expected[1:]
    assert list(reversed(view)) == list(reversed(expected))


def test_a_transcripts_characters_are_its_messages_content_however_it_was_built():
    from loopdock.runtime._messages import ImageBlock, ReasoningBlock, ToolResultBlock

    blocks = (
        TextBlock("héllo"), ReasoningBlock("think"), ToolCallBlock("c1", "read_file", '{"p": 1}'),
        ToolResultBlock("c1", "x" * 1000), ImageBlock("image/png", "QUJD"),
    )
    full = Message("assistant", blocks)
    assert full.content_chars == 5 + 5 + len("read_file") + len('{"p": 1}') + 1000 + 4
    messages = [full, message(3, 1), Message("user", ())]
    built, appended = Transcript(messages[:2]), Transcript()
    built.append(messages[2])
    for m in messages:
        appended.append(m)
    expected = sum(m.content_chars for m in messages)
    assert built.content_chars == appended.content_chars == expected
    assert Transcript().content_chars == 0
