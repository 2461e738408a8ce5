"""The scalar action rules (``semantics.producers``, ``transfers``, ``memory_delta``...) against the
vectorised ones (``CodedSchedule.inputs``, ``memory_effects``) on every action of every family.

Two encodings of one rule: the comm pass, the W-filling replay, the V-shape squeeze and the runtime
read the scalar one, the simulator and validator the arrays. Each check below fails if either drifts.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from pipeoffload import semantics as sem
from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import COMM_KINDS, COMPUTE_KINDS, COPY_KINDS, OFFLOAD_KINDS, Action, ActionKind, Schedule
from pipeoffload.passes.comms import add_comms
from pipeoffload.passes.lower import lower
from pipeoffload.passes.throttle import with_waits
from pipeoffload.placement import Placement
from pipeoffload.schedules import generate, schedule_specs
from pipeoffload.schedules.zero_bubble import fill_weight_passes

K = ActionKind
P2P = 0.25


def _costs(num_stages: int) -> CostModel:
    """Unequal per-stage sizes and w_fractions strictly between 0 and 1 (every rule shows)."""
    return CostModel(time_f=1.0, time_i=1.3, time_w=0.7, p2p_time=P2P,
                     activation=tuple(1.0 + 0.37 * s for s in range(num_stages)),
                     stage_w_fraction=tuple(0.3 + 0.4 * (s % 2) for s in range(num_stages)), w_fraction=0.7)


def _family_schedules() -> Iterator[tuple[str, Schedule]]:
    """Small schedules of every registered family: each stages_per_rank it takes, both backward forms
    where it has the option."""
    for spec in schedule_specs():
        vs = [spec.stages_per_rank] if spec.fixed_stages_per_rank else sorted({1, 2, spec.stages_per_rank})
        options: list[dict[str, object]] = [{}]
        if spec.backward == "option":
            options = [{"backward": "split"}, {"backward": "full"}]
        sizes = [(d, m) for d in (2, 3, 4) for m in (d, 2 * d + 1)]
        for (d, m), v, opts in ((size, v, o) for size in sizes for v in vs for o in options):
            try:
                yield f"{spec.name} d={d} m={m} v={v} {opts}", generate(spec.name, d, m, v, **opts)
            except ConfigError:
                continue


def _variants(schedule: Schedule) -> Iterator[tuple[str, Schedule, CostModel]]:
    """The compute-only schedule, its comm-lowered form, and lowered with OFFLOAD/RELOAD and with R."""
    costs = _costs(schedule.num_stages)
    yield "compute-only", schedule, costs
    yield "comms", add_comms(schedule), costs
    copies = costs.with_offload_ratio(0.5)
    offloaded = lower(schedule, copies, offload="all")
    yield "offload", offloaded, copies
    if schedule.num_ranks == 4:  # WAIT before warm-up forwards (the throttled warm-up's rule, limit 1)
        yield "waits", offloaded.with_actions([with_waits(row, 1) for row in offloaded.actions]), copies
    yield "recompute", lower(schedule, costs, recompute="first:1"), costs


CASES = [(f"{name} {variant}", lowered, costs)
         for name, schedule in _family_schedules() for variant, lowered, costs in _variants(schedule)]


def test_every_family_is_covered() -> None:
    covered = {name.split()[0] for name, _, _ in CASES}
    assert covered == {spec.name for spec in schedule_specs()}
    kinds = {a.kind for _, s, _ in CASES for row in s.actions for a in row}
    assert kinds == set(K), f"kinds never exercised: {set(K) - kinds}"


def _resolve(c: sem.CodedSchedule, kinds: tuple[ActionKind, ...], stage: int, mb: int) -> ActionKind:
    """The one of ``kinds`` the schedule holds for (stage, mb) (the last when none: nothing to wait for)."""
    present = {c.action(k)[0] for k in c.keys[(c.stage == stage) & (c.microbatch == mb)].tolist()}
    return next((k for k in kinds if k in present), kinds[-1])


def _expected_inputs(c: sem.CodedSchedule, i: int) -> tuple[list[int], list[float], int]:
    """Keys and delays action ``i`` waits for, and its RELOAD key, from the scalar rules."""
    kind, stage, mb, rank = sem.KINDS[c.kind[i]], int(c.stage[i]), int(c.microbatch[i]), int(c.rank[i])
    owner = c.placement.stage_to_rank
    keys, delays = [], []
    for kinds, producer_stage in sem.producers(kind, stage, c.num_stages):
        lane = sem.lane_of(kind)
        crosses = owner[producer_stage] != rank
        if lane == sem.RECV:  # a receive's data always travels
            producer, delay = kinds[0], P2P
        elif crosses and c.lowered:  # the receive on this rank stands in for the remote producer
            producer, producer_stage, delay = sem.receive_of(kind), stage, 0.0  # type: ignore[assignment]
        else:
            producer, delay = _resolve(c, kinds, producer_stage, mb), P2P if crosses else 0.0
        keys.append(int(c.key_of(sem.CODE[producer], producer_stage, mb)))
        delays.append(delay)
    reload = int(c.key_of(sem.CODE[sem.RELOAD_BEFORE[kind]], stage, mb)) if kind in sem.RELOAD_BEFORE else -1
    return keys, delays, reload


@pytest.mark.parametrize("name,schedule,costs", CASES, ids=[c[0] for c in CASES])
def test_waits_for_matches_coded_inputs(name: str, schedule: Schedule, costs: CostModel) -> None:
    c = sem.coded(schedule)
    inputs = c.inputs(P2P)
    for i in range(len(c.kind)):
        keys, delays, reload = _expected_inputs(c, i)
        keys += [-1] * (2 - len(keys))
        delays += [0.0] * (2 - len(delays))
        got = ([int(inputs.first[i]), int(inputs.second[i])], [float(inputs.first_delay[i]), float(inputs.second_delay[i])])
        action = schedule.actions[int(c.rank[i])][int(c.step[i])]
        assert got == (keys, delays), f"{name}: {action} waits for {got}, scalar rule says {(keys, delays)}"
        assert int(inputs.reload[i]) == reload, action


@pytest.mark.parametrize("name,schedule,costs", CASES, ids=[c[0] for c in CASES])
def test_memory_delta_matches_memory_effects(name: str, schedule: Schedule, costs: CostModel) -> None:
    c = sem.coded(schedule)
    effects = sem.memory_effects(c, costs)
    for i, amount in enumerate(effects):
        kind, stage, mb = sem.KINDS[c.kind[i]], int(c.stage[i]), int(c.microbatch[i])
        delta = sem.memory_delta(kind, costs.act(stage), costs.w_fraction_of(stage), bool(c.recomputed[stage, mb]))
        if kind in OFFLOAD_KINDS:  # memory_effects gives a copy's moved units; the device loses them
            delta = -delta
        assert math.isclose(amount, delta, rel_tol=1e-12, abs_tol=1e-12), f"{name}: {kind} {stage} {mb}: {amount} vs {delta}"


@pytest.mark.parametrize("name,schedule,costs", [c for c in CASES if c[0].endswith("compute-only")],
                         ids=[c[0] for c in CASES if c[0].endswith("compute-only")])
def test_transfers_are_the_receives_and_sends_the_lowered_rule_names(name: str, schedule: Schedule,
                                                                     costs: CostModel) -> None:
    """``transfers`` names exactly the receives ``CodedSchedule.inputs`` makes each compute action of the
    lowered schedule wait for, and exactly the sends those receives wait for."""
    lowered = sem.coded(add_comms(schedule))
    inputs = lowered.inputs(P2P)
    owner = schedule.placement.stage_to_rank
    receive_codes = {sem.RECV_F, sem.RECV_B}
    waited_receives, waited_sends, named_receives, named_sends = set(), set(), set(), set()
    for i in range(len(lowered.kind)):
        code = int(lowered.kind[i])
        for key in (int(inputs.first[i]), int(inputs.second[i])):
            if key >= 0 and sem.CODE[lowered.action(key)[0]] in receive_codes:
                waited_receives.add(key)
        if code in receive_codes:
            waited_sends.add(int(inputs.first[i]))
        if sem.LANE[code] == sem.COMPUTE:
            kind, stage, mb = sem.KINDS[code], int(lowered.stage[i]), int(lowered.microbatch[i])
            receives, sends = sem.transfers(kind, stage, owner)
            named_receives |= {int(lowered.key_of(sem.CODE[k], stage, mb)) for k in receives}
            named_sends |= {int(lowered.key_of(sem.CODE[k], stage, mb)) for k in sends}
    assert named_receives == waited_receives
    assert named_sends == waited_sends
    # peer_stage: a receive's sender and a send's receiver are the two ends of one inputs.first edge
    n = schedule.num_stages
    for i in range(len(lowered.kind)):
        if int(lowered.kind[i]) in receive_codes:
            receive, stage, _ = lowered.action(int(lowered.keys[i]))
            send, send_stage, _ = lowered.action(int(inputs.first[i]))
            assert sem.peer_stage(receive, stage, n) == send_stage
            assert sem.peer_stage(send, send_stage, n) == stage


@pytest.mark.parametrize("name,schedule,costs", [c for c in CASES if c[0].endswith("offload")],
                         ids=[c[0] for c in CASES if c[0].endswith("offload")])
def test_copy_moves_and_host_delta_match_the_arrays(name: str, schedule: Schedule, costs: CostModel) -> None:
    """``copy_moves`` (units a copy puts on the link) and ``host_delta`` against ``copy_units`` and
    ``host_effects``: with both windows offloaded OFFLOAD_W moves nothing and the host keeps W's part."""
    c = sem.coded(schedule)
    amounts = sem.memory_effects(c, costs)
    moves, host = sem.copy_units(c, amounts), sem.host_effects(c, costs, amounts)
    for i in range(len(c.kind)):
        kind, stage, mb = sem.KINDS[c.kind[i]], int(c.stage[i]), int(c.microbatch[i])
        kept = bool(c.host_copy_kept[stage, mb])
        args = (kind, costs.act(stage), costs.w_fraction_of(stage), kept)
        assert math.isclose(moves[i], sem.copy_moves(*args), rel_tol=1e-12, abs_tol=1e-12), (name, kind, stage, mb)
        assert math.isclose(host[i], sem.host_delta(*args), rel_tol=1e-12, abs_tol=1e-12), (name, kind, stage, mb)


