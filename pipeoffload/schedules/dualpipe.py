"""DualPipeV (DeepSeek's DualPipe cut in half): V placement, forward/backward pairs of different
microbatches meant to overlap (one's compute with the other's all-to-all in MoE models).

Our IR has no overlapped pair: each pair is emitted as its forward followed by its backward, which
is also how torch's CSV export reads once its ``OVERLAP_F_B`` cells are expanded. The first half of
the backwards are full B; from the middle of the drain on, backwards split into I and W and the W
passes fill the drain. The order is the one torch.distributed.pipelining's ``ScheduleDualPipeV``
builds (a test checks they are identical).
"""
from __future__ import annotations

from collections import deque

from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.placement import Placement

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741


class _Rank:
    """Builds one rank's order: per-stage counters and the queue of W passes owed to earlier I's."""

    def __init__(self, d: int, rank: int) -> None:
        self.first, self.last = rank, 2 * d - 1 - rank
        self.order: list[Action] = []
        self.next_f = {self.first: 0, self.last: 0}
        self.next_back = {self.first: 0, self.last: 0}
        self.owed_w: deque[Action] = deque()
        self.split = False  # backwards split into I + W once the drain is half done

    def forward(self, stage: int) -> None:
        self.order.append(Action(F, stage, self.next_f[stage]))
        self.next_f[stage] += 1

    def backward(self, stage: int, split: bool | None = None) -> None:
        mb = self.next_back[stage]
        self.next_back[stage] += 1
        if split if split is not None else self.split:
            self.order.append(Action(I, stage, mb))
            self.owed_w.append(Action(W, stage, mb))
        else:
            self.order.append(Action(B, stage, mb))

    def weight(self) -> None:
        if self.owed_w:
            self.order.append(self.owed_w.popleft())

    def pair(self, forward_stage: int, backward_stage: int) -> None:
        """An overlapped pair in DualPipeV; back to back here."""
        self.forward(forward_stage)
        self.backward(backward_stage, split=False)


def _rank_order(d: int, m: int, rank: int) -> list[Action]:
    r = _Rank(d, rank)
    first, last, ahead = r.first, r.last, d - rank - 1
    for _ in range(2 * ahead):  # 1: local stage 0 forwards that fill the V down to the last rank
        r.forward(first)
    for _ in range(rank + 1):  # 2: both local stages' forwards
        r.forward(first)
        r.forward(last)
    for _ in range(ahead):  # 3: zero-bubble warm-up on local stage 1
        r.backward(last, split=True)
        r.weight()
        r.forward(last)
    for step in range(m - 2 * d + rank + 1):  # 4: main loop, two overlapped pairs per step
        if step == 0 and rank == d - 1:
            r.forward(first)
            r.backward(last, split=False)
        else:
            r.pair(first, last)
        r.pair(last, first)
    for _ in range(ahead):  # 5: local stage 1 backwards as the forwards run out
        r.backward(last, split=False)
        r.pair(last, first)
    half = (rank + 1) // 2
    for step in range(rank + 1):  # 6: both local stages' backwards, switching to I + W half-way
        if step == half and rank % 2 == 1:
            r.split = True
        r.backward(last)
        if step == half and rank % 2 == 0:
            r.split = True
        r.backward(first)
    for _ in range(ahead):  # 7: local stage 0 backwards, each after an owed W
        r.weight()
        r.backward(first)
    while r.owed_w:  # 8: the remaining W passes
        r.weight()
    return r.order


def dualpipe_v(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """DualPipeV (DeepSeek-V3's DualPipe folded onto half the ranks).

    rank r (s0 = r, s1 = 2d-1-r, a = d-1-r): warm-up = 2a F s0, (r+1) x (F s0 F s1),
            a x (I s1 W F s1) | steady: m-2d+r+1 x (F s0 B s1, F s1 B s0) pairs | cool-down:
            a x (B s1, F s1 B s0), (r+1) x (B s1 B s0) turning into I's half-way, a x (W I s0), W's.
    DeepSeek's and torch's implementations require m >= 2d (the number of stages); for fewer
    microbatches this builds the order for 2d and drops the passes of the missing ones (the order
    stays valid: a test checks every m from 1).
    Peak about d + 1/2 rank units: the pairs keep one more local stage 0 activation than ZB-V. In our IR
    the pairs run back to back, so its bubble here matches ZB-V's with unit costs; its gain (hiding
    MoE all-to-all under the paired pass) is outside this cost model.
    """
    d, m = num_ranks, num_microbatches
    if stages_per_rank != 2:
        raise ConfigError.named(lambda n: (
            f"{n.given('stages_per_rank', stages_per_rank)}: dualpipe-v uses V placement, which holds exactly 2 "
            f"stages per rank (r and 2d-1-r); pass {n.given('stages_per_rank', 2)}"))
    n = max(m, 2 * d)
    rows = tuple(tuple(a for a in _rank_order(d, n, rank) if a.microbatch < m) for rank in range(d))
    return Schedule(rows, Placement.v(d, 2), m, "dualpipe-v")
