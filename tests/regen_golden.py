"""Rewrite the golden schedule texts under tests/golden from the generators (never run by a test).

Run ``python -m tests.regen_golden`` after an intended change to a generator, then review the diff:
the golden tests only compare. Each file name encodes its configuration,
``{family}_d{ranks}_m{microbatches}_v{stages_per_rank}[_g{group_size}].txt``.
"""
from __future__ import annotations

import re
import sys

from pipeoffload.fileio import write_atomic
from pipeoffload.schedules import generate
from tests.conftest import GOLDEN

_NAME = re.compile(r"^(?P<family>.+)_d(?P<d>\d+)_m(?P<m>\d+)_v(?P<v>\d+)(?:_g(?P<g>\d+))?\.txt$")


def regenerate() -> list[str]:
    """Rewrite every golden file whose content changed; return their names."""
    changed = []
    for path in sorted(GOLDEN.glob("*.txt")):
        match = _NAME.match(path.name)
        if match is None:
            raise SystemExit(f"{path.name}: not a golden schedule name (family_dD_mM_vV[_gG].txt)")
        options = {"group_size": int(match["g"])} if match["g"] else {}
        text = generate(match["family"], int(match["d"]), int(match["m"]), int(match["v"]), **options).to_text()
        if path.read_text() != text:
            write_atomic(path, text)
            changed.append(path.name)
    return changed


if __name__ == "__main__":
    names = regenerate()
    sys.stdout.write("".join(f"rewrote {n}\n" for n in names) or "golden files are up to date\n")
