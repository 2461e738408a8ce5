"""What a diverged run's stop says: the learning rate first where the weights show it, and clipping as it
is set (turned on when it is off; raising a max-norm clip would loosen it). The trainer's collectives are
replaced, so no process group is needed."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from pipeoffload.train.config import build_config
from pipeoffload.train.loop import NonFiniteError, Trainer


def _trainer(extent: tuple[bool, float] = (True, 0.5), **keys: object) -> Trainer:
    trainer = Trainer.__new__(Trainer)
    trainer.cfg = build_config(keys)
    trainer.ctx = SimpleNamespace(is_main=True)
    trainer.step, trainer.skipped = 1, 0
    trainer._parameter_extent = lambda: extent  # type: ignore[method-assign]
    trainer._parameters_finite = lambda: extent[0]  # type: ignore[method-assign]
    return trainer


def _training_stop(trainer: Trainer) -> str:
    with pytest.raises(NonFiniteError) as info:
        trainer._nonfinite(3, math.nan, math.inf)
    return str(info.value)


def test_the_training_stop_turns_clipping_on_or_lowers_it() -> None:
    off = _training_stop(_trainer(lr=1e6, clip=0))
    assert "lower --lr (now 1e+06) or set --clip (e.g. --clip 1.0; it is 0, off), or allow skipped steps" in off, off
    assert "raise" not in off
    on = _training_stop(_trainer(lr=1e-2, clip=2.0))
    assert "lower --lr (now 0.01) or lower --clip (now 2), or allow skipped steps with --skip-nonfinite N" in on, on


def test_a_non_finite_validation_loss_with_inflated_weights_names_the_learning_rate() -> None:
    """`--lr 1e6 --warmup 0 --clip 0`: after one step the weights are about 1e6, finite; the forward
    overflows. The stop blamed "the model's forward" and said to check it and the data."""
    text = str(_trainer((True, 1.29e6), lr=1e6, clip=0)._nonfinite_validation(math.nan))
    assert text.startswith("step 1: validation loss nan is not finite, but the parameters are finite, up to 1.29e+06 "
                           "in absolute value: most likely the learning rate (--lr 1e+06, clipping off: --clip 0) "
                           "grew them until the forward overflows;"), text
    assert "lower --lr (now 1e+06) or set --clip (e.g. --clip 1.0; it is 0, off)" in text, text
    clipped = str(_trainer((True, 5e4), lr=1.0, clip=1.0)._nonfinite_validation(math.nan))
    assert "most likely the learning rate (--lr 1)" in clipped and "lower --lr (now 1) or lower --clip (now 1)" in clipped


def test_small_finite_weights_point_at_the_forward_and_overflowed_ones_at_the_learning_rate() -> None:
    text = str(_trainer((True, 0.75))._nonfinite_validation(math.nan))
    assert "but the parameters are finite (at most 0.75 in absolute value): the model's forward (in eval mode)" in text
    assert "most likely" not in text and "lower --lr (now 0.0003) or lower --clip (now 1)" in text, text
    overflowed = str(_trainer((False, 3.0), clip=0)._nonfinite_validation(math.inf))
    assert "the parameters overflowed; stopped without saving them; lower --lr (now 0.0003) or set --clip" in overflowed


def test_the_training_stop_names_the_ranks_whose_loss_was_not_finite() -> None:
    """The fault sweep's NaN loss on rank 1 stopped the run as "rank 0: NonFiniteError: step 3: loss nan, ...":
    which replica's batch or which rank's stage gave it was not said."""
    trainer = _trainer()
    with pytest.raises(NonFiniteError) as info:
        trainer._nonfinite(3, math.nan, math.nan, [1, 3])
    assert str(info.value).startswith("step 3: loss nan (not finite on rank 1, 3), gradient norm nan: not finite"), \
        str(info.value)
    assert _training_stop(_trainer()).startswith("step 3: loss nan, gradient norm inf: not finite")  # none named
