"""This rank's place in the ("dp", "pp", "tp") device mesh and the process groups of each dimension.

Global rank = (dp_index * pp + pp_index) * tp + tp_index: tensor-parallel peers are adjacent (on one
node under torchrun's usual numbering), then pipeline ranks, then data-parallel replicas.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class RankContext:
    rank: int
    world: int
    device: torch.device
    dp: int
    pp: int
    tp: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh
    dp_group: Any
    pp_group: Any
    tp_group: Any

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def tp_mesh(self) -> Any:
        return self.mesh["tp"]


def coordinates(rank: int, pp: int, tp: int) -> tuple[int, int, int]:
    """(dp_index, pp_index, tp_index) of a global rank."""
    dp_index, rest = divmod(rank, pp * tp)
    pp_index, tp_index = divmod(rest, tp)
    return dp_index, pp_index, tp_index


def build_context(dp: int, pp: int, tp: int, device: torch.device) -> RankContext:
    """The mesh over the initialised default process group (its size must be dp*pp*tp)."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != dp * pp * tp:
        raise RuntimeError(f"world size {world} != dp*pp*tp = {dp}*{pp}*{tp}")
    mesh = init_device_mesh(device.type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    d, p, t = coordinates(rank, pp, tp)
    return RankContext(rank, world, device, dp, pp, tp, d, p, t, mesh,
                       mesh["dp"].get_group(), mesh["pp"].get_group(), mesh["tp"].get_group())
