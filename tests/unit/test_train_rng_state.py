"""Random-number states are saved as tensors and restored exactly; a file of the old pickled format
is not unpickled (it could run code)."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pipeoffload.train.checkpoint import load_rng, rng_state, set_rng_state  # noqa: E402


def _draw() -> tuple:
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), np.random.randn(), random.random(), random.gauss(0, 1)


def test_states_round_trip_through_a_weights_only_load(tmp_path: Path) -> None:
    random.gauss(0, 1)  # leaves a cached gauss value in python's state
    np.random.randn()
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = _draw()
    _draw()
    state = load_rng(tmp_path / "rng.pt")
    assert state is not None
    set_rng_state(state)
    assert _draw() == expected


class _Touch:
    """Unpickling it creates a file: code run by loading."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (self.path,))


def test_an_old_pickled_file_is_not_unpickled(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "pwned"
    payload = _Touch(target)
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "x": payload}, tmp_path / "rng.pt")
    assert load_rng(tmp_path / "rng.pt") is None
    assert not target.exists()
    assert "old pickled format" in caplog.text
