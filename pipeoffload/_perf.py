"""Performance helpers for the pure core's hot loops."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around a loop that allocates many small acyclic tuples.

    Simulating or validating a schedule creates one tuple per action and frees none until the end;
    each generation-2 collection would rescan all of them, which makes big schedules superlinear.
    The previous state is restored on exit.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
