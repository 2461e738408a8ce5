"""Stage costs and the extrapolating simulation the planner relies on."""
import itertools
from dataclasses import replace

import pytest

from pipeoffload._perf import Memo
from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.planner.evaluate import (
    ScheduleChoice,
    build,
    lowering_options,
    placement_of,
    simulate_choice,
    time_lower_bound,
)
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.stagecosts import Layout, layer_costs, partition, stage_costs
from pipeoffload.schedules import generate, schedule_names
from pipeoffload.simulator import simulate


def _costs(stages: int, last: float, p2p: float) -> CostModel:
    """Uniform stages except a heavier last one (the output head), with a P2P latency."""
    def per(x: float) -> tuple[float, ...]:
        return tuple([x] * (stages - 1) + [x * last])
    return CostModel(time_f=per(1.0), time_i=per(1.1), time_w=per(0.9), p2p_time=p2p,
                     activation=per(1.0))


GRID = [(fam, d, m, v, p2p, last)
        for fam, d, m, v, p2p, last in itertools.product(
            ["1f1b", "interleaved-1f1b"], [2, 3, 4, 8], [24, 40, 64], [1, 2, 3], [0.0, 0.3], [1.0, 1.7])
        if (fam == "1f1b") == (v == 1) and not (fam == "interleaved-1f1b" and m % d)]
GRID += [("1f1b", 16, 80, 1, 0.2, 1.5), ("interleaved-1f1b", 16, 64, 2, 0.2, 1.5)]
GRID += [(fam, d, m, 1 if fam == "zb-h1" else 2, p2p, 1.4)
         for fam, d, m, p2p in itertools.product(["zb-h1", "zb-v", "v-half", "v-min"], [2, 4, 8], [40, 64],
                                                 [0.0, 0.3])]


@pytest.mark.parametrize("fam, d, m, v, p2p, last", GRID)
def test_extrapolated_simulation_equals_full_simulation(fam: str, d: int, m: int, v: int, p2p: float,
                                                        last: float) -> None:
    costs = _costs(d * v, last, p2p)
    choice = ScheduleChoice(fam, v)
    fast = simulate_choice(choice, d, m, costs)
    full = simulate_choice(choice, d, m, costs, extrapolate=False)
    assert fast.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert fast.peak_units == pytest.approx(full.peak_units)
    assert fast.busy == pytest.approx(full.busy)
    assert fast.bubble_ratio == pytest.approx(full.bubble_ratio, abs=1e-9)
    assert time_lower_bound(choice, d, m, costs) <= full.makespan + 1e-9


def test_extrapolation_is_used_for_long_pipelines() -> None:
    assert simulate_choice(ScheduleChoice("1f1b"), 4, 64, _costs(4, 1.0, 0.1)).extrapolated
    assert not simulate_choice(ScheduleChoice("1f1b"), 4, 10, _costs(4, 1.0, 0.1)).extrapolated


def test_partition_puts_the_remainder_first() -> None:
    assert partition(10, 4) == (3, 3, 2, 2)
    assert partition(8, 8) == (1,) * 8
    with pytest.raises(Exception, match="every stage needs a layer"):
        partition(3, 4)


