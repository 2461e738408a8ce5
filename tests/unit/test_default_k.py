"""Offloading is never free unless asked for: without --offload-ratio the copies take the default k
(Formula 1 for a stated reference layer), the header says which k, and k = 0 is instant copies."""
import json

import pytest

from pipeoffload.planner.formulas import formula1_k
from pipeoffload.service import SimulateRequest, simulate
from pipeoffload.service.simulate import DEFAULT_OFFLOAD_RATIO
from tests.conftest import run_cli


def test_the_default_k_is_formula_1_for_the_reference_layer_and_copies_take_time() -> None:
    assert DEFAULT_OFFLOAD_RATIO == pytest.approx(formula1_k(4096, 8192, 220e12, 15e9), abs=0.005)
    default = simulate(SimulateRequest("1f1b", offload="all")).as_dict()
    instant = simulate(SimulateRequest("1f1b", offload="all", offload_ratio=0)).as_dict()
    assert default["offload_ratio"] == DEFAULT_OFFLOAD_RATIO and instant["offload_ratio"] == 0
    assert default != instant and default["peak_rank_units"] > instant["peak_rank_units"]


@pytest.mark.parametrize("flags,shown", [([], f"k={DEFAULT_OFFLOAD_RATIO:g}"), (["--offload-ratio", "0"], "k=0")])
def test_the_header_names_k(flags: list[str], shown: str) -> None:
    code, out, _ = run_cli("simulate", "1f1b", "--offload", "all", *flags)
    assert code == 0 and shown in out.splitlines()[0]
    code, out, _ = run_cli("simulate", "1f1b", "--offload", "all", *flags, "--json")
    assert json.loads(out)["offload_ratio"] == float(shown.split("=")[1])
