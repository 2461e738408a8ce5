"""One stage in one process: the I/W split and recompute give exactly the full backward's numbers."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeoffload.models import GPTConfig, gpt_layers, lm_loss, sample_batch, split_layers
from pipeoffload.runtime.offload import ActivationStore
from pipeoffload.runtime.stage import PipelineStage

CFG = GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=4, dropout=0.1)


def _stage(index: int, layers: list, *, num_stages: int = 3) -> PipelineStage:
    module = split_layers(layers, [len(layers)], copy_layers=True)[0]
    store = ActivationStore("cpu", list(module.parameters()), min_bytes=64)
    loss = lm_loss if index == num_stages - 1 else None
    return PipelineStage(module, index, num_stages, store, loss_fn=loss, num_microbatches=2)


def _inputs(index: int):
    (tokens, mask, offset), targets = sample_batch(CFG, 2, seed=3)
    if index == 0:
        return (tokens, mask, offset), targets
    hidden = torch.randn(2, CFG.seq, CFG.hidden, generator=torch.Generator().manual_seed(4)).requires_grad_()
    return (hidden, mask, offset), targets


@pytest.mark.parametrize("index, layer_slice", [(0, slice(0, 3)), (1, slice(3, 5)), (2, slice(4, 6))],
                         ids=["first", "middle", "last"])
@pytest.mark.parametrize("mode", ["IW", "recompute", "recompute+IW"])
def test_split_and_recompute_equal_full_backward(index, layer_slice, mode):
    layers = gpt_layers(CFG, seed=1)[layer_slice]
    grads = {}
    for variant in ("B", mode):
        torch.manual_seed(7)  # dropout masks: the same random numbers in both runs
        stage = _stage(index, layers)
        args, targets = _inputs(index)
        args = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)
        out = stage.forward(0, args, targets, recompute="recompute" in variant)
        out_grad = None if stage.is_last else [torch.ones_like(out[0])]
        if "recompute" in variant:
            stage.recompute(0)
        if "IW" in variant:
            in_grads = stage.backward_input(0, out_grad)
            stage.backward_weight(0)
        else:
            in_grads = stage.backward(0, out_grad)
        stage.store.release(index, 0)
        grads[variant] = (in_grads, [p.grad for p in stage.params])
        assert stage.store.resident_bytes == 0 and stage.pending() == []
    (in_b, w_b), (in_x, w_x) = grads["B"], grads[mode]
    assert len(in_b) == len(in_x) and all(torch.equal(a, b) for a, b in zip(in_b, in_x))
    assert all(a is not None and torch.equal(a, b) for a, b in zip(w_b, w_x))


def test_input_backward_defers_weight_gradients_on_a_middle_stage():
    stage = _stage(1, gpt_layers(CFG, seed=1)[2:4])
    args, _ = _inputs(1)
    out = stage.forward(0, args)
    (dx,) = stage.backward_input(0, [torch.ones_like(out[0])])
    assert dx is not None and dx.shape == args[0].shape
    assert all(p.grad is None for p in stage.params)
    stage.backward_weight(0)
    assert all(p.grad is not None for p in stage.params)


class TwoOutputs(nn.Module):
    """The second output depends on a parameter only: no input path reaches it (an 'orphan')."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.full((8,), 2.0))

    def forward(self, x):
        return self.lin(x), self.scale * 3.0


def test_parameters_outside_every_input_path_get_their_gradient_in_w():
    results = []
    for split in (False, True):
        torch.manual_seed(0)
        module = TwoOutputs()
        store = ActivationStore("cpu", list(module.parameters()), min_bytes=0)
        stage = PipelineStage(module, 1, 3, store)
        x = torch.randn(4, 8, requires_grad=True)
        stage.forward(0, (x,))
        grads = [torch.ones(4, 8), torch.ones(8)]
        if split:
            (dx,) = stage.backward_input(0, grads)
            assert module.scale.grad is None
            stage.backward_weight(0)
        else:
            (dx,) = stage.backward(0, grads)
        results.append((dx, [p.grad.clone() for p in module.parameters()]))
    (dx_b, g_b), (dx_s, g_s) = results
    assert torch.equal(dx_b, dx_s) and all(torch.equal(a, b) for a, b in zip(g_b, g_s))


def test_nodes_w_runs_are_the_paths_from_each_groups_intermediates_to_its_parameters():
    """The shortcut for one-intermediate groups (the weight branch) finds exactly the nodes on a path
    from the intermediates to the parameters, as the general two-closure intersection does."""
    from pipeoffload.runtime import backward as bw

    layers = gpt_layers(CFG, seed=1)[1:4]
    module = split_layers(layers, [len(layers)], copy_layers=True)[0]
    (hidden, mask, offset), _ = _inputs(1)
    out = module(hidden, mask, offset)[0]
    params = [p for p in module.parameters() if p.requires_grad]
    groups, orphans, needed = bw._plan([out], [hidden], params)
    assert not orphans and any(len(g.nodes) == 1 for g in groups)
    parents = bw._reverse_graph([bw._edge(out).node])
    general: set = set()
    for g in groups:
        up = bw._closure([bw._edge(p).node for p in g.params], parents.__getitem__)
        general |= up & bw._closure(g.nodes, lambda n: (c for c, _ in n.next_functions))
    assert needed == general


def test_the_parameters_accumulators_are_found_once_per_stage_not_per_microbatch(monkeypatch):
    """Finding a parameter's AccumulateGrad costs a view_as; the stage holds them (as DDP does), so a
    later microbatch's I and W look up none, and the numbers stay those of the full backward."""
    from pipeoffload.runtime import backward as bw

    layers = gpt_layers(CFG, seed=1)[2:4]
    stage, reference = _stage(1, layers), _stage(1, layers)
    args, _ = _inputs(1)
    lookups = []
    real = bw.get_gradient_edge
    monkeypatch.setattr(bw, "get_gradient_edge", lambda t: lookups.append(t) or real(t))
    params = {id(p) for p in stage.params}
    for mb in range(2):
        lookups.clear()
        torch.manual_seed(mb)  # dropout: the same masks in both stages
        out = stage.forward(mb, args)
        stage.backward_input(mb, [torch.ones_like(out[0])])
        stage.backward_weight(mb)
        stage.store.release(1, mb)
        torch.manual_seed(mb)
        ref_out = reference.forward(mb, args)
        reference.backward(mb, [torch.ones_like(ref_out[0])])
        reference.store.release(1, mb)
        found = sum(id(t) in params for t in lookups)
        assert found == (len(params) if mb == 0 else 0)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(stage.params, reference.params))
