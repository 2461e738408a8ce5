"""train_model's model and counts are checked before any rank starts (probe G), and its messages name
the remedy as train_model takes it (keywords), not as the CLI's flags."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeoffload.errors import ConfigError
from pipeoffload.train import TrainConfig


def mlp() -> list[Any]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(7)] + [nn.Linear(8, 4)]


def with_function() -> list[Any]:
    torch.manual_seed(0)
    return [nn.Linear(8, 8), torch.relu, nn.Linear(8, 4)]


class _TiedHead(nn.Module):
    def __init__(self, first: nn.Linear) -> None:
        super().__init__()
        self.first = first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.first.weight[:4].t()


def tied_first_and_last() -> list[Any]:
    torch.manual_seed(0)
    first = nn.Linear(8, 8)
    return [first] + [nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(6)] + [_TiedHead(first)]


def tied_neighbours() -> list[Any]:
    torch.manual_seed(0)
    shared = nn.Linear(8, 8)
    return [shared, shared] + [nn.Linear(8, 8) for _ in range(5)] + [nn.Linear(8, 4)]


class Batches:
    tokens_per_sample = 1

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def train(self, step: int, dp_rank: int) -> tuple[Any, Any]:
        return torch.randn(8, 8), torch.zeros(8, dtype=torch.long)

    def val(self, dp_rank: int) -> list[tuple[Any, Any]]:
        return [self.train(0, dp_rank)]


@pytest.fixture
def no_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any rank starting fails the test: the refusals come before."""
    import pipeoffload.train.launch as launch

    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a rank started")

    monkeypatch.setattr(launch, "run_ranks", started)


def _cfg(out: Path, **keys: Any) -> TrainConfig:
    base: dict[str, Any] = {"schedule": "1f1b", "pp": 2, "nproc": 2, "microbatches": 2, "global_batch": 8,
                            "steps": 2, "progress": False, "out": str(out)}
    return TrainConfig.build(**{**base, **keys})


def _refused(tmp_path: Path, layers: Any, **kwargs: Any) -> str:
    from pipeoffload.train import train_model

    cfg_keys = kwargs.pop("cfg", {})
    with pytest.raises(ConfigError) as err:
        train_model(_cfg(tmp_path / "run", **cfg_keys), layers, F.cross_entropy, Batches, **kwargs)
    assert not (tmp_path / "run").exists()  # refused before the run folder was made
    text = str(err.value)
    assert len(text.splitlines()) == 1
    return text


# ---- 3: counts= follows split_layers' rule ----------------------------------------------------------------
@pytest.mark.parametrize("counts", [(1, 1), (5, 5), (0, 8), (4, 2, 2), (4.0, 4)])
def test_counts_that_do_not_split_the_layers_are_refused_before_the_ranks(tmp_path: Path, no_ranks: None,
                                                                          counts: tuple) -> None:
    text = _refused(tmp_path, mlp, counts=counts)
    assert text.startswith(f"counts={counts}: ")
    if len(counts) == 2:
        assert f"layer counts {counts} must be >= 1 each and sum to the 8 layers; e.g. (4, 4)" in text
    else:
        assert "3 layer counts for 2 stages" in text


def test_counts_with_stage_modules_is_refused(tmp_path: Path, no_ranks: None) -> None:
    assert "counts=" in _refused(tmp_path, mlp, counts=(4, 4), stage_modules=True)


def test_split_layers_and_train_model_share_one_rule() -> None:
    from pipeoffload.models import split_layers

    with pytest.raises(ConfigError, match=r"layer counts \(1, 1\) must be >= 1 each and sum to the 8 layers"):
        split_layers(mlp(), [1, 1])


# ---- 8: a layer that is not a module ----------------------------------------------------------------------
def test_a_function_in_the_layer_list_is_refused_naming_its_position_and_type(tmp_path: Path,
                                                                               no_ranks: None) -> None:
    text = _refused(tmp_path, with_function, cfg={"pp": 1, "nproc": 1})
    assert text.startswith("layer 1 of layers() is a builtin_function_or_method (relu), not a torch.nn.Module")


# ---- 2: a parameter shared across stages ------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["1f1b", "zb-v"])  # ranks 0 and 1; stages 0 and 3 both on rank 0
def test_a_parameter_shared_by_two_stages_is_refused_naming_it(tmp_path: Path, no_ranks: None,
                                                               schedule: str) -> None:
    text = _refused(tmp_path, tied_first_and_last, cfg={"schedule": schedule})
    last = 1 if schedule == "1f1b" else 3
    assert f"layers.0.weight (stage 0) is also layers.7.first.weight (stage {last})" in text
    assert "keep separate parameters, or put the layers that share it in one stage" in text


def test_a_parameter_shared_within_one_stage_is_accepted() -> None:
    from pipeoffload.train.model import check_user_model

    check_user_model(tied_first_and_last(), 1, None, False)  # pp=1: one stage holds both
    check_user_model(tied_neighbours(), 2, (4, 4), False)
    with pytest.raises(ConfigError, match=r"layers.0.weight \(stage 0\) is also layers.1.weight \(stage 1\)"):
        check_user_model(tied_neighbours(), 2, (1, 7), False)
    frozen = tied_first_and_last()
    frozen[0].requires_grad_(False)  # never trained: the copies stay equal
    check_user_model(frozen, 2, None, False)


def test_the_check_does_not_move_the_callers_random_numbers(tmp_path: Path, no_ranks: None) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    _refused(tmp_path, mlp, counts=(1, 1))  # layers() seeds torch: on the meta device, in a forked RNG
    assert torch.equal(torch.rand(3), expected)


# ---- 7: remedies in the caller's terms --------------------------------------------------------------------
def test_settings_and_the_resume_call_are_named_as_the_caller_gives_them(tmp_path: Path) -> None:
    from pipeoffload.train.config import continue_with, setting, to_toml

    cli = TrainConfig.build()
    own = cli.updated(model="own")
    assert setting(cli, "skip_nonfinite", "N") == "--skip-nonfinite N" and setting(cli, "lr") == "--lr"
    assert setting(own, "skip_nonfinite", "N") == "skip_nonfinite=N" and setting(own, "lr") == "lr="
    for cfg, name in ((cli, "cli"), (own, "own")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(to_toml(cfg))
    assert continue_with(tmp_path / "cli") == f"pipeoffload train --resume {tmp_path / 'cli'}"
    assert continue_with(tmp_path / "own") == f"train_model(cfg, layers, loss_fn, batches, resume='{tmp_path / 'own'}')"
    assert continue_with(tmp_path / "nowhere").startswith("pipeoffload train --resume")


def test_an_interrupted_own_model_run_says_how_train_model_continues_it(tmp_path: Path) -> None:
    import signal

    from pipeoffload.train.config import to_toml
    from pipeoffload.train.launch import interrupted_text

    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)
    (tmp_path / "config.toml").write_text(to_toml(TrainConfig.build().updated(model="own")))
    text = interrupted_text(signal.SIGINT, str(tmp_path), started=True)
    assert text.endswith(f"continue with: train_model(cfg, layers, loss_fn, batches, resume='{tmp_path}')"), text
    assert "pipeoffload train" not in text
