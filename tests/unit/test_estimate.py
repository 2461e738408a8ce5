"""``pipeoffload estimate``: one exact layout's step time, memory and breakdown, and its bad input."""
import json
import math

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.planner.estimate import EstimateRequest, check_total, estimate
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.hfconfig import model_from_hf_config
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.search import find_plans
from pipeoffload.planner.stagecosts import TrainingSetup

A100 = hardware_preset("a100")
GPT13 = model_preset("gpt3-13b").with_(microbatch=2)


def _req(**kw: object) -> EstimateRequest:
    base: dict[str, object] = dict(model=GPT13, hardware=A100, tp=2, pp=4, dp=2, global_batch=64)
    base.update(kw)
    return EstimateRequest(**base)  # type: ignore[arg-type]


def test_estimate_equals_the_search_on_the_same_single_candidate() -> None:
    """What users run through ``estimate`` is what ``plan`` scores for that layout and schedule."""
    plan_req = PlanRequest(model=GPT13, hardware=A100, gpus=16, global_batch=64, memory_budget=A100.memory_bytes,
                           setup=TrainingSetup(distributed_optimizer=False), schedules=("interleaved-1f1b",),
                           tp_sizes=(2,), pp_sizes=(4,), stages_per_rank=(2,), offload=("none",),
                           recompute=("none",), top=1)
    plan = find_plans(plan_req).best(1)[0]
    est = estimate(_req(schedule="interleaved-1f1b", stages_per_rank=2, memory_budget=A100.memory_bytes))
    assert est.step_seconds == pytest.approx(plan.step_time, rel=1e-9)
    assert est.mfu == pytest.approx(plan.mfu, rel=1e-9)
    assert est.memory_worst == pytest.approx(plan.memory.total, rel=1e-9)


@pytest.mark.parametrize("kw", [{}, {"schedule": "interleaved-1f1b", "stages_per_rank": 2},
                                {"recompute": "full"}, {"recompute": "selective", "sequence_parallel": False},
                                {"pp": 1, "dp": 8}])
def test_the_breakdown_adds_up_to_the_step_time(kw: dict) -> None:
    est = estimate(_req(**kw))
    assert all(v >= 0 for v in est.breakdown.values()), est.breakdown
    assert math.isclose(check_total(est), 0.0, abs_tol=1e-9 * est.step_seconds)
    assert est.breakdown["tp_comm"] > 0 and est.breakdown["compute"] > 0


def test_recompute_modes_trade_memory_for_time() -> None:
    none, selective, full = (estimate(_req(recompute=r, model=GPT13.with_(flash_attention=False)))
                             for r in ("none", "selective", "full"))
    assert none.step_seconds < selective.step_seconds < full.step_seconds
    assert max(none.activation_per_rank) > max(selective.activation_per_rank) > max(full.activation_per_rank)


def test_a_config_that_does_not_fit_still_answers() -> None:
    est = estimate(_req(pp=1, dp=8, tp=1, memory_budget=20 * GIB))
    assert not est.fits and est.memory_worst > 20 * GIB and est.step_seconds > 0


def test_mfu_above_the_best_published_warns() -> None:
    low = estimate(_req())
    assert not low.warnings  # 13B on 16 A100s at this batch stays below the published bound
    big = estimate(EstimateRequest(model=model_preset("gpt3-175b"), hardware=A100, tp=8, pp=8, dp=1,
                                   global_batch=512))
    assert big.mfu > 0.552 and any("best published 55.2%" in w for w in big.warnings)


