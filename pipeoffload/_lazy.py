"""Package names that load on first use, for a package whose ``__init__`` must import nothing heavy
(``pipeoffload``: a Ctrl-C from the command's first line; ``pipeoffload.runtime``: no torch until a
name is used, so a missing torch is one line, not a traceback)."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str], namespace: dict[str, Any]
               ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` (PEP 562) of ``package``: each name of ``homes``
    (name -> submodule) is imported from its submodule on first use and kept in ``namespace`` (the
    package's globals), so later uses find it at once; ``__dir__`` lists the names not loaded yet too."""

    def load(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted({*namespace, *homes})

    return load, names
