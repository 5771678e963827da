"""Timing both sides of a comparison round by round, and telling clean rounds from noisy ones.

Every case runs once per round and the order reverses every other round, so both sides of
a ratio see the same conditions. A case keeps its best clean round: on a shared machine
noise only ever adds time, so the minimum is the most repeatable estimate of what the code
itself costs. A round is clean if, meanwhile, other processes (or the host, as steal time)
took at most 5% of a core anywhere on the machine, plus two clock ticks.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    """One progress line on stderr; run_all forwards these lines from child processes."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the machine spent busy or stolen by the host, CPU seconds of this process).

    Machine-wide also for a process pinned to one CPU: the other vCPU of a VM may share its
    physical core, caches and memory bandwidth. The first is NaN where /proc/stat is
    missing; then no round can be judged clean.
    """
    own = os.times()
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return math.nan, own.user + own.system
    # user nice system idle iowait irq softirq steal: all but idle and iowait is CPU in use.
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / _CLOCK_TICKS, own.user + own.system


@dataclass
class Timed:
    """One side of a comparison: a callable returning the work it did, and its timings."""

    name: str
    run: Callable[[], int]
    work: int  # values or bytes a run must report, so no side can silently do less
    seconds: list[float] = field(default_factory=list)
    clean: list[bool] = field(default_factory=list)

    @property
    def pool(self) -> list[float]:
        """Clean rounds if there are any: a round that shared the CPU measures the neighbours."""
        clean = [t for t, ok in zip(self.seconds, self.clean, strict=True) if ok]
        return clean or self.seconds

    @property
    def clean_rounds(self) -> int:
        return sum(self.clean)

    @property
    def best(self) -> float:
        return min(self.pool)

    @property
    def median(self) -> float:
        return statistics.median(self.pool)

    @property
    def rate(self) -> float:
        """Work per second in the best round."""
        return self.work / self.best


def time_once(case: Timed) -> tuple[float, bool]:
    """Seconds of one run, and whether other processes left the machine to it meanwhile."""
    busy0, own0 = cpu_seconds()
    start = time.perf_counter()
    done = case.run()
    elapsed = time.perf_counter() - start
    busy1, own1 = cpu_seconds()
    if done != case.work:
        raise RuntimeError(f"{case.name}: did {done} units of work, expected {case.work}")
    others = (busy1 - busy0) - (own1 - own0)
    return elapsed, others <= 0.05 * elapsed + 2 / _CLOCK_TICKS


def time_round_robin(
    cases: Sequence[Timed], rounds: int, *, min_clean: int, budget_s: float, warmup: int = 1
) -> None:
    """Run every case once per round, alternating the order so no case always goes first.

    After `rounds` rounds, keep going until every case has `min_clean` clean rounds or
    `budget_s` seconds (from the start) have passed: other jobs come and go.
    """
    deadline = time.monotonic() + budget_s
    r = 0
    while True:
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for case in order:
            elapsed, clean = time_once(case)
            if r >= warmup:
                case.seconds.append(elapsed)
                case.clean.append(clean)
        r += 1
        if r - warmup < rounds:
            continue
        if all(c.clean_rounds >= min_clean for c in cases) or time.monotonic() > deadline:
            return


def noisy(*sides: Timed, min_clean: int) -> bool:
    """Whether a comparison lacks the clean rounds it wanted on either side."""
    return min(s.clean_rounds for s in sides) < max(min_clean, 1)
