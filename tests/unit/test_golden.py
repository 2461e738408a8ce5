"""Golden text forms of small configurations of every classic generator.

Regenerate after an intended change with ``python -m tests.regen_golden``.
Families added by other modules keep their own golden tests next to their unit tests.
"""

import pytest

from pipeoffload import generate
from tests.conftest import check_golden

CASES = [
    ("gpipe", 3, 4, 1), ("gpipe", 2, 3, 2),
    ("1f1b", 4, 6, 1), ("1f1b", 3, 2, 1),
    ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 2, 4, 3), ("interleaved-1f1b", 4, 3, 2),
]


@pytest.mark.parametrize("name,d,m,v", CASES)
def test_generator_matches_golden_text(name: str, d: int, m: int, v: int) -> None:
    check_golden(f"{name}_d{d}_m{m}_v{v}.txt", generate(name, d, m, v).to_text())
