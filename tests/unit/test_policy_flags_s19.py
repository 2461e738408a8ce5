"""The command line names its flags in the offload and recompute policies' refusals (the Python API its
fields): `simulate --offload budget:-1` said "'budget:-1': -1.0 must be ...", naming no flag, and
`--max-stall 2` alone said "max_stall 2 ... offload is none" in the request's field names."""
from __future__ import annotations

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize("flags, line", [
    (("--offload", "budget:-1"), "--offload 'budget:-1': -1.0 must be a finite number >= 0; valid forms: none, all"),
    (("--offload", "first:0"), "--offload 'first:0': K=0 must be >= 1; valid forms"),
    (("--offload", "sometimes"), "--offload 'sometimes': the policy is not understood; valid forms"),
    (("--recompute", "first:x"), "--recompute 'first:x': 'x' is not an integer; valid forms: none, all, first:K"),
    (("--max-stall", "2"), "--max-stall 2 lets offload copies stall, but --offload is none: choose an offload policy "
                           "(e.g. --offload all) or leave --max-stall out"),
    (("--plan-ratio", "0.5"), "--plan-ratio 0.5 plans offload copies, but --offload is none: choose an offload policy "
                              "(e.g. --offload all) or leave --plan-ratio out"),
    (("--offload", "all", "--plan-ratio", "0.5", "--max-stall", "1"), "--plan-ratio 0.5 with --max-stall 1: a stall "
                                                                     "budget plans the copies for faster links"),
    (("--offload", "all", "--recompute", "auto", "--max-stall", "1"), "--max-stall 1 with --recompute auto: both deal"),
    (("--recompute", "auto",), "--recompute auto needs a target: it recomputes what the offload policy could not move; "
                               "pass --offload budget:X"),
])
def test_simulate_names_the_flags_of_a_bad_policy(flags: tuple[str, ...], line: str) -> None:
    code, out, err = run_cli("simulate", "1f1b", "-d", "4", "-m", "8", *flags)
    assert code == 2 and not out and err.startswith(f"pipeoffload simulate: error: {line}"), err
    assert len(err.splitlines()) == 1 and "_" not in err.split(":")[2].split(" ")[1], err  # a flag, not a field


def test_the_python_api_names_the_fields() -> None:
    from pipeoffload.errors import ConfigError
    from pipeoffload.service import SimulateRequest

    with pytest.raises(ConfigError, match=r"^offload='budget:-1': -1.0 must be a finite number >= 0"):
        SimulateRequest("1f1b", offload="budget:-1")
    with pytest.raises(ConfigError, match=r"^max_stall=2 lets offload copies stall, but offload is none: .* leave "
                                          r"max_stall out$"):
        SimulateRequest("1f1b", max_stall=2)
