"""Defects a review of session 18's changes found (s18-review); each test fails on the code before its fix."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_train_probe_d import train_terminated_in


def test_sigterm_while_the_one_rank_builds_its_model_says_interrupted(tmp_path: Path) -> None:
    """Was 'failed: rank 0: RankError: rank 0 failed while building its stages of the model: Interrupted', exit 1."""
    # the CLI's SIGTERM handler raises Interrupted there, in ``mesh.doing``: ``fit`` has not taken the signal yet
    done = train_terminated_in("pipeoffload.train.model", "gpt_rank_model", tmp_path)
    assert done.returncode == 143, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeoffload train: interrupted (SIGTERM)") and "RankError" not in done.stderr


def test_the_clis_interrupted_passes_doing_unchanged() -> None:
    from pipeoffload.train.launch import Interrupted
    from pipeoffload.train.mesh import doing

    with pytest.raises(Interrupted), doing(0, "loading the training data"):
        raise Interrupted(15, "")
