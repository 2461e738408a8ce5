"""A read-only dict that pickles, for the mapping fields of frozen results (``types.MappingProxyType`` does
not pickle, and the planner's results cross its process pool)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ReadOnlyDict(Mapping[K, V]):
    """A copy of the items it is given that refuses changes (``d[k] = v`` is a TypeError); it compares equal
    to a dict with the same items, and ``dict(d)`` is the plain dict (what JSON output takes)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._items: dict[K, V] = dict(items)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return type(self), (self._items,)
