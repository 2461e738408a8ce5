"""The global gradient norm and clipping: the bits of the plain per-parameter formulas, gradients untouched."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from pipeoffload.train.optim import clip_gradients, global_grad_norm  # noqa: E402


def _params(dtype: torch.dtype) -> dict[str, torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    named = {}
    for i, shape in enumerate([(7,), (33, 5), (4, 9, 3), (1,)]):
        p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
        p.grad = (torch.randn(shape, generator=gen) * 10.0 ** (i - 2)).to(dtype)
        named[f"layers.{i}.w"] = p
    return named


def _exact(named: dict[str, torch.nn.Parameter]) -> float:
    """The norm from the exact float64 squares (a float32 or bf16 square fits in float64), summed exactly."""
    return math.sqrt(math.fsum(x for p in named.values() for x in (p.grad.to(torch.float64) ** 2).reshape(-1).tolist()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_norm_is_the_float64_sum_of_squares_and_leaves_gradients_alone(dtype: torch.dtype) -> None:
    named = _params(dtype)
    before = {n: p.grad.clone() for n, p in named.items()}
    order = {n: i for i, n in enumerate(sorted(named))}
    assert global_grad_norm(named, order, 0, 0) == pytest.approx(_exact(named), rel=1e-14)
    assert all(torch.equal(p.grad, before[n]) for n, p in named.items())  # gradients untouched


def test_norm_accumulates_in_float64_and_shards_agree_to_its_rounding() -> None:
    """A long float32 gradient: a float32 accumulation is off by ~1e-5 here; the shards of a tensor
    (FSDP, tensor parallel: one slot summed over ranks) agree with the whole to float64 rounding."""
    gen = torch.Generator().manual_seed(1)
    whole = torch.nn.Parameter(torch.zeros(1 << 20))
    whole.grad = torch.randn(1 << 20, generator=gen) * 3
    named, order = {"w": whole}, {"w": 0}
    norm = global_grad_norm(named, order, 0, 0)
    assert norm == pytest.approx(_exact(named), rel=1e-12)
    shards = {}
    for i, part in enumerate(whole.grad.chunk(4)):
        shards[f"w{i}"] = torch.nn.Parameter(torch.zeros_like(part))
        shards[f"w{i}"].grad = part
    sharded = global_grad_norm(shards, {n: i for i, n in enumerate(shards)}, 0, 0)
    assert sharded == pytest.approx(norm, rel=1e-13)
    assert torch.tensor(1.0 / (sharded + 1e-6)).item() == torch.tensor(1.0 / (norm + 1e-6)).item()  # clip scale, fp32


def test_clip_scales_every_gradient_as_mul_does() -> None:
    named = _params(torch.float32)
    params = list(named.values())
    expected = [p.grad * (1.0 / (5.0 + 1e-6)) for p in params]
    clip_gradients(params, 5.0, 1.0)
    assert all(torch.equal(p.grad, e) for p, e in zip(params, expected))
    clip_gradients(params, math.inf, 1.0)  # a non-finite norm: left for the caller's skip
    assert all(torch.equal(p.grad, e) for p, e in zip(params, expected))
