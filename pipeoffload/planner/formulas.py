"""Closed-form estimates from the paper and the reference: offload ratio k, bubbles, GIS memory.

These are the quick answers the planner explains itself with; the planner's decisions come from the
simulator, which does not assume uniform costs, infinite copy bandwidth or a periodic schedule.
"""
from __future__ import annotations

import math

from pipeoffload.errors import ConfigError


def formula1_k(hidden: int, seq: int, flops: float, offload_bandwidth: float) -> float:
    """The paper's Formula 1: k = 10*B_c / (3*(6h+s)*B_o).

    Both copies (D2H + H2D) of one layer's activations (20*s*b*h bytes with partial recomputation)
    divided by that layer's forward + backward time (12*s*b*h*(6h+s) FLOPs at B_c FLOP/s). It does
    not depend on the microbatch size, the number of layers or the tensor-parallel size.
    """
    if hidden < 1 or seq < 1:
        raise ConfigError(f"hidden={hidden}, seq={seq}: both must be >= 1")
    if not flops > 0 or not offload_bandwidth > 0:
        raise ConfigError(f"B_c={flops!r}, B_o={offload_bandwidth!r}: both must be > 0")
    return 10.0 * flops / (3.0 * (6 * hidden + seq) * offload_bandwidth)


def offload_time(k: float) -> float:
    """The reference's ``--offload-time``: (D2H + H2D) / 2 / (F + B) = k / 2."""
    return k / 2.0


def hideable_fraction(k: float) -> float:
    """Share of activations whose copies fit under compute with one copy engine: min(1, 1/k)."""
    return 1.0 if k <= 1.0 else 1.0 / k


def bubble_1f1b(d: int, m: int) -> float:
    """Idle fraction of 1F1B with uniform stages and free communication: (d-1)/(m+d-1)."""
    return (d - 1) / (m + d - 1)


def gis_idle_slots(d: int, m: int, v: int, g: int) -> int:
    """Idle F-slots per rank of group-interleaved 1F1B (unit F=B=W, free comm; spec c3)."""
    return 2 * (d - 1) + (d - g) * (v - 1) + ((g - m % g) % g) * (v - 1)


def gis_bubble(d: int, m: int, v: int, g: int) -> float:
    idle = gis_idle_slots(d, m, v, g)
    return idle / (3 * m * v + idle)


def gis_peak_units(d: int, v: int, g: int, offloaded_stages: int = 0) -> int:
    """Peak resident activation units of GIS on rank 0 (spec c3): g(v-1)+d without offload,
    g(v-oc) with the first oc < v stages offloaded and instant copies, 0 with all offloaded."""
    if offloaded_stages <= 0:
        return g * (v - 1) + d
    return max(0, g * (v - offloaded_stages))


def min_group_size(d: int) -> int:
    """Smallest group size that keeps GIS free of extra gaps with uniform stages: ceil(d/2)."""
    return math.ceil(d / 2)
