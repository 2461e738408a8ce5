"""``--fsdp``: each stage module sharded over the data-parallel mesh dimension with FSDP2 (``fully_shard``),
driven by the training loop at the runtime's actions.

FSDP2 left to its own hooks does not see the runtime's split backward: W adds its weight gradients
to ``param.grad`` itself, so the ``AccumulateGrad`` hooks FSDP waits for never fire and it reduced 2
of 4 gradients (docs/decisions.md). So the loop drives it, as ``torch.distributed.pipelining``'s
REDUCE_GRAD action does:

- before the step, every stage is all-gathered (``unshard``) and stays unsharded until its last B or
  W: F, I, W, B and R all run on the same unsharded parameters (``reshard_after_forward=False``;
  gradient sync, "last backward" and reshard-after-backward switched off);
- right after the stage's last B or W (``PipelineRunner(on_stage_gradients=...)``) its gradients
  are reduce-scattered (the mean over the replicas, ``post_backward`` of each parameter group) and
  the stage resharded, while the rank runs its other stages;
- after the runner's step, the root's final callback waits for the reduce-scatters and leaves each
  parameter's ``.grad`` as a DTensor shard, which clipping and AdamW work on.

Between steps a rank holds 1/dp of its stages' weights, gradients and AdamW state; during the step
it holds the whole stage (the memory FSDP saves within a step goes to the pipeline's in-flight
microbatches). The parameters the optimizer and the checkpoints see are the sharded DTensors.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

from torch import nn

log = logging.getLogger(__name__)


class ShardedStages:
    """This rank's stage modules under ``fully_shard`` over ``mesh`` (the 1-D data-parallel mesh)."""

    def __init__(self, stages: Mapping[int, nn.Module], mesh: Any) -> None:
        from torch.distributed.fsdp import fully_shard

        # FSDP warns when a module returns a view: an in-place op on it would drop the pre-backward
        # hook that all-gathers the weights. Here every stage is all-gathered for the whole step by
        # ``begin_step``, so that hook has nothing to do (and the runtime changes no output in place).
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        self.modules: dict[int, Any] = dict(stages)
        for module in self.modules.values():
            # kept unsharded from the step's first F to the stage's last B/W: W needs the parameters
            # I saw, and a reshard would replace the tensors its captured graph refers to
            fully_shard(module, mesh=mesh, reshard_after_forward=False)
        self._reduced: list[int] = []

    def begin_step(self) -> None:
        """All-gather every stage; no backward of the step reduces or reshards on its own."""
        for module in self.modules.values():
            module.unshard()
            _sync(module, False)
        self._reduced = []

    def reduce(self, stage: int) -> None:
        """The stage's gradients are final: start their reduce-scatter (mean over the replicas) and
        reshard the stage; ``finish`` waits for them."""
        module = self.modules[stage]
        _sync(module, True)
        for state in _state(module)._state_ctx.all_states:  # private, as in torch.distributed.pipelining
            for group in state._fsdp_param_groups:
                group.post_backward()
        self._reduced.append(stage)

    def finish(self) -> None:
        """After the runner's step: wait for the reduce-scatters; each ``.grad`` is a DTensor shard."""
        missing = sorted(set(self.modules) - set(self._reduced))
        if missing:  # every stage has a backward in a training step; this would be a runtime bug
            raise RuntimeError(f"stages {missing} were not reduced in this step (no last B or W reported)")
        for stage in self._reduced:
            _state(self.modules[stage])._root_post_backward_final_callback()
        self._reduced = []

    def reshard(self) -> None:
        """Free the all-gathered parameters (after an evaluation, whose forward all-gathers them)."""
        for module in self.modules.values():
            module.reshard()


def _state(module: nn.Module) -> Any:
    from torch.distributed.fsdp import fully_shard

    return fully_shard.state(module)  # type: ignore[attr-defined]


def _sync(module: Any, on: bool) -> None:
    module.set_requires_gradient_sync(on)
    module.set_is_last_backward(on)
    module.set_reshard_after_backward(on)
