"""One semantics, one registry: a family added inside a test runs through every tool untouched.

The toy family below (forwards then backwards in reverse microbatch order, loop placement) is
registered here only; nothing else in the package names it. It must validate, simulate, lower with
offload and recompute, plan, and draw, using only the facts its ``ScheduleSpec`` declares.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.lower import lower
from pipeoffload.placement import Placement
from pipeoffload.planner.evaluate import ScheduleChoice, period, placement_of, simulate_choice
from pipeoffload.schedules import (
    MAX_ACTIONS,
    ScheduleSpec,
    estimated_actions,
    estimated_work,
    generate,
    get_spec,
    register,
    schedule_specs,
    unregister,
)
from pipeoffload.semantics import CODE, KINDS, LANE, coded, memory_effects
from pipeoffload.simulator import simulate
from pipeoffload.textgrid import render_grid
from pipeoffload.validation import validate
from pipeoffload.viz.chrome_trace import timeline_trace

F, B = ActionKind.F, ActionKind.B


def reverse_gpipe(num_ranks: int, num_microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """All forwards, then the backwards newest microbatch first (a toy: peak m activation units)."""
    placement = Placement.loop(num_ranks, stages_per_rank)
    rows = []
    for rank in range(num_ranks):
        stages = placement.stages_of(rank)
        rows.append([Action(F, s, mb) for s in stages for mb in range(num_microbatches)]
                    + [Action(B, s, mb) for s in reversed(stages) for mb in reversed(range(num_microbatches))])
    return Schedule.from_rows(rows, placement, "reverse-gpipe")


@pytest.fixture
def toy() -> Iterator[ScheduleSpec]:
    spec = register(ScheduleSpec("reverse-gpipe", reverse_gpipe, "toy: GPipe with backwards in reverse order",
                                 interleaved=True, stages_per_rank=1))
    try:
        yield spec
    finally:
        unregister("reverse-gpipe")


def test_a_family_registered_in_a_test_runs_through_every_tool(toy: ScheduleSpec) -> None:
    d, m = 4, 6
    schedule = generate("reverse-gpipe", d, m)
    validate(schedule)
    timeline = simulate(schedule)
    assert timeline.makespan == 3 * (m + d - 1)  # F = 1, B = 2: fill, m forwards, drain, m backwards
    assert timeline.peak_activation_units == m
    costs = CostModel.uniform(1.0, 1.0, 1.0, p2p=0.1).with_offload_ratio(0.5)
    lowered = lower(schedule, costs, offload="all", recompute="none")
    validate(lowered)
    offloaded = simulate(lowered, costs)
    assert offloaded.peak_activation_units < m and offloaded.stall == 0
    assert offloaded.makespan == pytest.approx(simulate(schedule, costs).makespan)
    validate(lower(schedule, costs, recompute="first:1"))
    # the planner learns its placement and period from the spec, not from generating
    choice = ScheduleChoice("reverse-gpipe", 2, None, "auto", "none")
    assert placement_of(choice, d) == Placement.loop(d, 2) and period(choice, d, m) is None
    assert simulate_choice(choice, d, m, costs).peak_units == simulate_choice(choice, d, m, costs, extrapolate=False).peak_units
    # drawn like any other
    assert "0F0" in render_grid(lowered.actions) and timeline_trace(offloaded)["traceEvents"]


def test_registering_a_name_twice_is_refused(toy: ScheduleSpec) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register(ScheduleSpec("reverse-gpipe", reverse_gpipe, "again"))


def test_declared_facts_match_the_generators() -> None:
    """Options and default stages per rank are declared; they must agree with each generator, and the
    declared placement with the one a generated schedule has."""
    for spec in schedule_specs():
        params = inspect.signature(spec.generator).parameters
        assert spec.options == tuple(p for p in params if p not in ("num_ranks", "num_microbatches", "stages_per_rank"))
        assert spec.stages_per_rank == params["stages_per_rank"].default, spec.name
        for d in (1, 2, 3, 4):
            schedule = generate(spec.name, d, 2 * d)
            assert schedule.placement == spec.placement_for(d), (spec.name, d)
            kinds = {a.kind for row in schedule for a in row}
            backward = {"full": {F, B}, "split": {F, ActionKind.I, ActionKind.W}}.get(spec.backward)
            assert backward is None or kinds == backward, (spec.name, kinds)
        if spec.fixed_stages_per_rank:
            with pytest.raises(ConfigError, match="stages_per_rank"):
                generate(spec.name, 4, 8, spec.stages_per_rank + 2)


def test_a_schedule_too_big_to_simulate_is_refused_up_front_with_its_size_and_time() -> None:
    with pytest.raises(ConfigError, match=r"\(20,000,000,000 actions and 100,000 stages\), above the limit .* s and .* GB"):
        generate("1f1b", 100_000, 100_000)
    assert 2 * 1000 * 1000 <= MAX_ACTIONS  # d = m = 1000 of 1f1b still runs
    assert generate("1f1b", 2, 3, max_actions=None).num_microbatches == 3


def test_the_size_guard_counts_per_stage_work_not_only_actions() -> None:
    """A million ranks with one microbatch is under the action limit but far over the work it implies."""
    spec = get_spec("1f1b")
    assert estimated_actions(spec, 999_999, 1, 1) < MAX_ACTIONS < estimated_work(spec, 999_999, 1, 1)
    with pytest.raises(ConfigError, match=r"999,999 stages\), above the limit"):
        generate("1f1b", 999_999, 1)


def test_kind_codes_cover_every_action_kind_and_lanes_follow_the_ir() -> None:
    assert KINDS == tuple(ActionKind) and len(LANE) == len(KINDS)
    assert all(CODE[k] == i for i, k in enumerate(ActionKind))


def test_memory_effects_fast_path_equals_the_sequential_rules() -> None:
    """The vectorised memory effects (valid orders) agree with the rule applied action by action."""
    costs = CostModel.uniform(1.0, 1.5, 0.5, w_fraction=0.4, activation=(0.5, 1.0, 1.5, 2.0)).with_offload_ratio(0.8)
    for name in ("zb-h1", "1f1b", "interleaved-1f1b"):
        v = get_spec(name).stages_per_rank
        for policy in ({"offload": "all"}, {"recompute": "first:1"}, {}):
            schedule = generate(name, 4 // v, 6, v)
            lowered = lower(schedule, costs if v == 1 else CostModel(), **policy)  # type: ignore[arg-type]
            c = coded(lowered)
            fast = memory_effects(c, costs if v == 1 else CostModel())
            assert fast == _sequential(lowered, costs if v == 1 else CostModel())


def _sequential(schedule: Schedule, costs: CostModel) -> list[float]:
    """The memory rule of the architecture, restated action by action (independent of semantics.py)."""
    recomputed = {(a.stage, a.microbatch) for row in schedule for a in row if a.kind is ActionKind.R}
    resident: dict[tuple[int, int], float] = {}
    host: dict[tuple[int, int], float] = {}
    out = []
    for row in schedule:
        for a in row:
            key, size = (a.stage, a.microbatch), costs.act(a.stage)
            k = a.kind
            if k is F:
                amount = 0.0 if key in recomputed else size
                resident[key] = amount
            elif k is ActionKind.R:
                amount = size
                resident[key] = resident.get(key, 0.0) + size
            elif k in (B, ActionKind.W):
                amount = -resident.pop(key, 0.0)
            elif k is ActionKind.I:
                held = resident.get(key, 0.0)
                amount = held * costs.w_fraction - held
                resident[key] = held * costs.w_fraction
            elif k in (ActionKind.OFFLOAD, ActionKind.OFFLOAD_W):  # the second window moves what I left
                amount = host[key] = resident.get(key, 0.0)
                resident[key] = 0.0
            elif k in (ActionKind.RELOAD, ActionKind.RELOAD_W):
                amount = host.pop(key, 0.0)
                resident[key] = resident.get(key, 0.0) + amount
            else:
                amount = 0.0
            out.append(amount)
    return out


def test_the_gc_pause_is_scoped_and_restored_when_a_simulation_fails() -> None:
    import gc

    from pipeoffload.simulator import DeadlockError

    stuck = Schedule.from_rows([[Action(B, 0, 0), Action(F, 0, 0)], [Action(F, 1, 0), Action(B, 1, 0)]])
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            with pytest.raises(DeadlockError, match="rank 0 step 0 0B0 waits for 0F0"):
                simulate(stuck)
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_validating_leaves_a_pickled_schedule_as_it_was() -> None:
    import pickle

    schedule = generate("1f1b", 4, 8)
    plain = pickle.dumps(schedule)
    validate(schedule)  # builds the coded form, and keeps nothing of it on the schedule
    assert pickle.dumps(schedule) == plain
    again = pickle.loads(plain)
    assert again == schedule and simulate(again).makespan == simulate(schedule).makespan


_CODED_FIELDS = ("kind", "stage", "microbatch", "rank", "step", "lengths", "offsets")


@pytest.mark.parametrize("name", ["interleaved-1f1b", "zb-v", "dualpipe-v", "gpipe"])
def test_the_coded_form_add_comms_builds_by_insertion_is_the_one_built_from_the_actions(name: str) -> None:
    import numpy as np

    from pipeoffload.passes.comms import add_comms
    from pipeoffload.semantics import CodedSchedule, with_coded

    schedule = generate(name, 4, 8)
    for source in (schedule, with_coded(schedule), add_comms(schedule)):  # with its own, or comms to replace
        lowered = add_comms(source)
        carried, fresh = lowered.coded, CodedSchedule(lowered)
        assert carried is not None and coded(lowered) is carried
        for field in _CODED_FIELDS:
            assert np.array_equal(getattr(carried, field), getattr(fresh, field)), field
        assert carried.num_microbatches == fresh.num_microbatches


def test_a_carried_coded_form_is_no_part_of_the_value_and_is_used_only_for_its_own_actions() -> None:
    import dataclasses
    import pickle

    from pipeoffload.semantics import with_coded

    schedule = generate("1f1b", 4, 8)
    carrying = with_coded(schedule)
    assert carrying == schedule and hash(carrying) == hash(schedule) and repr(carrying) == repr(schedule)
    assert pickle.dumps(carrying) == pickle.dumps(schedule) and pickle.loads(pickle.dumps(carrying)).coded is None
    assert coded(carrying) is carrying.coded and with_coded(carrying) is carrying
    rows = [list(r) for r in schedule.actions]
    rows[0][0], rows[0][1] = rows[0][1], rows[0][0]
    other = dataclasses.replace(carrying, actions=tuple(map(tuple, rows)))  # carries a form of other actions
    assert coded(other) is not carrying.coded and coded(other).microbatch[:2].tolist() == [1, 0]


@pytest.mark.parametrize(("name", "offload", "k", "shared"), [
    ("interleaved-1f1b", "all", 0.5, False), ("zb", "all", 1.0, False), ("zb-v", "auto", 0.8, True),
    ("1f1b", "budget:3", 0.5, False), ("dualpipe-v", "all", 1.5, True)])
def test_the_coded_form_the_offload_pass_builds_by_insertion_is_the_one_built_from_the_actions(
        name: str, offload: str, k: float, shared: bool) -> None:
    """The offload pass inserts its copies' codes into the validated source's form (copies of both
    windows, several at one position, at a rank's end); ``add_comms`` then builds on that form."""
    import numpy as np

    from pipeoffload.costs import CostModel
    from pipeoffload.passes.lower import lower_with_report
    from pipeoffload.semantics import CodedSchedule

    costs = CostModel(shared_host_link=shared).with_offload_ratio(k)
    planned, report = lower_with_report(generate(name, 4, 12), costs, offload=offload, comms=False,
                                        log_warnings=False)
    assert report.offloaded > 0
    if report.throttle:  # waits are emitted by ``with_waits``: no form is carried then
        assert planned.coded is None
        return
    carried, fresh = planned.coded, CodedSchedule(planned)
    assert carried is not None and coded(planned) is carried
    for field in _CODED_FIELDS:
        assert np.array_equal(getattr(carried, field), getattr(fresh, field)), field
    assert carried.num_microbatches == fresh.num_microbatches
