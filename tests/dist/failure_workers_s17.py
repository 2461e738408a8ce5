"""Rank functions for ``test_failure_s17`` (importable by name: spawned ranks receive them pickled)."""
from __future__ import annotations

import threading
from typing import Any


def returns_an_unpicklable_value(rank: int, world: int) -> Any:
    """Returns what ``pickle`` refuses (a lock): the result cannot travel back to the launcher."""
    return threading.Lock()
