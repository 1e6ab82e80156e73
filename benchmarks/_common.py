"""Small shared pieces: percentiles, memory readings, the machine description, progress."""

from __future__ import annotations

import datetime
import gc
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

# A worker process reports progress on stderr as "<prefix><fraction> <label>" lines.
PROGRESS_PREFIX = "@@progress "

#: ``progress(fraction, label)``: fraction in [0, 1] of the current phase.
Progress = Callable[[float, str], None]


def no_progress(fraction: float, label: str) -> None:
    return None


def waves_for(n: int, k: int, min_turns: int) -> int:
    """How many waves of ``n`` fresh agents (``k`` turns each) reach ``min_turns``."""
    return max(1, math.ceil(min_turns / (n * k)))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p99/max of durations given in seconds, in milliseconds."""
    return {
        "p50_ms": percentile(seconds, 50) * 1e3,
        "p99_ms": percentile(seconds, 99) * 1e3,
        "max_ms": (max(seconds) if seconds else 0.0) * 1e3,
        "samples": len(seconds),
    }


def rss_bytes() -> int:
    """The process's current resident set size (VmRSS), in bytes."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # No /proc (macOS): the peak is the best we have.
    return peak_rss_bytes()


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process ``pid`` so far (every thread), from
    /proc/PID/stat; None where there is no /proc (or no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name, in parentheses, may hold spaces: fields count after it.
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_bytes() -> int:
    """The process's peak resident set size (getrusage ru_maxrss); 0 where there is none."""
    try:
        import resource  # POSIX only
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def settled_rss() -> int:
    """RSS after a full garbage collection, so deltas compare live memory."""
    gc.collect()
    return rss_bytes()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu_model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gb = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "memory_gb": round(memory_gb, 1) if memory_gb else None,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "trio": _version("trio"),
        "loopdock": _version("loopdock"),
        "autogen_core": _version("autogen-core"),
        "git_commit": _git_commit(),
        "load_average_at_start": load_average(),
    }


def load_average() -> list[float] | None:
    """1/5/15-minute load averages: how much else ran on this (possibly shared) machine."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


class ProgressBar:
    """A one-line progress bar on a terminal; one line per phase elsewhere (CI logs)."""

    WIDTH = 30

    def __init__(self, total_weight: float, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = max(total_weight, 1e-9)
        self.done = 0.0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._weight = 0.0
        self._label = ""

    def phase(self, label: str, weight: float) -> Progress:
        """Start a phase worth ``weight`` of the total; returns its progress callback."""
        self._label, self._weight = label, weight
        self._draw(0.0, force=True)

        def progress(fraction: float, detail: str = "") -> None:
            self._draw(min(max(fraction, 0.0), 1.0), detail)

        return progress

    def end_phase(self) -> None:
        self.done += self._weight
        self._draw(0.0, force=True, ended=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()

    def _draw(self, fraction: float, detail: str = "", *, force: bool = False, ended: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        share = min((self.done + fraction * self._weight) / self.total, 1.0)
        filled = int(share * self.WIDTH)
        elapsed = now - self.started
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        text = f"[{bar}] {share * 100:3.0f}% {elapsed:6.1f}s  {self._label}"
        if detail:
            text += f" ({detail})"
        if self.tty:
            self.stream.write("\r" + text[:99].ljust(99))
            self.stream.flush()
        elif ended:
            self.stream.write(f"bench: done {self._label} [{share * 100:3.0f}%, {elapsed:.1f}s]\n")
            self.stream.flush()
