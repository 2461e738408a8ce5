"""The compiled loops (``pipeoffload/_native.c``) against the Python code they transcribe: equal to the bit.

``make setup`` builds them where a C compiler is; the Python versions stay the reference (and run
when the module is absent), so both are checked here on the same inputs.
"""
from __future__ import annotations

import random
import shlex
import shutil
import sysconfig
from pathlib import Path

import pytest

from pipeoffload import generate, lower
from pipeoffload.costs import CostModel
from pipeoffload.passes import copy_plan
from pipeoffload.passes.copy_plan import CopyGroup
from pipeoffload.schedules import get_spec, schedule_names
from pipeoffload.simulator import DeadlockError, _Simulation

native = copy_plan._native
needs_native = pytest.mark.skipif(native is None, reason="pipeoffload._native is not built (no C compiler)")


def test_the_compiled_loops_are_built_where_there_is_a_compiler() -> None:
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the package runs its Python loops")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers: the package runs its Python loops")
    assert native is not None, "pipeoffload._native is missing: run `make setup`"


@needs_native
@pytest.mark.parametrize("relaxed", [False, True])
@pytest.mark.parametrize("costs", [CostModel(d2h_time=0.5, h2d_time=0.5),
                                   CostModel(d2h_time=0.3, h2d_time=1.1, shared_copy_engine=False),
                                   CostModel(d2h_time=0.7, h2d_time=0.4, shared_host_link=True)],
                         ids=["engine", "separate", "shared-link"])
def test_compiled_lane_searches_equal_the_python_ones(costs: CostModel, relaxed: bool) -> None:
    from tests.unit.test_copy_lanes import _timelines
    rng = random.Random(5)
    timelines = _timelines(costs)
    horizon = timelines[0].clocks[-1]
    for _ in range(10):
        group = CopyGroup(timelines, costs, relaxed)
        for _ in range(400):
            rank, direction = rng.choice([0, 1]), rng.choice(["d2h", "h2d"])
            duration = rng.choice([0.0, 0.25, 0.5, 1.0, rng.uniform(0.01, 3.0)])
            t = rng.choice([rng.uniform(-1, horizon + 1), rng.choice(timelines[rank].clocks)])
            limit, lower_bound = t + rng.uniform(0, horizon), t - rng.uniform(0, horizon)
            early = group.earliest(rank, direction, t, duration, limit)
            assert early == group._earliest_python(rank, direction, t, duration, limit)
            late = group.latest(rank, direction, t, duration, lower_bound)
            assert late == group._latest_python(rank, direction, t, duration, lower_bound)
            start = early if rng.random() < 0.7 else late
            if start is not None and duration > 0:
                group.reserve(rank, direction, start, duration)


def _both(schedule, costs) -> tuple[_Simulation, _Simulation]:  # type: ignore[no-untyped-def]
    compiled, python = _Simulation(schedule, costs), _Simulation(schedule, costs)
    compiled._run_native()
    python._run_python()
    return compiled, python


def _same(a: _Simulation, b: _Simulation) -> None:
    assert a.start == b.start and a.end == b.end  # exact: the same double operations in the same order
    assert (a.busy, a.stall, a.stalled, a.pos, a.waiters) == (b.busy, b.stall, b.stalled, b.pos, b.waiters)


COSTS = {
    "unit": CostModel(),
    "p2p": CostModel.uniform(f=1.0, i=0.8, w=0.6, p2p=0.15, activation=1.5, w_fraction=0.5),
    "slow-copies": CostModel(d2h_time=1.4, h2d_time=1.4),  # reloads arrive late: stalls
    "shared-link": CostModel(d2h_time=0.6, h2d_time=0.6, shared_host_link=True),
    "two-engines": CostModel(d2h_time=0.9, h2d_time=0.5, shared_copy_engine=False, p2p_time=0.05),
}


