"""The size guard counts the offload pass's planning work too (issue #20): a request whose offload
planning would take long is refused before any work, with one line and exit 2."""
from __future__ import annotations

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.service.checks import OFFLOAD_WORK_HIDDEN, OFFLOAD_WORK_OVERLOADED, offload_work_factor
from pipeoffload.service.simulate import SimulateRequest, check_size


def test_overloaded_offload_at_d64_m256_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "interleaved-1f1b", "-d", "64", "-m", "256", "--offload", "all", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "ranks=64" in lines[0] and "microbatches=256" in lines[0] and "planning offload" in lines[0]
    assert "k=1.49" in lines[0]


@pytest.mark.parametrize("offload,k,shared,factor", [
    ("none", 1.49, True, 1), ("all", 0.5, False, OFFLOAD_WORK_HIDDEN), ("auto", 1.0, False, OFFLOAD_WORK_HIDDEN),
    ("all", 1.01, False, OFFLOAD_WORK_OVERLOADED), ("all", 0.5, True, OFFLOAD_WORK_OVERLOADED),
    ("budget:3", None, False, OFFLOAD_WORK_OVERLOADED)])
def test_offload_work_factor(offload: str, k: float | None, shared: bool, factor: int) -> None:
    assert offload_work_factor(offload, k, shared) == factor


def test_the_public_path_case_and_no_offload_pass_the_guard() -> None:
    check_size(SimulateRequest("interleaved-1f1b", ranks=64, microbatches=256, offload="all", offload_ratio=0.5))
    check_size(SimulateRequest("interleaved-1f1b", ranks=64, microbatches=256))
    with pytest.raises(ConfigError, match="planning offload"):
        check_size(SimulateRequest("interleaved-1f1b", ranks=64, microbatches=256, offload="all",
                                   offload_ratio=0.5, shared_host_link=True))
