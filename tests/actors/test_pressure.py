"""The memory pressure judgement (actors._pressure), without trio or a runtime: fed RSS
readings, it says how many bytes to release; the runtime's side is in
test_passivation_pressure.py."""

from __future__ import annotations

import os

import pytest

from loopdock.actors import AGENT_BYTES, LOW_WATER, MemoryPressure, check_memory_limit, read_rss

MB = 1_000_000


def test_nothing_is_released_at_or_under_the_limit():
    pressure = MemoryPressure(100 * MB)
    assert pressure.judge(50 * MB) == 0
    assert pressure.judge(100 * MB) == 0
    assert not pressure.relieving and pressure.episodes == 0


def test_over_the_limit_it_asks_for_what_is_above_the_low_water_mark():
    pressure = MemoryPressure(100 * MB)
    assert pressure.low_water == int(100 * MB * LOW_WATER) == 90 * MB
    assert pressure.judge(105 * MB) == 15 * MB
    assert pressure.relieving and pressure.episodes == 1


def test_an_episode_goes_on_between_the_marks_and_ends_under_the_low_one():
    pressure = MemoryPressure(100 * MB)
    pressure.judge(105 * MB)
    # Fell under the limit, not under the low-water mark: the episode goes on.
    assert pressure.judge(95 * MB) == 5 * MB and pressure.relieving
    assert pressure.judge(90 * MB) == 0 and not pressure.relieving
    # Between the marks again: no new episode until the limit is passed.
    assert pressure.judge(95 * MB) == 0 and pressure.episodes == 1
    assert pressure.judge(101 * MB) == 11 * MB and pressure.episodes == 2


def test_what_was_released_counts_although_the_rss_does_not_fall():
    """pymalloc and malloc keep freed memory: the RSS stays, the credit stands for it, and
    the episode ends instead of asking for every agent."""
    pressure = MemoryPressure(100 * MB)
    assert pressure.judge(105 * MB) == 15 * MB
    pressure.released(15 * MB)
    assert pressure.judge(105 * MB) == 0 and not pressure.relieving
    assert pressure.held == 90 * MB and pressure.credit == 15 * MB
    for _ in range(10):  # a steady process is not judged again and again
        assert pressure.judge(105 * MB) == 0
    assert pressure.episodes == 1


def test_half_of_what_was_released_asks_for_the_rest():
    pressure = MemoryPressure(100 * MB)
    pressure.judge(105 * MB)
    pressure.released(7 * MB)
    assert pressure.judge(105 * MB) == 8 * MB and pressure.relieving


def test_the_credit_is_spent_as_the_rss_changes_either_way():
    pressure = MemoryPressure(100 * MB)
    pressure.judge(105 * MB)
    pressure.released(15 * MB)
    # 5 MB went back to the system: 10 MB of the credit are left, held 90 MB.
    assert pressure.judge(100 * MB) == 0 and pressure.credit == 10 * MB
    # The process grew by 4 MB, new objects taking what was free first: held 98 MB.
    assert pressure.judge(104 * MB) == 0 and pressure.credit == 6 * MB and pressure.held == 98 * MB
    # By 3 MB more: 107 - 3 = 104 MB held, over the limit: a new episode.
    assert pressure.judge(107 * MB) == 14 * MB and pressure.episodes == 2


def test_reactivations_spend_the_credit():
    pressure = MemoryPressure(100 * MB)
    pressure.judge(105 * MB, reactivations=3)
    pressure.released(15 * MB)
    assert pressure.judge(105 * MB, reactivations=3) == 0
    # 100 agents came back: they took about what passivating them released; judged to
    # hold 92 MB, the process is under the limit still.
    assert pressure.judge(105 * MB, reactivations=103) == 0
    assert pressure.credit == 15 * MB - 100 * AGENT_BYTES == 13 * MB
    # 500 more: 10 MB more taken, 102 MB held: over the limit.
    assert pressure.judge(105 * MB, reactivations=603) == 12 * MB
    assert pressure.credit == 3 * MB and pressure.episodes == 2


@pytest.mark.parametrize("value", [0, -1, 1.5, 2.0**30, "1GB", True, False, [1]])
def test_a_bad_limit_is_a_value_error(value):
    with pytest.raises(ValueError, match="memory_limit must be a positive number of bytes"):
        check_memory_limit(value)
    with pytest.raises(ValueError, match="memory_limit"):
        MemoryPressure(value)


def test_good_limits_pass():
    assert check_memory_limit(None) is None
    assert check_memory_limit(1) == 1
    assert check_memory_limit(2 * 2**30) == 2 * 2**30


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux's /proc")
def test_the_rss_reader_reads_the_resident_set_of_this_process():
    with open("/proc/self/status") as status:
        vm_rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    rss = read_rss()
    # The same measure, through another file, a moment apart (this test allocates little).
    assert abs(rss - vm_rss_kb * 1024) < 4 * MB
    assert rss > 10 * MB
