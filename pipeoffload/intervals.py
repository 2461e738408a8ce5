"""Busy intervals of one exclusive resource (a copy engine or a shared host link).

The one interval structure of the package: the simulator reserves copies on it as they are issued
(``reserve``: the earliest gap at or after a time), the offload pass searches and books it while
planning (``conflict``, ``add``, ``remove``, the neighbouring ends). Intervals never overlap and are
kept sorted, so starts and ends are both sorted lists searched by bisection.
"""
from __future__ import annotations

import bisect

EPS = 1e-10  # planning tolerance: times closer than this are the same instant
RESERVE_EPS = 1e-12  # the simulator's tolerance when fitting a copy into a gap


class Intervals:
    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def reserve(self, ready: float, duration: float) -> float:
        """Book the earliest gap of ``duration`` starting at or after ``ready``; return its start."""
        i = bisect.bisect_right(self.ends, ready)
        t = ready
        starts, ends = self.starts, self.ends
        while i < len(starts):
            if t + duration <= starts[i] + RESERVE_EPS:
                break
            t = max(t, ends[i])
            i += 1
        starts.insert(i, t)
        ends.insert(i, t + duration)
        return t

    def conflict(self, t: float, duration: float) -> tuple[float, float] | None:
        """The earliest busy interval overlapping [t, t + duration), or None.

        A zero-length copy conflicts only with an interval it would sit strictly inside, because
        the engine would still be busy when it is issued.
        """
        i = bisect.bisect_right(self.ends, t + EPS)
        if i == len(self.starts):
            return None
        start = self.starts[i]
        limit = t + duration - EPS if duration > 0 else t - EPS
        return (start, self.ends[i]) if start < limit else None

    def add(self, t: float, duration: float) -> None:
        if duration <= 0:
            return
        i = bisect.bisect_left(self.starts, t)
        self.starts.insert(i, t)
        self.ends.insert(i, t + duration)

    def remove(self, t: float, duration: float) -> None:
        if duration <= 0:
            return
        i = bisect.bisect_left(self.starts, t - EPS)
        del self.starts[i]
        del self.ends[i]

    def end_at_or_after(self, t: float) -> float | None:
        i = bisect.bisect_left(self.ends, t - EPS)
        return self.ends[i] if i < len(self.ends) else None

    def end_at_or_before(self, t: float) -> float | None:
        i = bisect.bisect_right(self.ends, t + EPS)
        return self.ends[i - 1] if i else None
