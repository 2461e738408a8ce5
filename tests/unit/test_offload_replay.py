"""A plan made for slower copies, run with faster ones, never peaks higher (own host links, one copy
engine per rank, the default): the guarantee of docs/offload.md, "A faster link than planned".

The pass issues every copy right after the last compute action that ends at or before its planned
start, and one copy engine runs a rank's copies in issue order. So in a replay at a smaller k every
compute action keeps its time, every copy starts and ends no later, and each allocation keeps its
order against every free: the set of activations alive together can only shrink. The same check
fails on a shared host link, where it does not hold (the plan group-interleaved d = 8, g = 8,
m = 32 makes at k = 0.5 peaks at 5 there and at 6 replayed at k = 0.45:
benchmarks/replay_at_smaller_k.py).
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

FAMILIES = [("gpipe", 1, {}), ("1f1b", 1, {}), ("interleaved-1f1b", 2, {}), ("group-interleaved", 2, {"group_size": 2}),
            ("zb-h1", 1, {}), ("zb-h2", 1, {}), ("zb-v", 2, {}), ("v-min", 2, {})]
FACTORS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.97, 1.0)  # replay at k = factor x the k the plan was made for


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(FAMILIES), ranks=st.sampled_from([4, 6, 8]), per_rank=st.sampled_from([2, 3, 4]),
       k=st.floats(0.1, 2.0), policy=st.sampled_from(["all", "auto", "first:1", "budget:2"]),
       w_fraction=st.sampled_from([1.0, 0.5]), time_w=st.sampled_from([1.0, 0.6]))
def test_a_plan_replayed_with_faster_copies_never_peaks_higher(
        family: tuple, ranks: int, per_rank: int, k: float, policy: str, w_fraction: float, time_w: float) -> None:
    name, v, options = family
    schedule = generate(name, ranks, per_rank * ranks, v, **options)
    costs = CostModel(w_fraction=w_fraction, time_w=time_w)
    planned = costs.with_offload_ratio(k)
    lowered = lower(schedule, planned, offload=policy)
    made = simulate(lowered, planned)
    if made.stall > 0:  # the guarantee is for plans without a stall (the pass's own plans have none)
        return
    peaks = []
    for factor in FACTORS:
        replay = simulate(lowered, costs.with_offload_ratio(k * factor))
        assert replay.stall == 0, f"{name} k={k:g}: a stall replayed at {k * factor:g}"
        assert replay.makespan <= made.makespan + 1e-9
        for rank, (now, then) in enumerate(zip(replay.per_rank, made.per_rank)):
            assert now.peak_activation_units <= then.peak_activation_units + 1e-9, (
                f"{name} d={ranks} {policy} made at k={k:g}: rank {rank} peaks "
                f"{now.peak_activation_units:g} at k={k * factor:g}, {then.peak_activation_units:g} as planned")
        peaks.append(replay.peak_activation_units)
    # and the faster the copies, the lower (or equal) the peak, all the way down
    assert all(a <= b + 1e-9 for a, b in zip(peaks, peaks[1:])), f"{name} made at k={k:g}: {peaks}"