@pytest.mark.parametrize("kw, needle", [
    ({"pp": 41, "dp": 1}, "model.layers=40 cannot give each of pp x stages-per-rank = 41 x 1 stages a layer"),
    ({"tp": 3}, "tp=3 must divide the heads (40)"),
    ({"dp": 3}, "global_batch=64 is not divisible by dp x microbatch size = 3 x 2"),
    ({"recompute": "most"}, "recompute 'most'"),
    ({"stages_per_rank": 2}, "runs 1 stage(s) per rank"),
])
def test_bad_requests_are_one_line(kw: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        _req(**kw)
    assert needle in str(err.value) and "\n" not in str(err.value)


SHAPE = ["--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "2048", "--vocab", "50257"]


@pytest.mark.parametrize("argv, needle", [
    (["--pp", "25"], "--layers 24 cannot give each of pp x stages-per-rank = 25 x 1 stages a layer"),
    (["--tp", "3"], "--tp 3 must divide the heads (16)"),
    (["--gpu", "b300"], "unknown gpu 'b300'"),
    (["--dp", "5"], "--global-batch 32 is not divisible by dp x microbatch size = 5 x 1"),
    (["--pp", "4", "--schedule", "zb-v", "--p2p", "megatron"], "--p2p megatron times Megatron's own schedules"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys, argv: list, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert main(["estimate", *SHAPE, "--global-batch", "32", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_cli_json_has_the_documented_fields(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["estimate", *SHAPE, "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "32",
                 "--schedule", "interleaved-1f1b", "--stages-per-rank", "2", "--recompute", "selective",
                 "--no-sequence-parallel", "--no-flash", "--distributed-optimizer", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("step_seconds", "mfu", "tflops_per_gpu", "memory_gib", "breakdown_seconds", "fits"):
        assert key in data
    assert len(data["memory_gib"]["per_rank"]) == 2 and data["memory_gib"]["worst"] == max(data["memory_gib"]["per_rank"])
    assert set(data["breakdown_seconds"]) == {"compute", "bubble", "tp_comm", "pp_comm", "dp_sync", "offload_stall"}
    assert data["sequence_parallel"] is False and data["flash_attention"] is False


def test_hf_config_dir(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192, "hidden_act": "silu"}))
    spec = model_from_hf_config(tmp_path)
    assert (spec.layers, spec.kv_heads, spec.ffn, spec.gated_mlp, spec.bias) == (32, 8, 14336, True, False)
    assert spec.total_params() == pytest.approx(model_preset("llama3-8b").total_params(), rel=1e-6)
    assert main(["estimate", "--model", f"hf:{tmp_path}", "--seq", "4096", "--tp", "8", "--global-batch", "8",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"]["tp"] == 8
    assert main(["estimate", "--model", f"hf:{tmp_path}/missing", "--global-batch", "8"]) == 2


def test_plan_takes_selective_recompute(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "16", "--no-flash", "--tp", "2",
            "--pp", "1", "--json", "--no-pareto", "--top", "1"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["best"][0]
    assert main(argv + ["--recompute", "selective"]) == 0
    selective = json.loads(capsys.readouterr().out)["best"][0]
    assert selective["memory_gib"]["activations"] < plain["memory_gib"]["activations"]
    assert selective["step_time_s"] > plain["step_time_s"]


def test_plan_warns_above_the_best_published_mfu(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "512", "--tp", "4", "--pp", "16",
            "--schedules", "1f1b", "--offload", "none", "--recompute", "none", "--no-pareto", "--top", "1"]
    assert main(argv) == 0
    assert "above the best published 55.2%" in capsys.readouterr().err


def test_flash_fraction_sets_the_fused_attention_rate() -> None:
    slow = estimate(_req(hardware=A100.override(flash_fraction=0.3)))
    fast = estimate(_req(hardware=A100.override(flash_fraction=0.9)))
    assert slow.step_seconds > fast.step_seconds
    with pytest.raises(ConfigError, match="flash_fraction"):
        A100.override(flash_fraction=1.5)


def test_megatron_p2p_is_never_faster_than_eager() -> None:
    kw = dict(schedule="interleaved-1f1b", stages_per_rank=2, global_batch=64)
    eager, megatron = estimate(_req(**kw)), estimate(_req(p2p="megatron", **kw))
    assert megatron.step_seconds >= eager.step_seconds
    assert megatron.breakdown["pp_comm"] > eager.breakdown["pp_comm"]


def test_separate_gradient_accumulation_costs_a_pass_per_microbatch() -> None:
    fused, separate = estimate(_req()), estimate(_req(grad_accumulation="separate"))
    assert separate.step_seconds > fused.step_seconds
    one = dict(pp=1, dp=32, global_batch=64)  # one microbatch per step: nothing to accumulate
    assert estimate(_req(grad_accumulation="separate", **one)).step_seconds == pytest.approx(
        estimate(_req(**one)).step_seconds)


def test_one_microbatch_step_pays_megatrons_optimizer_passes() -> None:
    """DP 1: dp_sync is the optimizer step alone, 50 bytes per local weight (Adam 28, gradient norm 4,
    master-to-model copy 6, gradient zeroing 4, DDP's division of the gradient buffer by the DP size 8,
    which runs at DP 1 too) at the streaming-kernel share of HBM bandwidth; a distributed optimizer runs
    all but the zeroing and the division on its 1/dp shard."""
    from pipeoffload.planner.candidates import optimizer_step_time
    from pipeoffload.planner.stagecosts import Layout

    est = estimate(_req(pp=1, dp=1, global_batch=2))
    params = (est.memory_per_rank[0] - est.activation_per_rank[0]) / 18  # 2 + 4 + 12 bytes per weight
    rate = A100.hbm_bandwidth * A100.hbm_efficiency
    assert est.breakdown["dp_sync"] == pytest.approx(params * 50 / rate, rel=1e-9)
    req = PlanRequest(model=GPT13, hardware=A100, gpus=8, global_batch=8, memory_budget=A100.memory_bytes,
                      setup=TrainingSetup(distributed_optimizer=True))
    assert optimizer_step_time(req, Layout(1, 2, 4), 1e9) == pytest.approx(1e9 * (38 / 4 + 4 + 8) / rate)


def test_tied_embedding_gradient_is_all_reduced_between_first_and_last_stage() -> None:
    """Megatron all-reduces a tied word embedding's gradient between the first stage (lookup) and the
    last (head) before the optimizer step: only with PP > 1 and tied embeddings."""
    from pipeoffload.planner.candidates import dp_sync_time, embedding_sync_time
    from pipeoffload.planner.stagecosts import Layout

    tied = GPT13.with_(tied_embeddings=True)
    untied = GPT13.with_(tied_embeddings=False)

    def req(model: ModelSpec) -> PlanRequest:
        return PlanRequest(model=model, hardware=A100, gpus=64, global_batch=64, memory_budget=A100.memory_bytes)

    nbytes = GPT13.vocab * GPT13.hidden / 8 * 4  # fp32 gradients of the TP8 shard
    across = Layout(pp=4, tp=8, dp=2)  # first and last stage in different nodes
    assert embedding_sync_time(req(tied), across) == pytest.approx(2 * A100.collective_time(nbytes, 2, 24))
    assert 2 * A100.collective_time(nbytes, 2, 24) > 2 * nbytes / 2 / A100.nvlink_bandwidth  # over the network
    assert embedding_sync_time(req(untied), across) == 0.0
    assert embedding_sync_time(req(tied), Layout(pp=1, tp=8, dp=8)) == 0.0
    from pipeoffload.placement import Placement  # a V placement holds the first and last stage on rank 0
    assert embedding_sync_time(req(tied), across, Placement.v(4)) == 0.0
    assert embedding_sync_time(req(tied), across, Placement.loop(4, 2)) > 0.0
    assert dp_sync_time(req(tied), across, 1e9) == pytest.approx(
        dp_sync_time(req(untied), across, 1e9) + embedding_sync_time(req(tied), across))


def test_plan_json_carries_the_mfu_warning_and_says_selective_recompute(capsys) -> None:  # type: ignore[no-untyped-def]
    """A JSON consumer of ``plan`` sees the warning printed on stderr, and whether selective
    recomputation was applied to every plan (its recompute column shows only the schedule's policy)."""
    args = ["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--tp", "8", "--pp", "8",
            "--top", "1", "--no-pareto", "--schedules", "1f1b,interleaved-1f1b", "--recompute", "selective"]
    assert main(args + ["--json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["selective_recompute"] is True
    best = data["best"][0]["mfu"]
    assert (best > 0.552) == any("best published 55.2%" in w for w in data["warnings"])
    assert data["warnings"] and "best published 55.2%" in out.err
    assert main(args) == 0
    assert "selective recomputation (attention core) on every plan" in capsys.readouterr().out


def test_compare_tp_warns_for_a_side_above_the_best_published_mfu(capsys) -> None:  # type: ignore[no-untyped-def]
    """--compare-tp prints two plans; each one predicted above the best published MFU is warned about
    (stderr and the JSON's ``warnings``), naming the side."""
    args = ["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--compare-tp", "--json"]
    assert main(args) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    above = [side for side, key in (("PP + offload", "pp"), ("baseline", "tp")) if data[key]["mfu"] > 0.552]
    assert above and [w.split(":")[0] for w in data["warnings"]] == above
    assert all(f"warning: {side}: predicted MFU" in out.err for side in above)


@pytest.mark.parametrize("kw", [{}, {"recompute": "full"}, {"sequence_parallel": False},
                                {"recompute": "selective", "sequence_parallel": False}])
def test_tp_comm_is_what_the_tensor_parallel_collectives_add_to_the_step(kw: dict) -> None:
    """With one pipeline stage (no bubble, no point-to-point) making every NVLink collective free
    removes exactly ``tp_comm`` from the step: the layers' collectives and also the head's (its input
    all-gather/all-reduce and the vocabulary-parallel cross entropy's three all-reduces) and the
    embedding's (the vocabulary-parallel lookup's all-reduce), which the step time counts."""
    req = _req(pp=1, dp=1, global_batch=4, tp=8, **kw)
    est = estimate(req)
    free = estimate(EstimateRequest(**{**req.__dict__, "hardware": A100.override(
        nvlink_bandwidth=1e30, nvlink_latency=0.0)}))
    assert free.breakdown["tp_comm"] == pytest.approx(0.0, abs=1e-12)
    assert est.breakdown["tp_comm"] == pytest.approx(est.step_seconds - free.step_seconds, rel=1e-9)


def test_tp_comm_counts_the_head_on_the_critical_last_rank() -> None:
    """With PP > 1 the busiest rank is the last (it holds the head): its ``tp_comm`` is its layers'
    collectives plus the head's, per microbatch, and not the first stage's embedding's."""
    from pipeoffload.planner.layertime import head_comm, layer_times

    est = estimate(_req(tp=8, pp=2, dp=1, global_batch=8))
    t = layer_times(GPT13, A100, 8)
    layers = GPT13.layers // 2
    expected = est.microbatches * (layers * (t.detail["comm_f"] + t.detail["comm_b"]) + sum(head_comm(GPT13, A100, 8)))
    assert est.breakdown["tp_comm"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
def test_full_recompute_with_a_split_backward_is_refused_not_under_counted(schedule: str) -> None:
    # the checkpoint-sized activation of Megatron's full recomputation cannot hold what W keeps from I
    # to W (each layer's linear inputs): it used to report 1F1B's activations for zb-h1
    with pytest.raises(ConfigError, match=r"recompute=full with schedule=.* is not modelled"):
        _req(schedule=schedule, recompute="full")


def test_the_mfu_warning_follows_the_gpu_not_its_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A renamed A100 (``--hw name=...``, or a hardware file built on the a100 preset or giving its
    312 TFLOP/s peak) is still an A100: the published bound still applies; another GPU's peak does not."""
    from tests.conftest import run_cli

    big = dict(model=model_preset("gpt3-175b"), tp=8, pp=8, dp=1, global_batch=512)
    renamed = estimate(EstimateRequest(hardware=A100.override(name="my-a100"), **big))  # type: ignore[arg-type]
    assert renamed.mfu > 0.552 and any("best published 55.2%" in w for w in renamed.warnings)
    h100 = hardware_preset("h100")
    assert not any("best published" in w for w in estimate(EstimateRequest(hardware=h100, **big)).warnings)  # type: ignore[arg-type]
    argv = ["estimate", "--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--global-batch", "512"]
    code, _, err = run_cli(*argv, "--gpu", "a100", "--hw", "name=my-a100")
    assert code == 0 and "above the best published 55.2%" in err
    (tmp_path / "gpu.toml").write_text('preset = "a100"\nname = "lab-a100"\nmemory_gib = 40\n')
    code, _, err = run_cli(*argv, "--gpu", "h100", "--hardware-file", str(tmp_path / "gpu.toml"))
    assert code == 0 and "lab-a100" not in err and "above the best published 55.2%" in err
    fields = {k: v for k, v in A100.as_dict().items() if k not in ("sources", "name", "peak_flops", "network") and v is not None}
    (tmp_path / "own.toml").write_text("".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}\n"
                                               for k, v in fields.items()) + 'name = "x"\npeak_tflops = 312\n')
    code, _, err = run_cli(*argv, "--gpu", "h100", "--hardware-file", str(tmp_path / "own.toml"))
    assert code == 0 and "above the best published 55.2%" in err, err


def test_head_dim_flag_sets_the_attention_width() -> None:
    """``--head-dim`` (estimate, plan, k) sets the head width apart from hidden / heads: each layer's
    Q, K, V and projection weights and their biases scale with A = heads x head-dim, (4h + 3) x A weights
    (multi-head attention, with biases), each held at 18 bytes (bf16 weight, fp32 gradient, Adam)."""
    from pipeoffload.planner.emit import is_gpt_like
    from tests.conftest import run_cli

    def memory(*flags: str) -> tuple[float, dict]:
        code, out, err = run_cli("estimate", *SHAPE, "--global-batch", "8", "--json", *flags)
        assert code == 0, err
        data = json.loads(out)
        return (data["memory_gib"]["per_rank"][0] - data["memory_gib"]["activations_per_rank"][0]) * GIB, data

    default, data = memory()
    half, _ = memory("--head-dim", "64")
    assert default - half == pytest.approx(24 * (4 * 2048 + 3) * (16 * 128 - 16 * 64) * 18, rel=1e-9)
    assert memory("--head-dim", "128")[1] == data  # hidden / heads said explicitly: the same model
    code, out, _ = run_cli("k", *SHAPE, "--json")
    assert code == 0
    code, narrow, _ = run_cli("k", *SHAPE, "--json", "--head-dim", "64")
    assert code == 0 and json.loads(narrow)["cost_model_k"] != json.loads(out)["cost_model_k"]
    assert "--head-dim" in run_cli("plan", "--help")[1]
    wide = ModelSpec(name="x", layers=2, hidden=2048, heads=16, seq=2048, head_size=256)
    assert not is_gpt_like(wide) and is_gpt_like(wide.with_(head_size=None))  # plan --emit: train's GPT differs


@pytest.mark.parametrize("value, needle", [("0", "--head-dim 0: must be a whole number >= 1"),
                                           ("-64", "--head-dim -64: must be a whole number >= 1"),
                                           ("x", "--head-dim: 'x' is not an integer")])
def test_a_bad_head_dim_is_one_line(value: str, needle: str) -> None:
    from tests.conftest import run_cli

    for command in (["estimate", "--global-batch", "8"], ["k"]):
        code, _, err = run_cli(*command, *SHAPE, "--head-dim", value)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_an_offload_estimate_plans_its_copies_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The run without point-to-point time (for ``pp_comm``) is the plain schedule's: the offload pass never
    lengthens the step, so planning every copy a second time for it was wasted (half of a long estimate)."""
    import importlib

    evaluate = importlib.import_module("pipeoffload.planner.evaluate")
    lowered = []
    real = evaluate.lower_with_report

    def counted(schedule, *args, **kw):  # type: ignore[no-untyped-def]
        lowered.append(schedule.num_microbatches)
        return real(schedule, *args, **kw)

    monkeypatch.setattr(evaluate, "lower_with_report", counted)
    req = EstimateRequest(model=model_preset("gpt3-1.3b"), hardware=A100, pp=4, schedule="zb-v",
                          global_batch=64, offload="auto")
    est = estimate(req)
    assert lowered == [64]
    assert math.isclose(check_total(est), 0.0, abs_tol=1e-9 * est.step_seconds)
    module = importlib.import_module("pipeoffload.planner.estimate")
    monkeypatch.setattr(module, "_without_copies", lambda req, choice: choice)  # the copies planned again
    again = estimate(req)
    assert lowered == [64, 64, 64] and again.breakdown["pp_comm"] > 0
    assert again.breakdown == pytest.approx(est.breakdown, rel=1e-9, abs=1e-15)
    assert again.step_seconds == est.step_seconds


def test_a_long_estimate_reports_progress(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``estimate`` logs "estimating: N s, ..." on ``pipeoffload.planner.progress`` (which the CLI sends to
    stderr, as for ``plan``) while a simulation runs past PROGRESS_AFTER seconds. Here the threshold is 0
    and the simulation waits for the line, so no wall-clock time is assumed."""
    import importlib
    import logging
    import threading

    from tests.conftest import run_cli

    module = importlib.import_module("pipeoffload.planner.estimate")
    logger = logging.getLogger("pipeoffload.planner.progress")
    lines: list[str] = []
    seen = threading.Event()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
            seen.set()

    real = module._simulate

    def slow(*args, **kw):  # type: ignore[no-untyped-def]
        assert seen.wait(10), "no progress line"
        return real(*args, **kw)

    monkeypatch.setattr(module, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(module, "_simulate", slow)
    handler, level = Catch(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.NOTSET)  # as a fresh process has it: the CLI turns the lines on
    try:
        code, _, err = run_cli("estimate", "--model", "gpt3-1.3b", "--pp", "4", "--schedule", "zb-v",
                               "--offload", "auto", "--global-batch", "16")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert code == 0, err
    assert lines and lines[0].startswith("estimating: ")
    assert "zb-v PP4 v=2 over 16 microbatches with offload auto" in lines[0]


def test_uneven_stage_loads_are_told_apart_from_the_schedules_bubble(capsys: pytest.CaptureFixture) -> None:
    """An even split of gpt3-1.3b over PP4 puts the embedding and the head (~2 layers' worth) on one
    rank: almost all of the 22 % bubble is that imbalance, which ``--split balanced`` removes; the
    text says so (it read as a pipeline bubble the schedule could not fill)."""
    req = dict(model=model_preset("gpt3-1.3b"), tp=1, pp=4, dp=1, schedule="zb-v", global_batch=64)
    even, balanced = (estimate(_req(**req, split=s)) for s in ("even", "balanced"))  # type: ignore[arg-type]
    for est in (even, balanced):
        busy = est.busy_seconds
        makespan = est.step_seconds - est.breakdown["dp_sync"]
        assert est.imbalance_ratio == pytest.approx((max(busy) - sum(busy) / 4) / makespan)
        assert 0 <= est.imbalance_ratio <= est.bubble_ratio
    assert even.imbalance_ratio > 0.9 * even.bubble_ratio > 0.15
    assert balanced.imbalance_ratio < even.imbalance_ratio / 3
    assert estimate(_req(pp=1, dp=8)).imbalance_ratio == 0.0
    args = ["estimate", "--model", "gpt3-1.3b", "--gpu", "a100", "--pp", "4", "--schedule", "zb-v",
            "--global-batch", "64"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "points from uneven stage loads" in text and "--split balanced" in text
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["imbalance_ratio"] == pytest.approx(even.imbalance_ratio)
    assert main([*args, "--split", "balanced"]) == 0
    assert "--split balanced" not in capsys.readouterr().out


def test_megatron_p2p_with_as_many_microbatches_as_ranks_runs_every_forward_first() -> None:
    """Megatron's interleaved loop runs all forwards, then all backwards, on every rank when m = PP
    (``all_warmup_microbatches``): the estimate times that order (on the generator's, where the last ranks
    have a steady state, the blocking exchanges deadlocked) and holds all v m chunk inputs on every rank."""
    kw = dict(schedule="interleaved-1f1b", stages_per_rank=2, global_batch=16)  # m = 16 / (dp 2 x mb 2) = 4
    eager, megatron = estimate(_req(**kw)), estimate(_req(p2p="megatron", **kw))
    assert megatron.microbatches == 4 == megatron.request.pp
    assert megatron.step_seconds > eager.step_seconds
    assert megatron.activation_per_rank[-1] > eager.activation_per_rank[-1]
    assert check_total(megatron) == pytest.approx(0.0, abs=1e-9)
