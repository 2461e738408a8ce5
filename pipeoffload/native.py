"""The optional compiled loops (``_native.c``), or None: the one place that loads them.

A module built from another version of ``_native.c`` (a checkout updated without ``make setup``) is
not used: its functions could take other arguments or compute something else. The module carries
the SHA-256 of the source it was built from; when the source is next to it and differs, the pure-Python
loops run and a warning says how to rebuild.
"""
from __future__ import annotations

import importlib
import logging
from types import ModuleType

log = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    try:  # by name: an extension module that may be absent (and not an import of the package root)
        _native = importlib.import_module("pipeoffload._native")
    except ImportError:
        return None
    from pipeoffload._native_build import SOURCE, source_digest

    if SOURCE.exists() and getattr(_native, "SOURCE_DIGEST", None) != source_digest(SOURCE):
        log.warning("pipeoffload._native was built from another version of _native.c: using the Python loops "
                    "(run `make setup` to rebuild it)")
        return None
    return _native


compiled: ModuleType | None = _load()