@needs_native
@pytest.mark.parametrize("family", schedule_names())
@pytest.mark.parametrize("costs", COSTS.values(), ids=COSTS.keys())
def test_compiled_simulation_equals_the_python_one(family: str, costs: CostModel) -> None:
    spec = get_spec(family)
    schedule = generate(family, 4, 8, spec.default_stages_per_rank())
    offload = "all" if costs.d2h_time > 0 else "none"
    for lowered in (schedule, lower(schedule, costs, offload=offload),
                    lower(schedule, costs, offload=offload, recompute="first:1" if offload == "none" else "auto")):
        compiled, python = _both(lowered, costs)
        _same(compiled, python)


@needs_native
@pytest.mark.parametrize("family", ["1f1b", "group-interleaved", "zb-v"])
def test_compiled_simulation_times_stalls_like_the_python_one(family: str) -> None:
    """Copies planned for fast links, simulated on slow ones: backwards wait for their reloads."""
    spec = get_spec(family)
    planned = lower(generate(family, 4, 8, spec.default_stages_per_rank()), CostModel(d2h_time=0.2, h2d_time=0.2),
                    offload="all")
    compiled, python = _both(planned, COSTS["slow-copies"])
    _same(compiled, python)
    assert python.stalled


@needs_native
def test_compiled_simulation_finds_the_same_deadlock() -> None:
    from pipeoffload.ir import Schedule
    schedule = Schedule.from_text("0F0 0B0\n1B0 1F0\n")  # rank 1 runs its backward before its forward
    compiled, python = _both(schedule, CostModel())
    _same(compiled, python)
    messages = []
    for sim in (compiled, python):
        with pytest.raises(DeadlockError) as info:
            sim._report_deadlock([r for r in range(2) if sim.pos[r] < sim.offsets[r + 1]])
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "rank 1" in messages[0]


def _lane_state(group: CopyGroup) -> list:  # type: ignore[type-arg]
    return [(key, [(lane.starts[:], lane.ends[:]) for lane in group.lanes(*key)]) for key in sorted(group._lanes)]


@needs_native
@pytest.mark.parametrize("relaxed", [False, True])
@pytest.mark.parametrize("costs", [CostModel(d2h_time=0.5, h2d_time=0.5), CostModel(d2h_time=1.3, h2d_time=1.3),
                                   CostModel(d2h_time=0.3, h2d_time=1.1, shared_copy_engine=False),
                                   CostModel(d2h_time=0.7, h2d_time=0.4, shared_host_link=True)],
                         ids=["engine", "overloaded", "separate", "shared-link"])
def test_compiled_place_and_pack_equal_the_python_ones(costs: CostModel, relaxed: bool) -> None:
    """Same placements, same failures in the same order, same lanes afterwards."""
    from tests.unit.test_copy_lanes import _timelines
    rng = random.Random(9)
    timelines = _timelines(costs)
    picks = [(tl.rank, x) for tl in timelines for x in tl.activations.values()]
    failures = 0
    for _ in range(12):
        chosen = rng.sample(picks, rng.randint(1, len(picks)))
        compiled, python = CopyGroup(timelines, costs, relaxed), CopyGroup(timelines, costs, relaxed)
        for rank, x in chosen[: len(chosen) // 3]:  # some copies booked one at a time first
            assert compiled.place(rank, x) == python._place_python(rank, x)
        assert _lane_state(compiled) == _lane_state(python)
        rest = chosen[len(chosen) // 3:]
        packed = compiled.pack(rest)
        assert packed == python._pack_python(rest)
        assert _lane_state(compiled) == _lane_state(python)
        failures += len(packed[1])
    assert failures or costs.d2h_time < 1  # the overloaded lane makes packing fail (checked: it does)


@needs_native
def test_a_module_built_from_another_source_is_not_used(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """After a checkout changes _native.c, the old build could compute something else: it is ignored
    (Python loops, a warning naming the fix) until `make setup` rebuilds it."""
    import pipeoffload._native as built  # type: ignore[import-not-found]

    from pipeoffload import native
    assert native._load() is built  # the build matches its source
    monkeypatch.setattr(built, "SOURCE_DIGEST", "0" * 64)
    with caplog.at_level("WARNING", logger="pipeoffload.native"):
        assert native._load() is None
    assert "make setup" in caplog.text
