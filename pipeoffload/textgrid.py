"""A step x rank text grid of a schedule's actions, one of its text forms beside ``ir``'s text, CSV and
JSON: used by ``ScheduleError`` messages and ``pipeoffload show``. It needs nothing but each action's text
(``str``), so the error type at the bottom of the core can draw it without importing the IR above it."""
from __future__ import annotations

from collections.abc import Sequence

_WINDOW = 12  # steps shown either side of a marked step: whole grids of big schedules drown the error


def render_grid(
    ranks: Sequence[Sequence[object]], mark: tuple[int, int | None] | None = None, window: int | None = None
) -> str:
    """Rows are steps, columns ranks. ``mark=(rank, step)`` flags one cell and shows nearby steps only."""
    steps = max((len(r) for r in ranks), default=0)
    first, last = 0, steps
    if mark is not None and mark[1] is not None:
        span = _WINDOW if window is None else window
        first, last = max(0, mark[1] - span), min(steps, mark[1] + span + 1)
    cells = [[str(r[i]) if i < len(r) else "" for r in ranks] for i in range(first, last)]
    width = max([len(f"rank {len(ranks) - 1}")] + [len(c) for row in cells for c in row])
    header = "step | " + " | ".join(f"rank {r}".ljust(width) for r in range(len(ranks)))
    lines = [header, "-" * len(header)]
    if first > 0:
        lines.append("  ...")
    for offset, row in enumerate(cells):
        step = first + offset
        text = f"{step:4d} | " + " | ".join(c.ljust(width) for c in row)
        if mark is not None and mark[1] == step:
            text += f"   <-- rank {mark[0]}: ERROR HERE"
        lines.append(text.rstrip())
    if last < steps:
        lines.append("  ...")
    return "\n".join(lines)
