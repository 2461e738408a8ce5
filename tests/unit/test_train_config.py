"""`pipeoffload train` refuses a bad configuration in one line, exit 2, before any rank starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.config import TrainConfig, build_config, load_toml, to_toml, validate
from pipeoffload.train.data import Corpus, default_text_files


@pytest.mark.parametrize("flags, words", [
    (["--pp", "2", "--dp", "2", "--nproc", "3"], ["nproc=3", "dp*pp*tp"]),
    (["--global-batch", "6", "--dp", "4"], ["global_batch=6", "dp=4"]),
    (["--microbatches", "3", "--global-batch", "8"], ["microbatches=3"]),
    (["--schedule", "nope"], ["nope", "valid names"]),
    (["--offload", "sometimes"], ["offload", "sometimes"]),
    (["--hidden", "30", "--heads", "4"], ["hidden=30", "heads=4"]),
    (["--tokenizer", "words"], ["tokenizer", "bpe:N"]),
    (["--zero", "2"], ["zero=2"]),
    (["--pp", "2"], ["dp*pp*tp", "--nproc 2"]),
])
def test_bad_value_one_line_exit_2_and_no_rank_started(tmp_path: Path, flags: list[str], words: list[str]) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "train", *flags, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not out.exists()  # nothing was started or written


def test_toml_round_trip_and_flags_override(tmp_path: Path) -> None:
    cfg = validate(TrainConfig(schedule="zb-v", pp=2, microbatches=4, global_batch=8, layers=4))
    assert cfg.stages_per_rank == 2  # the family's own default
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    again = build_config(load_toml(path))
    assert again == cfg
    assert build_config(load_toml(path), {"pp": 4, "steps": None}).pp == 4


def test_unknown_key_and_bad_type_are_named(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('pipline = 2\n')
    with pytest.raises(ConfigError, match="unknown config key 'pipline'"):
        build_config(load_toml(path))
    with pytest.raises(ConfigError, match="steps='many'"):
        build_config({"steps": "many"})


def test_data_order_is_seeded_and_sharded_over_replicas() -> None:
    corpus = Corpus(np.arange(10_000, dtype=np.uint16) % 251, 251, 16, 0.1)
    a = corpus.train_indices(3, 8, seed=1)
    assert np.array_equal(a, corpus.train_indices(3, 8, seed=1))
    assert not np.array_equal(a, corpus.train_indices(3, 8, seed=2))
    x0, _ = corpus.train_batch(3, 8, 1, dp=2, dp_rank=0)
    x1, _ = corpus.train_batch(3, 8, 1, dp=2, dp_rank=1)
    whole, targets = corpus.batch(a)
    assert np.array_equal(np.concatenate([x0, x1]), whole)
    assert np.array_equal(whole[:, 1:], targets[:, :-1])  # targets are the next tokens
    assert (corpus.num_train * 16 + 1) <= corpus.val_start  # training windows end before the held-out tail
    epoch = np.concatenate([corpus.train_indices(s, 8, 0) for s in range(corpus.num_train // 8)])
    assert len(set(epoch.tolist())) == len(epoch)  # an epoch visits each window once


def test_default_text_is_real_python_source() -> None:
    files = default_text_files()
    assert files == sorted(files) and all(f.suffix == ".py" for f in files)
    assert "def " in files[0].read_text() or "import" in files[0].read_text()


def test_plan_auto_fills_the_layout_and_keeps_explicit_flags() -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import config_from_args

    base = ["train", "--plan", "auto", "--memory", "0.2", "--nproc", "2", "--global-batch", "8", "--layers", "4"]
    cfg = config_from_args(build_parser().parse_args(base))
    assert cfg.world == cfg.nproc == 2 and (cfg.global_batch // cfg.dp) % cfg.microbatches == 0
    kept = config_from_args(build_parser().parse_args([*base, "--schedule", "1f1b", "--offload", "all"]))
    assert kept.schedule == "1f1b" and kept.offload == "all" and kept.world == 2
    with pytest.raises(ConfigError, match="--memory"):
        config_from_args(build_parser().parse_args(base[:3] + base[5:]))
