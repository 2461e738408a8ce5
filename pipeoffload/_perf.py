"""Performance helpers for the pure core's hot loops."""
from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


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


def remembered(owner: Any, name: str, key: Hashable, make: Callable[[], T], keep: int) -> T:
    """``make()``, remembered on ``owner`` (an immutable value such as a Schedule or a Timeline) under
    ``key``, in a dict named ``name`` beside its fields; the ``keep`` most recent keys are kept.

    A cache, not state: ``make`` must depend only on ``owner`` and ``key``. Schedules leave such names
    (they start with ``_``) out when pickled.
    """
    kept = owner.__dict__.get(name)
    if kept is None:
        kept = {}
        object.__setattr__(owner, name, kept)
    if key not in kept:
        if len(kept) >= keep:
            del kept[next(iter(kept))]
        kept[key] = make()
    return kept[key]  # type: ignore[no-any-return]


def recalled(owner: Any, name: str, key: Hashable) -> Any:
    """What ``remembered`` keeps on ``owner`` under ``name`` and ``key``, or None."""
    return owner.__dict__.get(name, {}).get(key)
