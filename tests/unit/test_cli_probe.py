"""A user's probe of `estimate`, `plan`, `simulate` and `k`: values that meant something else than they
said, numbers labelled alike that differ, and messages naming the wrong cause."""
from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import hardware_preset, load_hardware


def _run(command: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(shlex.split(command))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def _ok(command: str) -> str:
    code, out, err = _run(command)
    assert code == 0, err
    return out


def _refused(command: str, *pieces: str) -> str:
    code, out, err = _run(command)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, (code, out, err)
    assert "Traceback" not in err
    for piece in pieces:
        assert piece in err, err
    return err


K13 = "k --model gpt3-13b --gpu gh200 --tp 2 --shared-host-link --json"
EST = "estimate --model gpt3-1.3b --global-batch 8 --pp 2 --dp 8"


# ---- 1. --hw values ---------------------------------------------------------------------------------
@pytest.mark.parametrize("word,shared", [("false", False), ("no", False), ("0", False), ("off", False),
                                         ("true", True), ("yes", True), ("1", True), ("ON", True)])
def test_hw_booleans_are_parsed_strictly(word: str, shared: bool) -> None:
    k = json.loads(_ok(f"{K13} --hw shares_pcie_switch={word}"))["cost_model_k"]
    alone = json.loads(_ok(K13))["cost_model_k"]  # gh200: its own link
    assert (k > 1.5 * alone) is shared


def test_hw_boolean_that_is_not_one_is_refused() -> None:
    _refused(f"{K13} --hw shares_pcie_switch=maybe", "--hw shares_pcie_switch=maybe", "true or false")


def test_hw_network_applies_the_preset_like_the_network_flag(tmp_path: Path) -> None:
    flag = json.loads(_ok(f"{EST} --network roce-100 --json"))
    hw = json.loads(_ok(f"{EST} --hw network=roce-100 --json"))
    plain = json.loads(_ok(f"{EST} --json"))
    assert hw["step_seconds"] == flag["step_seconds"] > plain["step_seconds"]
    path = tmp_path / "gpu.toml"
    path.write_text('preset = "a100"\nnetwork = "roce-100"\n')
    assert json.loads(_ok(f"{EST} --hardware-file {path} --json"))["step_seconds"] == flag["step_seconds"]
    spec = load_hardware(path)
    assert spec.internode_bandwidth == hardware_preset("a100").with_network("roce-100").internode_bandwidth
    path.write_text('preset = "a100"\nnetwork = "roce-100"\ninternode_gbps = 5\n')  # an explicit figure wins
    assert load_hardware(path).internode_bandwidth == 5e9
    _refused(f"{EST} --network ib-ndr --hw network=roce-100", "disagree")
    _refused(f"{EST} --hw network=token-ring", "unknown network 'token-ring'")


def test_hardware_file_value_that_is_not_a_number_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text('preset = "a100"\nd2h_gbps = "fast"\n')
    _refused(f"{EST} --hardware-file {path}", str(path), "d2h_gbps = 'fast'", "not a number")
    path.write_text('preset = "a100"\nshares_pcie_switch = "no"\n')
    assert not load_hardware(path).shares_pcie_switch
    path.write_text('preset = "a100"\nshares_pcie_switch = "perhaps"\n')
    with pytest.raises(ConfigError, match="shares_pcie_switch = 'perhaps': not a boolean"):
        load_hardware(path)
    _refused(f"{EST} --hw d2h_gbps=fast", "--hw d2h_gbps=fast: not a number")


@pytest.mark.parametrize("override", ["internode_gbps=1e-320", "internode_latency=1e300", "memory_gib=1e300",
                                      "peak_tflops=1e-320"])
@pytest.mark.parametrize("json_flag", ["", " --json"])
def test_extreme_hardware_is_refused_before_times_overflow(override: str, json_flag: str) -> None:
    _refused(f"estimate --model gpt3-1.3b --global-batch 16 --pp 2 --dp 8 --hw {override}{json_flag}",
             f"--hw {override}")


def test_a_non_finite_estimate_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    planner_estimate = importlib.import_module("pipeoffload.planner.estimate")
    real = planner_estimate.dp_sync_time
    monkeypatch.setattr(planner_estimate, "dp_sync_time", lambda *a: real(*a) * float("inf"))
    _refused("estimate --model gpt3-1.3b --global-batch 16 --pp 2 --dp 8 --json", "came out as inf")


# ---- 2. recompute without offload: no "planned peak 0 -> 0" ---------------------------------------
def test_recompute_without_offload_prints_no_zero_planned_peak() -> None:
    out = _ok("simulate 1f1b -d 4 -m 8 --recompute all")
    assert "0 -> 0" not in out and "recompute all: 24 activations" in out
    report = json.loads(_ok("simulate 1f1b -d 4 -m 8 --recompute all --json"))["offload_report"]
    assert report["planned_peak_before"] is None and report["planned_peak_after"] is None
    with_offload = _ok("simulate 1f1b -d 4 -m 8 --recompute all --offload all")
    assert "planned peak 4 -> 1 activation units" in with_offload


# ---- 8. consistency -----------------------------------------------------------------------------------
def test_k_refuses_tp_above_the_gpus_per_node_as_estimate_does() -> None:
    _refused("k --model gpt3-175b --tp 16", "--tp 16 is above the 8 GPUs per node")
    _refused("estimate --model gpt3-175b --global-batch 8 --tp 16", "--tp 16 is above the 8 GPUs per node")
