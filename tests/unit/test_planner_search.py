"""The planner search: budget respected, infeasibility explained, deterministic, pruning exact."""
import json
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeoffload.cli import main
from pipeoffload.planner.candidates import enumerate_candidates
from pipeoffload.planner.evaluate import placement_of, simulate_choice
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.search import InfeasibleError, PlanRequest, find_plans
from pipeoffload.planner.stagecosts import setup_layer_costs, stage_costs

MODEL = model_preset("gpt3-2.7b").with_(layers=16)
HW = hardware_preset("a100")


def _request(budget_gib: float, **kw: object) -> PlanRequest:
    return PlanRequest(model=MODEL, hardware=HW, gpus=8, global_batch=32, memory_budget=budget_gib * GIB,
                       **kw)  # type: ignore[arg-type]


def _resimulated_peak(req: PlanRequest, plan) -> float:  # type: ignore[no-untyped-def]
    """Worst-rank memory of ``plan`` from a full (non-extrapolated) simulation, computed independently."""
    lgd = req.setup.lgd_for(plan.choice.offload)  # offload plans use LGD partial recomputation by default
    lc = setup_layer_costs(req.model, req.hardware, plan.layout.tp, req.setup, lgd)
    sc = stage_costs(lc, req.hardware, plan.layout, plan.choice.stages_per_rank, req.model.layers,
                     placement_of(plan.choice, plan.layout.pp))
    sim = simulate_choice(plan.choice, plan.layout.pp, plan.microbatches, sc.costs, extrapolate=False)
    s = req.setup
    opt_shard = plan.layout.dp if s.distributed_optimizer else 1
    return max(p * (s.weight_bytes + s.grad_bytes + s.optimizer_bytes / opt_shard) + u * sc.unit_bytes
               for p, u in zip(sc.params_per_rank, sim.peak_units))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.floats(min_value=8.0, max_value=60.0))
def test_no_plan_exceeds_the_budget(budget: float) -> None:
    req = _request(budget)
    try:
        result = find_plans(req)
    except InfeasibleError as err:
        assert err.min_memory is not None and err.min_memory > budget * GIB
        return
    shown = result.best(5) + result.pareto()
    assert shown
    for plan in shown:
        assert plan.fits and plan.memory.total <= budget * GIB
        assert _resimulated_peak(req, plan) == pytest.approx(plan.memory.total, rel=1e-9)


def test_infeasible_budget_reports_the_smallest_feasible_memory() -> None:
    with pytest.raises(InfeasibleError) as info:
        find_plans(_request(1.0))
    need = info.value.min_memory
    assert need is not None and need > GIB
    shown = math.ceil(need / GIB * 10) / 10  # rounded up, so passing it as --memory fits
    assert f"smallest feasible memory is {shown:.1f} GiB" in str(info.value)
    assert find_plans(_request(shown)).fitting
    # the reported minimum is exact: with exactly that budget a plan fits, and it is that plan
    result = find_plans(_request(need / GIB))
    assert min(p.memory.total for p in result.fitting) == pytest.approx(need)


