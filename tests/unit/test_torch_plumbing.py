"""torch's own distributed plumbing in place of hand-made copies (DTensor's public API)."""
from __future__ import annotations

from pathlib import Path

import torch

import pipeoffload
from pipeoffload.train.optim import local_tensor


def test_no_private_dtensor_attribute_is_read() -> None:
    root = Path(pipeoffload.__file__).parent
    readers = [str(p.relative_to(root)) for p in root.rglob("*.py") if "_local_tensor" in p.read_text()]
    assert readers == [], f"use DTensor.to_local(), not the private _local_tensor: {readers}"


def test_local_tensor_is_the_shard_and_writes_through(one_rank: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    weight = torch.nn.Parameter(distribute_tensor(torch.arange(6.0).reshape(2, 3), mesh, [Shard(0)]))
    local = local_tensor(weight)
    assert local.grad_fn is None and local.data_ptr() == weight.to_local().data_ptr()
    (weight * 2).sum().backward()
    local_tensor(weight.grad).mul_(0.5)  # what clipping does
    assert torch.equal(weight.grad.full_tensor(), torch.ones(2, 3))
    plain = torch.ones(2)
    assert local_tensor(plain) is plain


def _tiny(seed: int) -> tuple[dict[str, torch.nn.Parameter], torch.optim.Optimizer]:
    """Two parameters under full names of a later stage, and their optimizer after one step."""
    from pipeoffload.train.config import TrainConfig
    from pipeoffload.train.optim import make_optimizer

    torch.manual_seed(seed)
    layer = torch.nn.Linear(3, 2)
    named = {"layers.5.fc.weight": layer.weight, "layers.5.fc.bias": layer.bias}
    opt = make_optimizer(TrainConfig.build(), list(named.values()), None, 1)
    layer(torch.randn(4, 3)).square().sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return named, opt


def _same(a: tuple[dict[str, torch.nn.Parameter], torch.optim.Optimizer],
          b: tuple[dict[str, torch.nn.Parameter], torch.optim.Optimizer]) -> bool:
    (na, oa), (nb, ob) = a, b
    for n in na:
        sa, sb = oa.state[na[n]], ob.state[nb[n]]
        if not (torch.equal(na[n], nb[n]) and all(torch.equal(sa[k], sb[k]) for k in ("step", "exp_avg", "exp_avg_sq"))):
            return False
    return True


def test_the_optimizer_state_is_not_created_by_hand() -> None:
    from pipeoffload.train.config import TrainConfig
    from pipeoffload.train.optim import make_optimizer

    assert not make_optimizer(TrainConfig.build(), [torch.nn.Parameter(torch.ones(2))], None, 1).state


def test_checkpoint_state_comes_from_get_state_dict_and_round_trips(one_rank: None, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig

    saved = _tiny(0)
    path = checkpoint.save(tmp_path, 1, TrainConfig.build(), saved[0], saved[1], 0, 1, {})
    keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    assert {"model.layers.5.fc.weight", "optim.state.layers.5.fc.weight.exp_avg",
            "optim.param_groups.layers.5.fc.bias.weight_decay"} <= keys
    fresh = _tiny(1)  # other weights and moments: all replaced by the checkpoint's
    assert not _same(saved, fresh)
    checkpoint.load(path, fresh[0], fresh[1], 0, 1)
    assert _same(saved, fresh)


def test_a_checkpoint_with_the_older_optimizer_keys_still_loads(one_rank: None, tmp_path: Path) -> None:
    import json

    import torch.distributed.checkpoint as dcp

    from pipeoffload.train import checkpoint

    named, opt = saved = _tiny(0)
    old = {f"model.{n}": p.detach() for n, p in named.items()}
    old.update({f"optim.{n}.{k}": v for n, p in named.items() for k, v in opt.state[p].items()})
    dcp.save(old, checkpoint_id=str(tmp_path))
    (tmp_path / "trainer.json").write_text(json.dumps({"step": 1, "world": 1}))
    fresh = _tiny(1)
    checkpoint.load(tmp_path, fresh[0], fresh[1], 0, 1)
    assert _same(saved, fresh)


def test_a_background_save_becomes_a_checkpoint_only_when_awaited(one_rank: None, tmp_path: Path) -> None:
    """--async-save: the shards are written by dcp.async_save from a copy taken at the save; until
    ``wait`` the checkpoint is a .tmp folder that nothing resumes from (a crash then leaves no half
    checkpoint), and the steps after the save do not change what it holds."""
    from pipeoffload.train import checkpoint
    from pipeoffload.train.config import TrainConfig

    cfg = TrainConfig.build(async_save=True)
    named, opt = saved = _tiny(0)
    expected = _tiny(0)  # the same state, untouched
    saver = checkpoint.Saver(cfg)
    assert saver.save(tmp_path, 1, named, opt, 0, 1, {}) is None
    assert checkpoint.list_checkpoints(tmp_path) == [] and (tmp_path / "checkpoints" / ".tmp-step-000001").is_dir()
    for p in named.values():  # the next step runs while the write may be in flight
        p.grad = torch.ones_like(p)
    saved[1].step()
    path = saver.wait()
    assert path == checkpoint.step_dir(tmp_path, 1) and checkpoint.list_checkpoints(tmp_path) == [path]
    checkpoint.verify(path)
    fresh = _tiny(1)
    checkpoint.load(path, fresh[0], fresh[1], 0, 1)
    assert _same(expected, fresh) and not _same(saved, fresh)
