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


def test_emit_names_the_plan_it_wrote_by_its_rank_not_a_table_row_not_shown(tmp_path: Path) -> None:
    """With --top 1 the table shows plan 1 alone; the command said 'plan #2 of the table' (no such row)."""
    from tests.conftest import run_cli
    from tests.unit.test_plan_truth_s18 import SMALL_K

    code, out, err = run_cli("plan", *SMALL_K, "--seq", "64", "--gpus", "4", "--pp", "4", "--schedules",
                             "group-interleaved", "--memory", "0.0039", "--no-pareto", "--top", "1",
                             "--emit", str(tmp_path / "run.toml"))
    assert code == 0, err
    assert "of the table" not in out and "(plan #2 of the 2 that fit, PP4xTP1xDP1 group-interleaved" in out
