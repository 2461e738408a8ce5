"""CLI refusals and messages added in the tenth session (each test fails before its fix)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import refused


@pytest.mark.parametrize("flags, named", [("--temperature 5", "--temperature 5"), ("--seed 3", "--seed 3"),
                                          ("--temperature 0.5 --seed 1", "--temperature 0.5 --seed 1")])
def test_greedy_with_a_sampling_flag_is_refused(flags: str, named: str, tmp_path: Path) -> None:
    """``generate --greedy --temperature 5`` ran greedily, silently ignoring the temperature."""
    refused(f"generate {tmp_path} --greedy {flags}", f"--greedy with {named}", "not both")


@pytest.mark.parametrize("flags", ["--greedy", "--temperature 0.5 --seed 2", ""])
def test_greedy_or_sampling_alone_passes_that_check(flags: str, tmp_path: Path) -> None:
    err = refused(f"generate {tmp_path} {flags}", "no config.toml")
    assert "--greedy with" not in err


def _notes(*flags: str) -> list[str]:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    return resolve(build_parser().parse_args(["train", *flags]))[1]


@pytest.mark.parametrize("flags, words", [
    (["--zero", "1"], "zero=1 with dp=1: one replica holds the whole optimizer state"),
    (["--offload-ratio", "0.7"], "offload_ratio=0.7 with offload='none': no copies are planned"),
    (["--steps", "10", "--warmup", "50"], "warmup=50 is above steps=10: the learning rate is still warming up"),
    (["--steps", "10"], "warmup=20 is above steps=10"),  # the default warm-up, the user's steps
])
def test_a_setting_that_does_nothing_is_said(flags: list[str], words: str) -> None:
    """Accepted (a plan or a shared TOML may carry it) but said in the printed configuration's notes;
    it was silent."""
    assert any(words in note for note in _notes(*flags)), _notes(*flags)


@pytest.mark.parametrize("flags", [[], ["--zero", "1", "--dp", "2", "--nproc", "2"],
                                   ["--offload", "all", "--offload-ratio", "0.7"], ["--steps", "30", "--warmup", "5"]])
def test_settings_that_act_get_no_such_note(flags: list[str]) -> None:
    assert not [n for n in _notes(*flags) if "no effect" in n or "warming up" in n]


def test_a_config_file_key_that_does_nothing_is_said(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[schedule]\noffload = 'none'\noffload_ratio = 0.5\n")
    notes = _notes("--config", str(path))
    assert any("offload_ratio=0.5 with offload='none'" in n for n in notes), notes
