"""A user's probe of `estimate`, `plan`, `simulate` and `k`: values that meant something else than they
said, numbers labelled alike that differ, and messages naming the wrong cause."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import hardware_preset, load_hardware
from tests.conftest import refused as _refused
from tests.conftest import run_cli


def _run(command: str) -> tuple[int, str, str]:
    return run_cli(*shlex.split(command))


def _ok(command: str) -> str:
    code, out, err = _run(command)
    assert code == 0, err
    return out


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
    path.write_text('memory_gib = 80\npeak_tflops = 312\nachievable_fraction = 0.7\nd2h_gbps = 15\nh2d_gbps = 15\n'
                    'network = "roce-100"\nshares_pcie_switch = "yes"\n')  # no preset: every field given
    spec = load_hardware(path)
    assert (spec.network, spec.internode_bandwidth, spec.shares_pcie_switch) == ("roce-100", 10.5e9, True)
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


# ---- 3. estimate warns for a --memory above the GPU, as plan does ------------------------------------
def test_estimate_warns_when_memory_is_above_the_gpu() -> None:
    code, out, err = _run("estimate --model gpt3-1.3b --global-batch 8 --memory 200 --json")
    data = json.loads(out)
    assert code == 0 and data["memory_gib"]["budget"] == 80.0
    assert any("--memory 200 GiB is above the a100's 80.00 GiB" in w for w in data["warnings"])
    assert "warning: --memory 200 GiB is above the a100's 80.00 GiB" in err
    _, plan_err = _run("plan --model gpt3-1.3b --gpus 8 --global-batch 8 --memory 200 --top 1")[1:]
    assert "--memory 200 GiB is above the a100's 80.00 GiB" in plan_err
    assert not json.loads(_ok("estimate --model gpt3-1.3b --global-batch 8 --memory 60 --json"))["warnings"]


# ---- 4. plan names the real reason there is nothing to search ----------------------------------------
@pytest.mark.parametrize("flags,piece", [
    ("--pp 5", "--pp 5 does not divide the GPUs"), ("--pp 3", "--pp 3 does not divide the GPUs"),
    ("--pp 16", "--pp 16 does not divide the GPUs"), ("--schedules ''", "(--schedules) is empty"),
    ("--pp 1 --schedules zb-v", "zb-v needs PP > 1"),
])
def test_plan_with_nothing_to_search_says_why(flags: str, piece: str) -> None:
    err = _refused(f"plan --model gpt3-1.3b --gpus 8 --global-batch 8 {flags}", piece)
    assert "global batch divisible" not in err


def test_plan_batch_reason_is_kept_where_it_is_the_cause() -> None:
    _refused("plan --model gpt3-1.3b --gpus 8 --global-batch 6 --tp 1 --pp 2",
             "pick a global batch divisible by the data-parallel size x microbatch size")


# ---- 5. help states the real defaults; estimate's v is the family's own --------------------------------
def test_plan_help_lists_the_real_default_schedules() -> None:
    from pipeoffload.cli.plan import default_families
    from pipeoffload.planner.hardware import GIB
    from pipeoffload.planner.plans import PlanRequest
    from pipeoffload.planner.presets import model_preset

    a100 = hardware_preset("a100")
    req = PlanRequest(model=model_preset("gpt3-1.3b"), hardware=a100, gpus=8, global_batch=8, memory_budget=40 * GIB)
    assert default_families() == req.families() and "zb-v" in req.families()
    code, out, _ = _run("plan --help")
    assert code == 0
    flat = " ".join(out.split())
    assert f"(default: {', '.join(req.families())})" in flat
    assert "private: every GPU has its own link" in flat


def test_estimate_stages_per_rank_is_the_familys_own() -> None:
    base = "estimate --model gpt3-1.3b --global-batch 8 --pp 4 --json"
    assert json.loads(_ok(f"{base} --schedule interleaved-1f1b"))["stages_per_rank"] == 2  # as simulate
    assert json.loads(_ok(f"{base} --schedule zb-v"))["stages_per_rank"] == 2
    assert json.loads(_ok(f"{base} --schedule 1f1b"))["stages_per_rank"] == 1
    _refused(f"{base} --schedule zb-v --stages-per-rank 1", "--stages-per-rank 1: schedule zb-v runs 2",
             "give 2 or drop the flag")
    _refused(f"{base} --schedule zb-h1 --stages-per-rank 2", "runs 1 stage(s) per rank")
    code, out, _ = _run("estimate --help")
    assert "default: the family's own" in " ".join(out.split())


# ---- 6. numbers labelled alike that differ --------------------------------------------------------------
def test_simulate_stall_is_labelled_as_the_sum_over_ranks() -> None:
    out = _ok("simulate zb-v -d 8 -m 32 --offload all --offload-ratio 0.68 --max-stall 2")
    assert "stall 5.29 t (summed over ranks)" in out.splitlines()[1]


def test_estimate_names_both_bubbles() -> None:
    layout = "--model gpt3-1.3b --gpus 8 --global-batch 8 --tp 2 --pp 4 --schedules 1f1b"
    plan_bubble = json.loads(_ok(f"plan {layout} --top 1 --offload none --recompute none --json"))
    est = _ok("estimate --model gpt3-1.3b --global-batch 8 --tp 2 --pp 4")
    data = json.loads(_ok("estimate --model gpt3-1.3b --global-batch 8 --tp 2 --pp 4 --json"))
    ratio = data["bubble_ratio"]
    assert f"pipeline bubble {ratio:.1%}" in est and "its bubble " in est
    assert "time on the busiest rank (share of the step)" in est
    assert plan_bubble["best"][0]["bubble_ratio"] == pytest.approx(ratio)


# ---- 7. the offload policy and the partial recomputation it implies are named ------------------------
def test_estimate_header_and_json_name_offload_and_lgd() -> None:
    base = "estimate --model gpt3-1.3b --global-batch 8"
    text = _ok(f"{base} --offload all").splitlines()[0]
    assert "offload all with LGD partial recomputation" in text
    assert "offload none" in _ok(base).splitlines()[0]
    data, plain = json.loads(_ok(f"{base} --offload all --json")), json.loads(_ok(f"{base} --json"))
    assert data["offload"] == "all" and data["partial_recompute"] is True
    assert plain["partial_recompute"] is False


# ---- 8. smaller --------------------------------------------------------------------------------------------
def test_estimate_refuses_interleaving_at_pp1() -> None:
    _refused("estimate --model gpt3-1.3b --global-batch 8 --schedule interleaved-1f1b", "needs --pp > 1")


def test_estimate_prints_the_sequence_length_and_no_zero_step() -> None:
    small = "estimate --layers 2 --hidden 64 --heads 2 --seq 32 --vocab 100 --global-batch 1"
    out = _ok(small)
    assert "seq 32," in out.splitlines()[0]
    assert "step 0.000 s" not in out and " us " in out.splitlines()[1]
    assert "worst rank 0.0 GiB" not in out
    assert json.loads(_ok(f"{small} --json"))["seq"] == 32
    assert "seq 2,048" in _ok("estimate --model gpt3-1.3b --global-batch 8").splitlines()[0]


def test_seconds_keep_three_digits() -> None:
    from pipeoffload.service.estimate import seconds

    assert seconds(0.835) == "0.835 s" and seconds(0.0382) == "0.038 s"
    assert seconds(0.0042) == "4.2 ms" and seconds(4.62e-6) == "4.62 us" and seconds(0.0) == "0.000 s"