def test_stage_costs_place_embedding_and_head_and_scale_with_layers() -> None:
    model, hw = model_preset("gpt3-1.3b"), hardware_preset("a100")
    lc = layer_costs(model, hw, tp=2)
    sc = stage_costs(lc, hw, Layout(pp=4, tp=2, dp=1), 2, model.layers)  # 8 stages of 3 layers
    c = sc.costs
    ef, eb = lc.embedding_time  # the embedding's lookup on the first stage, its gradient in W
    assert ef > 0 and eb > 0
    assert c.f(0) == pytest.approx(3 * lc.time_f + ef) and c.f(4) == pytest.approx(3 * lc.time_f)
    assert c.w(0) == pytest.approx(3 * lc.time_w + eb) and c.i(0) == pytest.approx(3 * lc.time_i)
    assert c.b(0) == pytest.approx(3 * lc.time_b + eb)
    assert c.f(7) == pytest.approx(3 * lc.time_f + lc.head_time[0])
    assert c.act(0) == 1.0 and c.act(7) == pytest.approx(1 + lc.head_activation_bytes / (3 * lc.activation_bytes))
    # w_fraction from the shapes: a layer stage's W keeps the linear inputs; the head adds its own
    assert c.w_fraction_of(0) == pytest.approx(model.layer_w_fraction(tp=2))
    assert c.w_fraction_of(7) == pytest.approx((3 * lc.w_bytes + lc.head_w_bytes) / (3 * lc.activation_bytes
                                                                                     + lc.head_activation_bytes))
    assert c.w_fraction == max(c.w_fraction_of(s) for s in range(8)) < 1.0
    assert sc.unit_bytes == 3 * lc.activation_bytes
    # rank 0 holds stages 0 and 4 (+ embedding); rank 3 holds stages 3 and 7 (+ head)
    assert sc.params_per_rank[0] == pytest.approx(6 * lc.params + lc.embedding_params)
    assert sc.params_per_rank[3] == pytest.approx(6 * lc.params + lc.head_params)
    total = sum(sc.params_per_rank) * 2  # tp = 2
    tied_copy = model.vocab * model.hidden  # the last stage keeps its own copy of a tied head
    assert total == pytest.approx(model.total_params() + tied_copy)
    # the host link is private unless pair sharing is asked for
    assert c.d2h_time == pytest.approx(sc.unit_bytes / hw.d2h_bandwidth) and not c.shared_host_link
    # with TP on a shared PCIe switch, the TP peer copies at the same time: half the bandwidth each
    shared = stage_costs(lc, hw, Layout(pp=4, tp=2, dp=1), 2, model.layers, host_link="alternating").costs
    assert shared.d2h_time == pytest.approx(2 * sc.unit_bytes / hw.d2h_bandwidth) and not shared.shared_host_link
    one = stage_costs(layer_costs(model, hw), hw, Layout(4, 1, 2), 1, model.layers, host_link="serialized").costs
    assert one.shared_host_link and one.d2h_time == pytest.approx(6 * lc.activation_bytes * 2 / hw.d2h_bandwidth)
    alt = stage_costs(layer_costs(model, hw), hw, Layout(4, 1, 2), 1, model.layers, host_link="alternating").costs
    assert not alt.shared_host_link  # opposite directions in alternating slots: no same-direction waits


def test_tensor_parallel_adds_collective_time_to_f_and_i_only() -> None:
    """Under the flat compute model a TP shard takes 1/tp of the FLOP time plus its collectives."""
    model, hw = model_preset("gpt3-6.7b"), hardware_preset("h100").override(compute_model="flat")
    one, four = layer_costs(model, hw, 1), layer_costs(model, hw, 4)
    c = hw.collective_time(model.boundary_bytes(), 4)
    assert c == pytest.approx(hw.nvlink_latency + 3 / 4 * model.boundary_bytes() / hw.nvlink_bandwidth)
    assert four.time_f == pytest.approx(one.time_f / 4 + 4 * c)
    assert four.time_i == pytest.approx(one.time_i / 4 + 4 * c)  # split backward: nothing to overlap with
    assert four.time_w == pytest.approx(one.time_w / 4 + 2 * c)  # W re-gathers its inputs
    assert four.time_b is not None and four.time_b < four.time_i + four.time_w  # B overlaps with wgrad


POLICY_GRID = [(fam, d, v, g, m, pol, k)
               for fam, d, v, g, m, pol, k in itertools.product(
                   ["1f1b", "group-interleaved"], [2, 4, 8], [1, 2, 3], [None, "half", "full"], [32, 48],
                   [("auto", "none"), ("auto", "auto"), ("none", "first:1"), ("none", "first:2")], [0.6, 1.5])
               if (fam == "1f1b") == (v == 1) and (fam == "group-interleaved") == (g is not None)
               and not (pol[1].startswith("first:") and int(pol[1][6:]) > v)]


def _policy_costs(d: int, v: int, k: float) -> CostModel:
    # Both link models: pairs share a host link at d = 2 and 4, d = 8 has its own links (a shared link's
    # plans cost about twice the CPU there; test_offload_monotone and test_slots check it at d = 8).
    return replace(_costs(d * v, 1.4, 0.1), shared_host_link=d < 8).with_offload_ratio(k)


