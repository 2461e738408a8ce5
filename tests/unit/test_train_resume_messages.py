"""What a refused ``--resume`` says (probe of the eleventh session): a folder that does not exist, a
corrupt config.toml of the run (not ``--config``), a damaged checkpoint with or without an earlier one to
fall back on, and a corrupt ``metrics.jsonl`` refused before the ranks start."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.checkpoint import list_checkpoints, verify
from tests.conftest import one_line_error, refused, train_process

TINY = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "2",
        "--warmup", "1", "--eval-every", "1000", "--no-progress", "--steps", "6", "--save-every", "2"]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-rank run stopped (and saved) after step 4 of 6: checkpoints step-000002 and step-000004."""
    pytest.importorskip("torch")
    run = tmp_path_factory.mktemp("resume") / "run"
    done = train_process(*TINY, "--stop-at", "4", "--out", str(run))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in list_checkpoints(run)] == ["step-000002", "step-000004"]
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_a_resume_folder_that_does_not_exist_is_named_so(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    err = refused(f"train --resume {missing}", "no such folder", str(missing))
    assert "config.toml" not in err


def test_a_corrupt_config_toml_is_named_as_the_runs_not_as_config(tmp_path: Path) -> None:
    run = tmp_path / "c7"
    run.mkdir()
    (run / "config.toml").write_text("[model\nlayers = 2\n")
    err = refused(f"train --resume {run}", f"--resume {str(run)!r}", "the run's config.toml", "not valid TOML")
    assert "--config" not in err


def test_a_corrupt_config_toml_under_resume_keyword_is_named_so(tmp_path: Path) -> None:
    from pipeoffload.train.config import load_saved

    (tmp_path / "config.toml").write_text("= 1\n")
    with pytest.raises(ConfigError) as info:
        load_saved(tmp_path, "resume=")
    assert str(info.value).startswith(f"resume={str(tmp_path)!r}: the run's config.toml")


def test_a_damaged_checkpoint_suggests_the_previous_one_only_where_there_is_one(saved_run: Path,
                                                                                tmp_path: Path) -> None:
    run = _copy(saved_run, tmp_path)
    first, last = list_checkpoints(run)
    manifest = (last / "manifest.json").read_text()
    (last / "manifest.json").unlink()
    with pytest.raises(ConfigError) as info:
        verify(last)
    assert "resume from the previous one (step-000002)" in str(info.value)
    shutil.rmtree(first)
    with pytest.raises(ConfigError) as info:
        verify(last)
    assert "previous one" not in str(info.value) and "only checkpoint" in str(info.value), str(info.value)
    (last / "manifest.json").write_text(manifest)
    (last / "__0_0.distcp").write_bytes(b"x")  # a checksum mismatch: the same remedy
    with pytest.raises(ConfigError) as info:
        verify(last)
    assert "checksum" in str(info.value) and "previous one" not in str(info.value)
    assert "only checkpoint" in str(info.value)


def test_a_corrupt_metrics_line_is_refused_before_the_ranks_start(saved_run: Path, tmp_path: Path) -> None:
    """A corrupt line before the last was refused by rank 0 once every rank had started (26 s later, as
    ``rank 0: ConfigError: ...``): now in one line before anything starts, exit 2, nothing rewritten."""
    run = _copy(saved_run, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 3
    lines[1] = "{not json"
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    config = (run / "config.toml").read_text()
    line = one_line_error(train_process("--resume", str(run)))
    assert f"{run / 'metrics.jsonl'}:2: not a JSON object" in line and "rank 0" not in line, line
    assert (run / "config.toml").read_text() == config and "starting" not in line


def test_an_incomplete_last_metrics_line_still_resumes_quietly_in_the_launcher(tmp_path: Path) -> None:
    from pipeoffload.train.metrics import check_records

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "lo')
    check_records(path, 1)  # a write cut short: the rank drops it, with its warning
    path.write_text(json.dumps({"step": 1}) + "\n[1]\n" + json.dumps({"step": 2}) + "\n")
    with pytest.raises(ConfigError, match="metrics.jsonl:2: expected a JSON object"):
        check_records(path, 2)
