"""Build the optional compiled loops (``pipeoffload/_native.c``) in place: ``python -m pipeoffload._native_build``.

``make setup`` runs it. It needs only the C compiler and headers the Python build itself names
(``sysconfig``); without them it says so in one line and the package runs its pure-Python loops,
which give bitwise the same results, only slower. Nothing is downloaded.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("_native.c")
# no contraction into fused multiply-adds and no fast-math: the same double operations as the Python
FLAGS = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-std=c99"]


def source_digest(path: Path = SOURCE) -> str:
    """SHA-256 of the C source: built into the module, checked when it is loaded (``native.py``)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def target() -> Path:
    return SOURCE.with_name("_native" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build(quiet: bool = False) -> bool:
    """Compile ``_native.c`` next to it (atomically); False, with a note on stderr, if that fails."""
    out = target()
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        digest = f'-DPIPEOFFLOAD_SOURCE_DIGEST="{source_digest()}"'
        command = [*compiler, *FLAGS, digest, f"-I{include}", str(SOURCE), "-o", str(built), "-lm"]
        try:
            result = subprocess.run(command, capture_output=True, text=True)
        except OSError as err:
            print(f"pipeoffload: compiled loops not built ({err}); using the pure-Python loops", file=sys.stderr)
            return False
        if result.returncode != 0:
            first = (result.stderr.strip().splitlines() or ["?"])[0]
            print(f"pipeoffload: compiled loops not built ({first}); using the pure-Python loops", file=sys.stderr)
            return False
        os.replace(built, out)
    if not quiet:
        print(f"pipeoffload: built {out.name}")
    return True


if __name__ == "__main__":
    build()
