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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_norm_is_the_float64_sum_of_squares_in_name_order_and_leaves_gradients_alone(dtype: torch.dtype) -> None:
    named = _params(dtype)
    before = {n: p.grad.clone() for n, p in named.items()}
    order = {n: i for i, n in enumerate(sorted(named))}
    squares = torch.zeros(len(order), dtype=torch.float64)
    for n, p in named.items():
        g = p.grad.to(torch.float64)
        squares[order[n]] = (g * g).sum()
    assert global_grad_norm(named, order, 0, 0) == float(squares.sum().sqrt())  # bit for bit
    assert all(torch.equal(p.grad, before[n]) for n, p in named.items())  # a float64 gradient is not squared in place


def test_clip_scales_every_gradient_as_mul_does() -> None:
    named = _params(torch.float32)
    params = list(named.values())
    expected = [p.grad * (1.0 / (5.0 + 1e-6)) for p in params]
    clip_gradients(params, 5.0, 1.0)
    assert all(torch.equal(p.grad, e) for p, e in zip(params, expected))
    clip_gradients(params, math.inf, 1.0)  # a non-finite norm: left for the caller's skip
    assert all(torch.equal(p.grad, e) for p, e in zip(params, expected))