@pytest.mark.parametrize("name,schedule,costs", [c for c in CASES if c[0].endswith(("offload", "recompute"))],
                         ids=[c[0] for c in CASES if c[0].endswith(("offload", "recompute"))])
def test_ends_activation_is_where_memory_delta_empties_it(name: str, schedule: Schedule, costs: CostModel) -> None:
    """With 0 < w_fraction < 1 only the kinds in ENDS_ACTIVATION take an activation to zero for good,
    and each is its activation's last device-memory action (where the runtime drops its tensors)."""
    recomputed = {(a.stage, a.microbatch) for row in schedule.actions for a in row if a.kind is K.R}
    for row in schedule.actions:
        held: dict[tuple[int, int], float] = {}
        last: dict[tuple[int, int], ActionKind] = {}
        for a in row:
            if sem.lane_of(a.kind) in (sem.SEND, sem.RECV):
                continue
            key = (a.stage, a.microbatch)
            before = held.get(key, 0.0)
            held[key] = before + sem.memory_delta(a.kind, costs.act(a.stage), costs.w_fraction_of(a.stage),
                                                  key in recomputed)
            # an OFFLOAD empties the device too, but its RELOAD brings the activation back
            emptied = before > 1e-12 and abs(held[key]) < 1e-12 and a.kind not in OFFLOAD_KINDS
            assert emptied == (a.kind in sem.ENDS_ACTIVATION), f"{name}: {a} leaves {held[key]}"
            last[key] = a.kind
        assert set(last.values()) <= sem.ENDS_ACTIVATION, name