def test_plan_cli_infeasible_exits_2_with_the_minimum(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["plan", "--model", "gpt3-2.7b", "--layers", "16", "--gpus", "8", "--global-batch", "32",
                 "--memory", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "smallest feasible memory is" in err and "GiB" in err and "Traceback" not in err


def test_search_is_deterministic_and_pruning_does_not_change_the_answer() -> None:
    a, b = find_plans(_request(40)), find_plans(_request(40))
    assert [p.as_dict() for p in a.best(5)] == [p.as_dict() for p in b.best(5)]
    full = find_plans(_request(40, prune=False))
    assert [p.as_dict() for p in a.best(5)] == [p.as_dict() for p in full.best(5)]
    per_tp = find_plans(_request(40, best_per_tp=True))
    assert {tp: p.as_dict() for tp, p in per_tp.best_by_tp().items()} == {
        tp: p.as_dict() for tp, p in full.best_by_tp().items()}
    assert full.evaluated >= a.evaluated
    parallel = find_plans(_request(40, workers=2))  # same batches, evaluated in two processes
    assert [p.as_dict() for p in parallel.best(5)] == [p.as_dict() for p in a.best(5)]
    assert [p.as_dict() for p in parallel.pareto()] == [p.as_dict() for p in a.pareto()]
    frontier = find_plans(_request(40, exact_frontier=True))
    assert [p.as_dict() for p in frontier.pareto()] == [p.as_dict() for p in full.pareto()]


def test_pareto_frontier_is_monotone_and_undominated() -> None:
    result = find_plans(_request(40))
    front = result.pareto()
    assert [p.memory.total for p in front] == sorted(p.memory.total for p in front)
    assert all(x.tokens_per_second < y.tokens_per_second for x, y in zip(front, front[1:]))
    for f in front:  # nothing that fits is at least as small and faster
        assert not any(p.memory.total <= f.memory.total and p.tokens_per_second > f.tokens_per_second * (1 + 1e-9)
                       for p in result.fitting)
    for p in result.fitting:  # and every plan that fits is matched or beaten by the frontier
        assert any(f.memory.total <= p.memory.total and f.tokens_per_second >= p.tokens_per_second for f in front)


def test_throughput_and_mfu_are_consistent() -> None:
    best = find_plans(_request(40)).best(1)[0]
    assert best.tokens_per_second == pytest.approx(32 * MODEL.seq / best.step_time)
    flops = 32 * MODEL.model_flops_per_microbatch()
    assert best.mfu == pytest.approx(flops / (best.step_time * 8 * HW.peak_flops))
    assert 0 < best.mfu < HW.achievable_fraction


def test_layout_errors_explain_themselves() -> None:
    with pytest.raises(Exception, match="global batch"):
        find_plans(PlanRequest(model=MODEL, hardware=HW, gpus=8, global_batch=3, memory_budget=80 * GIB, pp_sizes=(2,),
                           tp_sizes=(1,)))
    with pytest.raises(Exception, match="unknown schedule"):
        _request(40, schedules=("zigzag",))


def test_an_empty_schedule_list_is_refused_by_the_request() -> None:
    """``schedules=()`` searched nothing through the API; it is refused in one line naming the fix, in
    the words ``plan --schedules ''`` uses with the field for the flag."""
    from pipeoffload.errors import FLAGS, ConfigError

    with pytest.raises(ConfigError) as err:
        _request(40, schedules=())
    message = str(err.value)
    assert "\n" not in message and "(schedules) is empty" in message and "e.g. schedules=('1f1b',)" in message
    assert "(--schedules) is empty" in err.value.in_words(FLAGS) and "e.g. --schedules 1f1b" in err.value.in_words(FLAGS)
    assert _request(40, schedules=None).families()  # None still means the defaults


def test_plan_cli_json(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", "--model", "gpt3-2.7b", "--layers", "16", "--gpus", "8", "--global-batch", "32",
                 "--memory", "40", "--json", "--top", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["best"]) == 3 and data["pareto"]
    first = data["best"][0]
    assert first["memory_gib"]["total"] <= 40 and first["tokens_per_s"] > 0
    assert set(first["memory_gib"]) == {"parameters", "optimizer", "activations", "total", "host"}




LONG = MODEL.with_(seq=8192)  # activation-heavy: where offload and recompute matter


def _long(budget: float, **kw: object) -> PlanRequest:
    return PlanRequest(model=LONG, hardware=HW, gpus=8, global_batch=16, memory_budget=budget,
                       tp_sizes=(1, 2), **kw)  # type: ignore[arg-type]


def _tight_budget(share: float = 0.5) -> float:
    """``share`` of the activations of the smallest plan without offload or recompute below its memory."""
    plain = find_plans(_long(80 * GIB, offload=("none",), recompute=("none",), prune=False))
    smallest = min(plain.fitting, key=lambda p: p.memory.total)
    return smallest.memory.total - share * smallest.memory.activations


def test_tight_budgets_escalate_to_offload_and_recompute() -> None:
    budget = _tight_budget()
    result = find_plans(_long(budget))
    best = result.best(1)[0]
    assert best.choice.offload.kind != "none" or best.choice.recompute.kind != "none"
    assert best.memory.total <= budget
    assert best.exact  # confirmed by a full simulation


def test_host_memory_budget_is_respected() -> None:
    free = find_plans(_long(80 * GIB, offload=("auto",), recompute=("none",), escalate=False, prune=False))
    hosts = sorted(p.memory.host for p in free.fitting if p.memory.host > 0)
    assert hosts, "offload auto moved nothing to the host"
    cap = hosts[len(hosts) // 2]
    result = find_plans(_long(80 * GIB, offload=("auto",), recompute=("none",), escalate=False, host_memory_budget=cap))
    shown = result.best(5) + result.pareto()
    assert shown and all(p.memory.host <= cap for p in shown)
    assert len(result.fitting) < len(free.fitting)


def _shown(result) -> list:  # type: ignore[no-untyped-def]
    return [(str(p.layout), p.choice, p.step_time, p.memory) for p in result.best(5) + result.pareto()]


@pytest.mark.parametrize("budget_gib", [8.0, 12.0])
def test_skipping_candidates_below_the_activation_floor_changes_no_shown_plan(budget_gib: float,
                                                                            monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Candidates whose weights, optimizer state and one activation exceed the budget are not
    simulated; the shown plans are those of a search that simulates them."""
    req = _request(budget_gib)
    skipping = find_plans(req)
    from pipeoffload.planner import candidates
    monkeypatch.setattr(candidates.Candidate, "cannot_fit", lambda self, req: False)
    simulating = find_plans(req)
    assert _shown(skipping) == _shown(simulating)
    assert skipping.evaluated <= simulating.evaluated
    skipped = sum(n for reason, n in skipping.skipped.items() if reason.startswith("cannot fit"))
    assert simulating.evaluated - skipping.evaluated <= skipped  # some would have changed nothing
    assert skipped > 0 or budget_gib > 8.0  # at 8 GiB the floor rules out some (checked: 17 candidates)


def test_the_activation_floor_is_below_every_simulated_peak() -> None:
    """The floor is a bound: no simulated candidate (any family, offload or recompute) goes below it."""
    from pipeoffload.planner.candidates import enumerate_candidates
    from pipeoffload.planner.search import _run
    req = _request(40.0)
    cands = enumerate_candidates(req, {})
    checked = 0
    for cand in cands[::7]:
        plan = _run(req, cand, exact=True)
        peaks = [u * cand.stage.unit_bytes for u in plan.sim.peak_units]
        assert all(p >= f for p, f in zip(peaks, cand.activation_floor)), (cand.choice.label(), peaks)
        assert min(cand.activation_floor) > 0
        checked += 1
    assert checked > 20


def test_every_simulation_of_the_search_shows_in_its_counts(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The output prints the number of plans simulated and why the others were skipped; each simulation
    of the search is one of them, and confirmations re-simulate only plans kept. So no simulation can
    be dropped with the output unchanged (issue #19, docs/decisions.md): the counts would show it."""
    from pipeoffload.planner import search
    runs: list[tuple[tuple, bool]] = []
    original = search._run

    def counted(req, cand, exact=False, base=None, memo=None):  # type: ignore[no-untyped-def]
        runs.append((cand.key(), exact))
        return original(req, cand, exact, base, memo)

    monkeypatch.setattr(search, "_run", counted)
    result = find_plans(PlanRequest(model=MODEL, hardware=HW, gpus=8, global_batch=512, memory_budget=8 * GIB))
    searched = [key for key, exact in runs if not exact]
    confirmed = [key for key, exact in runs if exact]
    assert len(set(searched)) == len(searched)  # no candidate is simulated twice by the search
    unchanged = result.skipped.get("policy changed nothing (same as the plain schedule)", 0)
    slower = result.skipped.get(search.SLOWER, 0)  # tried past a fitting level, kept only where faster
    assert len(searched) == result.evaluated + unchanged + slower
    kept = {(str(p.layout), p.choice) for p in result.plans}
    assert confirmed and set(confirmed) <= kept and set(confirmed) <= set(searched)


def _stall_request(max_stall: float) -> PlanRequest:
    """Llama-3-8B on 8 H100s at TP 1, 44 GiB, zero-bubble schedules: where ZB-H1's offload plan that never
    stalls misses the budget and the plan made for faster copies fits."""
    return PlanRequest(model=model_preset("llama3-8b"), hardware=hardware_preset("h100"), gpus=8, global_batch=64,
                       memory_budget=44 * GIB, tp_sizes=(1,), schedules=("zb-v", "zb-h1"), max_stall=max_stall)


def test_a_stall_budget_adds_plans_and_removes_none() -> None:
    """``--max-stall`` adds each offload-only policy once more under the budget, beside (not instead of)
    the recompute level, and its fit does not stop the escalation: every plan the search shows without
    it is still found, and the extra ones lengthen their schedule's step by at most the budget."""
    strict, stalled = find_plans(_stall_request(0.0)), find_plans(_stall_request(5.0))
    assert not any(p.choice.offload.max_stall for p in strict.fitting)
    keys = {(p.layout, p.choice, p.microbatches) for p in stalled.fitting}
    assert all((p.layout, p.choice, p.microbatches) in keys for p in strict.best(5))
    assert stalled.best(1)[0].step_time <= strict.best(1)[0].step_time
    extra = [p for p in stalled.fitting if p.choice.offload.max_stall == 5.0]
    assert extra and all(p.stall_ratio > 0 for p in extra)
    req = stalled.request
    for plan in extra:  # the step of the same schedule without copies, simulated at full size
        lc = setup_layer_costs(req.model, req.hardware, plan.layout.tp, req.setup, req.setup.lgd_for(plan.choice.offload))
        sc = stage_costs(lc, req.hardware, plan.layout, plan.choice.stages_per_rank, req.model.layers,
                         placement_of(plan.choice, plan.layout.pp))
        plain = simulate_choice(plan.choice.plain(), plan.layout.pp, plan.microbatches, sc.costs, extrapolate=False)
        ours = simulate_choice(plan.choice, plan.layout.pp, plan.microbatches, sc.costs, extrapolate=False)
        assert plain.makespan < ours.makespan <= plain.makespan * 1.05 + 1e-9
        strict = simulate_choice(replace(plan.choice, offload=replace(plan.choice.offload, max_stall=0.0)),
                                 plan.layout.pp, plan.microbatches, sc.costs, extrapolate=False)
        offsets = plan.choice.offload.rank_offsets  # each rank's weights and optimizer state, in units
        assert len(offsets) == plan.layout.pp
        assert max(map(sum, zip(offsets, ours.peak_units))) < max(map(sum, zip(offsets, strict.peak_units)))


def test_a_larger_stall_budget_never_shows_a_slower_plan_for_the_same_memory() -> None:
    """The budget's plans are compared by each rank's total memory (``rank_offsets``), as the planner
    counts memory: a budget of 40 % must not buy a plan that only lowers the activations of a rank that
    does not set the memory (ZB-H1 PP8: it took 19.085 s at 40 % against 14.208 s at 5 %, both 43.6 GiB)."""
    def best(max_stall: float):  # type: ignore[no-untyped-def]
        req = replace(_stall_request(max_stall), pp_sizes=(8,), schedules=("zb-h1",), offload=("auto",),
                      recompute=("none",))
        return find_plans(req).best(1)[0]

    narrow, wide = best(5.0), best(40.0)
    assert wide.memory.total < narrow.memory.total or wide.step_time <= narrow.step_time


def test_plan_cli_says_what_a_stall_budget_plan_is(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64", "--memory", "44",
            "--tp", "1", "--schedules", "zb-v,zb-h1", "--max-stall", "5", "--no-pareto"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "offload plans may lengthen the step by up to 5 % (--max-stall)" in out.splitlines()[0]
    assert " auto+5% " in out and "offload +5%: copies planned for a faster link" in out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_stall"] == 5 and any(p["max_stall"] == 5 for p in data["best"])
    with pytest.raises(SystemExit) as stopped:  # refused by the flag's type, as simulate's is
        main([*argv[:-3], "--max-stall", "-1"])
    assert stopped.value.code == 2 and "argument --max-stall: -1.0 must be >= 0" in capsys.readouterr().err
    assert main([*argv[:-3], "--max-stall", "5", "--offload", "none"]) == 2
    assert "--max-stall 5 lets offload plans stall, but --offload is none" in capsys.readouterr().err


def test_a_stall_budget_plan_is_emitted_with_its_budget_for_train() -> None:
    from pipeoffload.planner.emit import plan_config
    from pipeoffload.train.config import build_config, validate

    result = find_plans(_stall_request(5.0))
    plan = next(p for p in result.fitting if p.choice.offload.max_stall == 5.0)
    config = plan_config(result.request, plan)
    assert config["max_stall"] == 5.0 and config["offload"] == str(plan.choice.offload)
    assert config["offload_ratio"] == 2.1378  # the cost model's k of `pipeoffload k --model llama3-8b --gpu h100`
    cfg = validate(build_config(config), data_exists=False)  # a Llama: emitted as train's llama keys
    assert cfg.schedule.max_stall == 5.0 and (cfg.model.source, cfg.model.layers) == ("llama", 32)
    strict = next(p for p in result.fitting if p.choice.offload.max_stall == 0)
    assert "max_stall" not in plan_config(result.request, strict)
    assert ("offload_ratio" in plan_config(result.request, strict)) == (strict.choice.offload.kind != "none")


def _budget_stall_request(max_stall: float) -> PlanRequest:
    """``_stall_request`` with ``--offload budget`` alone: the target is what 44 GiB leaves for activations."""
    return replace(_stall_request(max_stall), offload=("budget",), recompute=("none",))


def test_a_budget_candidate_s_stall_variant_gets_its_twin_s_target() -> None:
    """``--offload budget`` with ``--max-stall``: the stall variant of a budget candidate is planned
    against the finite target the memory budget leaves, the one its twin without the stall budget gets.
    It kept the infinite placeholder (``BUDGET_FROM_MEMORY``), which every peak meets: the pass kept the
    strict plan and the search skipped the variant as "stall budget changed nothing"."""
    cands = enumerate_candidates(_budget_stall_request(5.0), {})
    strict = {(str(c.layout), c.choice) for c in cands if c.choice.offload.max_stall == 0}
    stalled = [c for c in cands if c.choice.offload.max_stall == 5.0]
    assert stalled and len(stalled) == len(strict)
    for cand in stalled:
        offload = cand.choice.offload
        assert offload.kind == "budget" and math.isfinite(offload.budget) and offload.budget > 0, offload
        twin = replace(cand.choice, offload=replace(offload, max_stall=0.0, rank_offsets=()))
        assert (str(cand.layout), twin) in strict  # the same target, to the digit


def test_offload_budget_with_a_stall_budget_fits_below_the_strict_plans(capsys) -> None:  # type: ignore[no-untyped-def]
    """At 44 GiB no strict budget plan fits (the least memory is 46.5 GiB, ZB-H1 PP8); the same policy
    under a 5 % stall budget reaches its target and fits. Before, the variant's target was infinite and
    the search answered "no plan fits"."""
    with pytest.raises(InfeasibleError) as strict:
        find_plans(_budget_stall_request(0.0))
    assert strict.value.min_memory is not None and strict.value.min_memory > 44 * GIB
    argv = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64", "--memory", "44",
            "--tp", "1", "--schedules", "zb-v,zb-h1", "--offload", "budget", "--max-stall", "5", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)
    assert data["best"] and all(p["offload"].startswith("budget:") and p["max_stall"] == 5 for p in data["best"])
    for plan in data["best"]:
        assert plan["memory_gib"]["total"] <= 44 and plan["stall_ratio"] > 0
        assert math.isfinite(float(plan["offload"].removeprefix("budget:")))


def test_a_policy_that_changes_nothing_is_kept_when_only_it_was_asked_for(capsys) -> None:  # type: ignore[no-untyped-def]
    """At 48 GiB the plain ZB-H1 PP8 schedule needs 46.5 GiB, so `--offload budget` plans nothing (its
    target is met already). A variant that changes nothing is skipped as "the same as the plain
    schedule", but with only `--offload budget` asked for the plain schedule is no candidate: the search
    answered "no plan fits 48.0 GiB ... the smallest feasible memory is 46.5 GiB"."""
    argv = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64", "--memory", "48",
            "--tp", "1", "--schedules", "zb-v,zb-h1", "--offload", "budget", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)
    assert data["best"] and all(p["offload"].startswith("budget:") for p in data["best"])
    assert all(p["memory_gib"]["total"] <= 48 for p in data["best"])


def test_a_recompute_auto_variant_that_recomputes_nothing_is_not_a_second_plan(capsys) -> None:  # type: ignore[no-untyped-def]
    # recompute auto recomputes only what lowers the peak; where nothing does, the variant is the plan
    # of its offload policy alone, which is a candidate too: it is counted as skipped, not shown twice
    argv = ["plan", "--model", "llama3-8b", "--gpu", "a100", "--gpus", "8", "--global-batch", "64", "--memory", "40",
            "--exhaustive", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    reasons = data["skipped"]
    assert reasons.get("recompute auto recomputed nothing (same as its offload policy alone)", 0) >= 1
    shown = {(json.dumps(p["layout"], sort_keys=True), p["schedule"], p["stages_per_rank"], p["group_size"],
              p["offload"], p["step_time_s"], p["recompute"]) for p in data["best"] + data["pareto"]}
    assert len({plan[:-1] for plan in shown}) == len(shown)  # no plan twice under two recompute names


def test_recompute_auto_is_judged_by_each_rank_s_total_memory(capsys) -> None:  # type: ignore[no-untyped-def]
    # group-interleaved g = 4 on PP4: recompute auto lowers rank 3's activations (6.7 units, from 8.05),
    # not those of rank 2, which has the most (8.7); but rank 3 also holds the head's weights, so its
    # total sets the plan's memory, which falls from 28.5 to 27.7 GiB. Judged by activations alone the
    # recomputation looked useless and the plan was lost.
    argv = ["plan", "--model", "gpt3-13b", "--seq", "8192", "--gpu", "a100", "--gpus", "16", "--global-batch", "64",
            "--memory", "40", "--pp", "4", "--tp", "2", "--schedules", "group-interleaved", "--stages-per-rank", "4",
            "--offload", "auto", "--recompute", "none,auto", "--exhaustive", "--json"]
    assert main(argv) == 0
    plans = {(p["group_size"], p["recompute"]): p for p in json.loads(capsys.readouterr().out)["best"]}
    assert plans[(4, "auto")]["memory_gib"]["total"] < plans[(4, "none")]["memory_gib"]["total"]
    assert (2, "auto") not in plans  # there it lowers nothing: the offload policy's twin, not shown twice
