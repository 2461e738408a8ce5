"""Boundary specs of nested values: tensors inside containers are leaves; opaque objects holding
tensors are refused instead of being treated as constants."""
from __future__ import annotations

import pickle

import pytest
import torch

from pipeoffload.errors import ConfigError
from pipeoffload.runtime.spec import Const, Spec, TensorSpec, as_inputs, check_values, flatten, spec_of


def test_nested_containers_flatten_to_leaves_and_rebuild():
    h = torch.ones(2, 3, requires_grad=True) * 2
    values = ({"h": h, "aux": [torch.zeros(2, dtype=torch.bool), 3]}, None)
    spec = spec_of(values)
    assert spec.leaves == (TensorSpec((2, 3), torch.float32, True), TensorSpec((2,), torch.bool, False), Const(3),
                           Const(None))
    leaves, tree = flatten(values)
    check_values(leaves, tree, spec, "here")
    rebuilt = as_inputs(leaves, spec)
    assert rebuilt[0]["h"].requires_grad and rebuilt[0]["h"].grad_fn is None and rebuilt[0]["aux"][1] == 3
    assert pickle.loads(pickle.dumps(spec)) == spec  # broadcast between ranks


def test_changed_structure_is_refused():
    spec = spec_of(({"h": torch.ones(2)},))
    leaves, tree = flatten(({"g": torch.ones(2)},))
    with pytest.raises(ConfigError, match="structured as"):
        check_values(leaves, tree, spec, "output of stage 0")


def test_declared_flat_tuple_spec():
    spec = Spec.flat((TensorSpec((2,), torch.float32, True), Const(None), Const(1)))
    assert spec.build([torch.ones(2), None, 1])[2] == 1


class Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def test_opaque_object_holding_tensors_is_refused():
    with pytest.raises(ConfigError, match="type Holder holds tensors"):
        spec_of((torch.ones(2), Holder(torch.ones(2))))


def test_a_flat_tuple_skips_the_pytree_walk_and_gives_what_the_walk_gives(monkeypatch):
    """Most stages pass a flat tuple of tensors and scalars: flattening it (twice per forward) must not
    pay for torch's pytree walk, and the result is the walk's, so specs compare equal either way."""
    from torch.utils._pytree import tree_flatten

    from pipeoffload.runtime import spec as spec_module

    h = torch.ones(2, 3, requires_grad=True)
    flat_values = [(h, None, 0), h, (h, 1.5, "x", True)]
    expected = [tree_flatten(v if isinstance(v, tuple) else (v,)) for v in flat_values]
    walks = []
    monkeypatch.setattr(spec_module, "tree_flatten", lambda v: walks.append(v) or tree_flatten(v))
    for values, (leaves, tree) in zip(flat_values, expected):
        got_leaves, got_tree = flatten(values)
        assert got_tree == tree and len(got_leaves) == len(leaves) and all(a is b for a, b in zip(got_leaves, leaves))
        spec = spec_of(values)
        assert spec.build(got_leaves) == tuple(got_leaves) and spec == Spec(spec.leaves, tree)
    assert not walks
    nested = (h, [h, 1])
    assert flatten(nested)[1] == tree_flatten(nested)[1] and walks == [nested]


def test_a_batch_that_the_microbatches_do_not_divide_is_refused() -> None:
    """10 rows in 4 microbatches split 3, 3, 2, 2; the runner weighs each piece's mean loss 1/4, so the step's
    loss was silently not the batch's mean (probe M: 4.318235 against 4.319153). Refused, naming the fix."""
    from pipeoffload.runtime.spec import split_microbatches

    with pytest.raises(ConfigError, match=r"shape \(10, 3\).*multiple of 4"):
        split_microbatches((torch.zeros(10, 3),), 4, torch.device("cpu"), "inputs")
    pieces = split_microbatches((torch.zeros(12, 3), "kept"), 4, torch.device("cpu"), "inputs")
    assert [p[0].shape[0] for p in pieces] == [3, 3, 3, 3] and all(p[1] == "kept" for p in pieces)
