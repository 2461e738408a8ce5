"""The forward-only schedule an evaluation runs: each rank's F actions of the training schedule with
their comms, validated as forward-only; ``PipelineRunner.evaluate`` runs it through the interpreter."""
from __future__ import annotations

import pytest

from pipeoffload import generate, lower
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import ActionKind
from pipeoffload.passes.forward import forward_only
from pipeoffload.schedules import schedule_specs
from pipeoffload.validation import validate

K = ActionKind


@pytest.mark.parametrize("family", [s.name for s in schedule_specs()])
def test_every_family_has_a_valid_forward_only_schedule_with_its_f_order(family: str) -> None:
    spec = next(s for s in schedule_specs() if s.name == family)
    training = lower(generate(family, 4, 8, spec.default_stages_per_rank()), offload="all", recompute="first:1")
    fwd = forward_only(training)
    assert fwd.placement == training.placement and fwd.is_lowered()
    for got, row in zip(fwd.actions, training.actions):
        assert {a.kind for a in got} <= {K.F, K.SEND_F, K.RECV_F}
        assert [a for a in got if a.kind is K.F] == [a for a in row if a.kind is K.F]
    assert sum(a.kind is K.F for row in fwd.actions for a in row) == fwd.num_stages * 8


def test_forward_only_validation_refuses_backward_missing_and_deadlocking_schedules() -> None:
    training = lower(generate("1f1b", 2, 2, 1))
    with pytest.raises(ScheduleError, match="forward-only"):
        validate(training, forward_only=True)
    fwd = forward_only(training)
    with pytest.raises(ScheduleError, match="no"):
        validate(fwd)  # as a training schedule it lacks every backward
    short = fwd.with_actions([fwd.actions[0], fwd.actions[1][:-1]])  # the last F of rank 1 dropped
    with pytest.raises(ScheduleError, match="has no F"):
        validate(short, forward_only=True)
    inter = forward_only(lower(generate("interleaved-1f1b", 2, 2, 2)))
    row = list(inter.actions[0])
    first_recv = next(a for a in row if a.kind is K.RECV_F)  # of stage 2: waits on stage 1, which waits on stage 0
    row.remove(first_recv)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(inter.with_actions([[first_recv, *row], inter.actions[1]]), forward_only=True)


def test_evaluate_runs_the_forward_only_schedule_with_the_modules_losses() -> None:
    import torch
    from torch import nn

    from pipeoffload.runtime import PipelineRunner

    torch.manual_seed(0)
    stages = {0: nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 1: nn.Linear(8, 3)}
    runner = PipelineRunner(stages, lower(generate("interleaved-1f1b", 1, 4, 2), recompute="all"), 0,
                            loss_fn=nn.functional.mse_loss, min_offload_bytes=0)
    x, y = torch.randn(16, 6), torch.randn(16, 3)
    runner.step(x, y)
    grads = [p.grad.clone() for m in stages.values() for p in m.parameters()]
    losses = runner.evaluate(x, y)
    with torch.no_grad():
        want = [nn.functional.mse_loss(stages[1](stages[0](xs)), ys) for xs, ys in zip(x.chunk(4), y.chunk(4))]
    assert losses is not None and [float(v) for v in losses] == [float(v) for v in want]
    assert not any(v.requires_grad for v in losses)
    assert all(torch.equal(p.grad, g) for p, g in zip((p for m in stages.values() for p in m.parameters()), grads))
    assert runner.step(x, y) is not None  # the next training step runs as usual
