"""Progress while a run goes on, for the command line.

On a terminal: one bar for the run and one per cell, redrawn in place. Elsewhere (a log
file, CI, a pipe): one line per finished attempt, which is also what a program watching
the run can read.
"""

from __future__ import annotations

import time
from typing import TextIO

from ._runner import Progress
from ._text import cut

REASON_WIDTH = 160  # of a failure's reason on one progress line
BAR_WIDTH = 24


def _bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    return "#" * filled + "." * (BAR_WIDTH - filled)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1s"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class ProgressDisplay:
    def __init__(self, out: TextIO, *, tty: bool, currency: str) -> None:
        self._out = out
        self._tty = tty
        self._currency = currency
        self._drawn = 0  # lines of the last redraw, to move back over
        self._last_failure = ""
        self.done = 0  # rollouts with a score, as the newest progress said
        self.total = 0
        self._started = time.monotonic()
        self._done_at_start = 0

    def __call__(self, progress: Progress) -> None:
        self.done, self.total = progress.done, progress.total
        if progress.kind == "planned":
            self._done_at_start = progress.done
            self._started = time.monotonic()
            print(f"experiment: {progress.total} rollouts, {progress.note}", file=self._out, flush=True)
        elif self._tty:
            self._redraw(progress)
        elif progress.result is not None:
            self._line(progress)

    def interrupted(self) -> None:
        """The run stopped: leave the terminal below the bars."""
        self._drawn = 0

    def _line(self, progress: Progress) -> None:
        r = progress.result
        assert r is not None
        outcome = f"scored {r.value:g}" if r.value is not None else (progress.note or r.status)
        if r.error:
            outcome += f" ({cut(r.error, REASON_WIDTH)})"
        print(
            f"[{progress.done}/{progress.total}] {outcome}: task {r.task} sample {r.sample} "
            f"{r.model_label} x {r.loop_label} repeat {r.repeat} attempt {r.attempt} "
            f"({r.steps} turn{'' if r.steps == 1 else 's'}, {r.input_tokens + r.output_tokens} tokens)",
            file=self._out,
            flush=True,
        )

    def _redraw(self, progress: Progress) -> None:
        finished_here = progress.done - self._done_at_start
        elapsed = time.monotonic() - self._started
        left = progress.total - progress.done
        eta = f", about {_duration(elapsed / finished_here * left)} left" if finished_here and left else ""
        lines = [
            f"[{_bar(progress.done, progress.total)}] {progress.done}/{progress.total} scored, "
            f"{progress.failed} failed, {progress.running} running, spent {progress.spent:.4g} {self._currency}{eta}"
        ]
        width = max((len(label) for label, _, _ in progress.cells), default=0)
        lines += [f"  {label:<{width}}  [{_bar(done, total)}] {done}/{total}" for label, done, total in progress.cells]
        r = progress.result
        if r is not None and r.error:
            self._last_failure = (f"last failure: task {r.task} sample {r.sample} {r.model_label} x {r.loop_label}: "
                                  f"{cut(r.error, REASON_WIDTH)}")  # fmt: skip
        if self._last_failure:
            lines.append(self._last_failure)
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self._out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self._out.flush()
        self._drawn = len(lines)
