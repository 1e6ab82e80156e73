"""The benchmarks' GC-pause recorder: collections in several threads, and a recorder
entered while another thread's collection is under way (a collector callback may hand the
GIL to another thread, which can then register the recorder between a start and its stop)."""

import gc
import threading

from loopdock.benchmarks._agents import GcPauses


def test_a_stop_without_its_start_is_skipped() -> None:
    pauses = GcPauses()
    pauses._callback("stop", {"generation": 0, "collected": 0, "uncollectable": 0})
    assert pauses.pauses == [] and pauses.by_generation == [0, 0, 0]
    assert pauses.summary()["collections"] == 0


def test_starts_are_kept_per_thread() -> None:
    pauses = GcPauses()
    info = {"generation": 1, "collected": 0, "uncollectable": 0}
    pauses._callback("start", info)  # this thread's collection starts...
    other = threading.Thread(target=pauses._callback, args=("stop", info))
    other.start()  # ...another thread's stop, whose start was not seen, changes nothing
    other.join()
    assert pauses.pauses == []
    pauses._callback("stop", info)
    assert len(pauses.pauses) == 1 and pauses.by_generation == [0, 1, 0]
    assert 0 <= pauses.pauses[0] < 60 and 0 <= pauses.cpu[0] < 60


def test_real_collections_in_another_thread_are_recorded() -> None:
    with GcPauses() as pauses:
        worker = threading.Thread(target=gc.collect, args=(0,))
        worker.start()
        worker.join()
        gc.collect(0)
    assert pauses.by_generation[0] >= 2
    assert len(pauses.pauses) == len(pauses.cpu) == sum(pauses.by_generation)
    assert max(pauses.pauses) < 60
