"""The runner holds a microbatch's inputs and targets on the device only while the microbatch is in flight, as
the planner counts them (first stage: the token ids per in-flight slot, ``planner.trainblocks.embedding_bytes``;
last: the targets, ``head_bytes``): each is copied to the device by its forward and given up by the runner there.
They were copied for every microbatch at the step's start and held until the next step. The losses and
gradients are bit for bit those of the whole batch run one microbatch at a time."""
from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch import nn

from pipeoffload import generate
from pipeoffload.runtime import PipelineRunner

VOCAB, SEQ, ROWS = 16, 8, 2  # each microbatch: ROWS sequences of SEQ int64 token ids


class Tracked(nn.Module):
    """Embedding, mean over the sequence, projection: records each forward's token ids (weakly) and how many of
    the ids it received before are still alive at that moment."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.proj = nn.Embedding(VOCAB, 12), nn.Linear(12, 3)
        self.seen: list[weakref.ref] = []
        self.alive_at_forward: list[int] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.alive_at_forward.append(sum(ref() is not None for ref in self.seen))
        self.seen.append(weakref.ref(ids))
        return self.proj(self.embed(ids).mean(dim=1))


def _batch(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (m * ROWS, SEQ), generator=g), torch.randint(0, 3, (m * ROWS,), generator=g)


def _step(m: int) -> tuple[Tracked, list[weakref.ref], Any]:
    module, targets_seen = Tracked(), []

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        targets_seen.append(weakref.ref(target))
        return nn.functional.cross_entropy(out, target)

    runner = PipelineRunner({0: module}, generate("1f1b", 1, m, 1), 0, loss_fn=loss, min_offload_bytes=1)
    ids, targets = _batch(m)
    total = runner.step((ids,), targets)
    return module, targets_seen, (runner, total)


@pytest.mark.parametrize("m", [2, 4])
def test_a_microbatch_is_held_only_while_in_flight(m: int) -> None:
    module, targets_seen, _keep = _step(m)
    # one rank, one stage, 1F1B: every earlier microbatch has run its backward when the next forward starts
    assert module.alive_at_forward == [0] * m, module.alive_at_forward
    assert [ref() for ref in module.seen] == [None] * m  # after the step: nothing of the batch is held
    assert [ref() for ref in targets_seen] == [None] * m


def test_the_step_is_bitwise_the_batch_one_microbatch_at_a_time() -> None:
    m = 4
    module, _, (runner, total) = _step(m)
    reference = Tracked()
    ids, targets = _batch(m)
    expected = None
    for tok, tgt in zip(ids.tensor_split(m), targets.tensor_split(m)):
        part = nn.functional.cross_entropy(reference(tok), tgt) / m
        part.backward()
        expected = part.detach() if expected is None else expected + part.detach()
    assert torch.equal(total, expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(module.parameters(), reference.parameters()))
