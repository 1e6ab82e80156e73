"""Message ids: UUID-shaped (DSH expects a UUID), unique in a process, across threads
and across processes (a fresh random prefix per process, also in a forked child)."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from loopdock import Message, TextBlock, user_message
from loopdock.runtime._ids import MESSAGE_IDS, MessageIds


def test_ids_are_version_4_rfc_4122_uuids_in_canonical_form():
    for message in (user_message("hi"), Message("assistant", (TextBlock("x"),))):
        parsed = uuid.UUID(message.id)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == message.id


def test_ids_are_unique_within_a_process_also_across_threads():
    per_thread: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        out.extend(user_message("x").id for _ in range(5000))

    threads = [threading.Thread(target=draw, args=(out,)) for out in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [i for out in per_thread for i in out]
    assert len(set(ids)) == len(ids) == 20000


def test_two_sources_never_share_a_prefix_and_an_explicit_id_is_kept():
    a, b = MessageIds(), MessageIds()
    assert a.new()[:19] != b.new()[:19]
    assert Message("user", (TextBlock("x"),), id="given").id == "given"


def test_the_counter_wraps_inside_the_suffix_and_stays_a_uuid():
    ids = MessageIds()
    ids._counter = iter([(1 << 62) - 1, 1 << 62])  # the last value, then one past it
    last, wrapped = ids.new(), ids.new()
    assert last.endswith("bfff-ffffffffffff") and wrapped.endswith("8000-000000000000")
    assert uuid.UUID(wrapped).variant == uuid.RFC_4122


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_ids_from_a_new_prefix():
    parent_id = MESSAGE_IDS.new()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        os.close(read)
        os.write(write, MESSAGE_IDS.new().encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_id = pipe.read()
    os.waitpid(pid, 0)
    uuid.UUID(child_id)
    assert child_id[:19] != parent_id[:19]
