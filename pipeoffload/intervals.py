"""Busy intervals of one exclusive resource (a copy engine or a shared host link).

The interval structure of the offload pass: it searches and books copy lanes while planning
(``conflict``, ``add``, ``remove``, the neighbouring ends). Intervals never overlap and are kept
sorted, so starts and ends are both sorted lists searched by bisection. (The simulator needs no
intervals: its engines and links serve copies in order, so each keeps only the time it is free.)
"""
from __future__ import annotations

import bisect

EPS = 1e-10  # planning tolerance: times closer than this are the same instant


class Intervals:
    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

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
