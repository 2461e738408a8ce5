"""A resumed run keeps its model: when its layers cannot fill the stages asked for, the refusal offers fewer
stages, not more layers (it said "use layers >= 2" to `train --resume RUN --pp 4`; session 20 audit)."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.train.config import TrainConfig, to_toml, validate


def test_a_new_run_may_add_layers_or_use_fewer_stages() -> None:
    with pytest.raises(ConfigError) as info:
        validate(TrainConfig.build(layers=1, pp=4, nproc=4, global_batch=8, microbatches=4), data_exists=False)
    assert str(info.value).endswith("use layers >= 2, or use fewer stages (pp, stages_per_rank)"), info.value
    assert info.value.in_words(FLAGS).endswith("use --layers >= 2, or use fewer stages (--pp, --stages-per-rank)")


def test_a_resumed_run_is_offered_fewer_stages_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(TrainConfig.build(layers=1, out=str(run))))
    assert main(["train", "--resume", str(run), "--pp", "4", "--nproc", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--layers 1: the model's 3 layers (embedding, blocks, head) cannot fill 4 stages" in err, err
    assert err.endswith("use fewer stages (--pp, --stages-per-rank): a resumed run keeps its --layers 1"), err
    assert ">=" not in err
