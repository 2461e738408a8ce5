import os
from pathlib import Path

import pytest

from pipeoffload.costs import CostModel


@pytest.fixture
def unit_costs() -> CostModel:
    """F = I = W = 1 per stage, zero communication: the costs the paper's formulas assume."""
    return CostModel.uniform(1.0, 1.0, 1.0)


def regen_golden() -> bool:
    """Set PIPEOFFLOAD_REGEN_GOLDEN=1 to rewrite golden files instead of comparing with them."""
    return os.environ.get("PIPEOFFLOAD_REGEN_GOLDEN") == "1"


GOLDEN = Path(__file__).parent / "golden"


def check_golden(filename: str, text: str) -> None:
    """Compare ``text`` with ``tests/golden/<filename>`` (or rewrite it when regenerating)."""
    path = GOLDEN / filename
    if regen_golden():
        path.write_text(text)
    assert path.read_text() == text