def test_lanes_agree_with_the_ir_kind_sets() -> None:
    for kind in K:
        lane = sem.lane_of(kind)
        assert (lane == sem.COMPUTE) == (kind in COMPUTE_KINDS)
        assert (lane in (sem.SEND, sem.RECV)) == (kind in COMM_KINDS)
        assert (lane == sem.COPY) == (kind in COPY_KINDS)


def test_consumers_read_producers_backwards() -> None:
    n = 5
    for kind in K:
        if sem.lane_of(kind) != sem.COMPUTE:
            continue
        for stage in range(n):
            for consumer, consumer_stage in sem.consumers(kind, stage, n):
                assert any(kind in kinds and s == stage for kinds, s in sem.producers(consumer, consumer_stage, n))
            for kinds, producer_stage in sem.producers(kind, stage, n):  # and none is missing
                for producer in kinds:
                    if sem.lane_of(producer) == sem.COMPUTE:
                        assert (kind, stage) in sem.consumers(producer, producer_stage, n)
    assert sem.consumers(K.F, 1, n) == ((K.B, 1), (K.I, 1), (K.R, 1), (K.F, 2))
    assert sem.consumers(K.I, 1, n) == ((K.B, 0), (K.I, 0), (K.W, 1))


def test_transfers_on_v_placement() -> None:
    owner = Placement.v(2, 2).stage_to_rank  # stages 0 1 | 2 3 on ranks 0 1 1 0
    assert sem.transfers(K.F, 0, owner) == ((), (K.SEND_F,))
    assert sem.transfers(K.F, 2, owner) == ((), (K.SEND_F,))  # stage 1 -> 2 stays on rank 1
    assert sem.transfers(K.F, 3, owner) == ((K.RECV_F,), ())
    assert sem.transfers(K.I, 0, owner) == ((K.RECV_B,), ())
    assert sem.transfers(K.B, 1, owner) == ((), (K.SEND_B,))
    assert sem.transfers(K.W, 1, owner) == sem.transfers(K.OFFLOAD, 1, owner) == ((), ())


def test_unknown_kinds_are_refused_by_name() -> None:
    for rule in (lambda: sem.producers("X", 0, 2), lambda: sem.memory_delta("X", 1.0, 1.0),  # type: ignore[arg-type]
                 lambda: sem.lane_of("X")):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="action kind X"):
            rule()


def test_w_filling_replay_refuses_kinds_it_does_not_time() -> None:
    placement = Placement.loop(2, 1)
    rows = [[Action(K.F, 0, 0), Action(K.R, 0, 0), Action(K.B, 0, 0)], [Action(K.F, 1, 0), Action(K.B, 1, 0)]]
    with pytest.raises(ValueError, match="times F, I, B and W only, not R"):
        fill_weight_passes(placement, rows)
