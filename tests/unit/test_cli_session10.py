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
