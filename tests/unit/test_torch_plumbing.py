"""torch's own distributed plumbing in place of hand-made copies (DTensor's public API)."""
from __future__ import annotations

import datetime
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pipeoffload
from pipeoffload.train.optim import local_tensor


@pytest.fixture()
def one_rank() -> Iterator[None]:
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        try:
            yield
        finally:
            dist.destroy_process_group()


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
