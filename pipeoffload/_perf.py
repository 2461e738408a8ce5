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


class Memo:
    """Results of pure functions, kept by the computation that asks for them again.

    ``memo(fn, *args)`` is ``fn(*args)``, computed the first time these arguments come and returned
    again for equal ones: the key is the function and its arguments *by value* (schedules, cost models,
    policies are hashable immutable values), so an equal schedule built anew finds the same entry and
    no argument's identity matters. ``fn`` must depend on its arguments only; what it returns is shared,
    so callers treat it as read-only. The ``keep`` most recently used results per function are kept.

    A search creates one and passes it down to what it calls (``lower_with_report``, ``plan_offload``,
    ``simulate_choice``); a call given none makes its own, which lives as long as that call. Nothing is
    stored on the values themselves and nothing is module-global.
    """

    __slots__ = ("keep", "_kept")

    def __init__(self, keep: int = 256) -> None:
        self.keep = keep
        self._kept: dict[Callable[..., Any], dict[tuple, Any]] = {}

    def __call__(self, fn: Callable[..., T], *args: Hashable) -> T:
        return self.get((fn, *args), lambda: fn(*args))

    def get(self, key: tuple, make: Callable[[], T]) -> T:
        """``make()``, kept under ``key``: a tuple whose first item names the computation (a function)
        and whose others are every value ``make``'s result depends on."""
        kept = self._kept.setdefault(key[0], {})
        rest = key[1:]
        if rest in kept:
            value = kept.pop(rest)  # re-inserted below: the most recently used come last
        else:
            value = make()
            if len(kept) >= self.keep:
                del kept[next(iter(kept))]
        kept[rest] = value
        return value  # type: ignore[no-any-return]

    def peek(self, fn: Callable[..., T], *args: Hashable) -> T | None:
        """What ``self(fn, *args)`` would return if it is already known, else None (computes nothing)."""
        return self._kept.get(fn, {}).get(args)  # type: ignore[no-any-return]