def _size(g: str | None, d: int) -> int | None:
    return None if g is None else ((d + 1) // 2 if g == "half" else d)


@pytest.mark.parametrize("fam, d, v, g, m, pol, k", POLICY_GRID[::5])
def test_policy_schedules_bounds_and_estimates(fam: str, d: int, v: int, g: str | None, m: int,
                                               pol: tuple[str, str], k: float) -> None:
    costs = _policy_costs(d, v, k)
    choice = ScheduleChoice(fam, v, _size(g, d), *pol)
    base = ScheduleChoice(fam, v, _size(g, d))
    # One memo (value-keyed results of pure functions) for `full` and `fast`: where `fast` falls back
    # to simulating m (most cases) it gets `full`'s result instead of repeating the same computation;
    # its small-size simulations are other keys, computed anew.
    memo = Memo()
    full = simulate_choice(choice, d, m, costs, extrapolate=False, memo=memo)
    plain = simulate_choice(base, d, m, costs, extrapolate=False)
    # offload and recompute only add work and waits: the plain schedule's makespan bounds them
    assert full.makespan >= plain.makespan - 1e-9
    assert time_lower_bound(choice, d, m, costs) <= full.makespan + 1e-9
    if pol[1] == "none":  # the offload pass never delays compute
        assert full.makespan == pytest.approx(plain.makespan, rel=1e-12)
    fast = simulate_choice(choice, d, m, costs, fallback=choice.periodic(), memo=memo)
    if fast.exact:  # what the planner reports without a confirming full simulation must be exact
        assert fast.makespan == pytest.approx(full.makespan, rel=1e-9)
        assert fast.peak_units == pytest.approx(full.peak_units)
        assert fast.host_units == pytest.approx(full.host_units)


@pytest.mark.parametrize("fam, d, v, g, m, pol, k", POLICY_GRID[1::9])
def test_schedules_simulate_the_same_without_their_send_and_recv(fam: str, d: int, v: int, g: str | None,
                                                                  m: int, pol: tuple[str, str], k: float) -> None:
    costs = _policy_costs(d, v, k)
    choice = ScheduleChoice(fam, v, _size(g, d), *pol)
    # `lower` reuses `build`'s memory plan (a memo returns a pure function's result for equal inputs):
    # what is compared is the simulation with and without the SEND/RECV that `lower` adds.
    memo = Memo()
    stripped = simulate(build(choice, d, m, costs, memo), costs)
    options = {"group_size": choice.group_size} if choice.group_size else {}
    lowered = lower_with_report(generate(fam, d, m, v, **options), costs, offload=pol[0], recompute=pol[1],
                                memo=memo)[0]
    with_comms = simulate(lowered, costs)
    assert stripped.makespan == pytest.approx(with_comms.makespan, rel=1e-12)
    for a, b in zip(stripped.per_rank, with_comms.per_rank):
        assert (a.peak_activation_units, a.peak_host_units) == pytest.approx(
            (b.peak_activation_units, b.peak_host_units))


@pytest.mark.parametrize("family, v, g", [("zb-v", 2, None), ("v-half", 2, None), ("v-min", 2, None),
                                          ("zb-h1", 1, None), ("group-interleaved", 2, 1),
                                          ("interleaved-1f1b", 2, None)])
@pytest.mark.parametrize("pp, tp", [(2, 8), (4, 2)])
def test_extrapolation_with_real_stage_costs(family: str, v: int, g: int | None, pp: int, tp: int) -> None:
    """Head-heavy last stage (128k vocabulary), TP collectives, V placement: still exact."""
    if family not in schedule_names():
        pytest.skip(f"{family} is not in this build")
    model, hw = model_preset("llama3-70b"), hardware_preset("h100")
    choice = ScheduleChoice(family, v, g)
    sc = stage_costs(layer_costs(model, hw, tp), hw, Layout(pp, tp, 64 // (pp * tp)), v, model.layers,
                     placement_of(choice, pp))
    fast = simulate_choice(choice, pp, 64, sc.costs)
    full = simulate_choice(choice, pp, 64, sc.costs, extrapolate=False)
    assert fast.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert fast.peak_units == pytest.approx(full.peak_units)
    assert 0 <= fast.bubble_ratio < 1


def test_lowering_policies_are_declared_not_read_from_a_signature() -> None:
    assert set(lowering_options()) == {"offload", "recompute"}


def test_a_search_collects_pass_warnings_instead_of_muting_the_logger(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    logger = logging.getLogger("pipeoffload.passes")
    level = logger.level
    costs = _policy_costs(4, 2, 1.5)
    with caplog.at_level(logging.WARNING):
        sim = simulate_choice(ScheduleChoice("group-interleaved", 2, 4, "budget:0", "none"), 4, 16, costs,
                              extrapolate=False)
    assert any("cannot bring every rank to 0" in w for w in sim.warnings)
    assert "cannot bring" not in caplog.text and logger.level == level
