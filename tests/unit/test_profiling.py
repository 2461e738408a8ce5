"""The torch profiler: saved-activation bytes by hand, stage profiles, cost models, and plan --profile."""
import json
import time

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pipeoffload.cli import main  # noqa: E402
from pipeoffload.planner.measured import load_layer_costs, save_layer_costs  # noqa: E402
from pipeoffload.profiling import measure_layer_costs, profile_stages, saved_activation_bytes  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402
from pipeoffload.simulator import simulate  # noqa: E402


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def test_saved_bytes_exclude_parameters_and_count_shared_storage_once() -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 64, requires_grad=True)
    mlp = _mlp()
    # Linear1 saves its input x; ReLU saves its output, which Linear2 saves too (one storage)
    assert saved_activation_bytes(mlp, lambda: mlp(x)) == 32 * 64 * 4 + 32 * 128 * 4
    square = nn.Identity()
    assert saved_activation_bytes(square, lambda: x * x) == 32 * 64 * 4  # x saved twice, counted once


class _Block(nn.Module):
    """A small pre-norm transformer block (causal self-attention + GeLU MLP)."""

    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class _Head(nn.Module):
    def __init__(self, hidden: int = 64, vocab: int = 100) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def _ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def test_profile_stages_of_a_small_gpt_and_simulate_its_cost_model() -> None:
    torch.manual_seed(0)
    embed = nn.Embedding(100, 64)
    stages = [nn.Sequential(embed, _Block()), nn.Sequential(_Block(), _Head())]
    tokens = torch.randint(0, 100, (2, 16))
    profile = profile_stages(stages, tokens, loss_fn=_ce, target=tokens, warmup=1, repeats=3)
    first, last = profile.stages
    assert first.time_i == 0.0 and first.time_w == first.time_b > 0  # token input: no input gradient
    # I and W are timed on their own (the split's real cost), B too: I + W need not equal B
    assert last.time_f > 0 and last.time_b > 0 and last.time_i > 0 and last.time_w > 0
    assert first.output_bytes == 2 * 16 * 64 * 4 and last.output_bytes == 0
    assert first.params == sum(p.numel() for p in stages[0].parameters())
    # every block saves at least its input and its MLP hidden activations
    assert first.activation_bytes >= 2 * 16 * (64 + 4 * 64) * 4
    costs = profile.cost_model(p2p_bandwidth=1e9, d2h_bandwidth=1e10, h2d_bandwidth=1e10)
    assert costs.activation_bytes == max(first.activation_bytes, last.activation_bytes)
    assert costs.p2p_time == pytest.approx(first.output_bytes / 1e9)
    timeline = simulate(generate("1f1b", 2, 4), costs)
    assert timeline.makespan >= 4 * sum(costs.f(s) + costs.b(s) for s in range(2)) / 2


def test_i_and_w_are_timed_as_the_runtime_splits_the_backward_and_the_overhead_reaches_the_model(monkeypatch) -> None:
    """The profiler times W by running the runtime's own W (``runtime.backward.backward_weight``),
    not as B - I; the per-action overhead it is given is in every compute action of the model."""
    from pipeoffload.runtime import backward as bw

    calls = []
    real = bw.backward_weight
    monkeypatch.setattr(bw, "backward_weight", lambda job: calls.append(job) or real(job))
    torch.manual_seed(0)
    tokens = torch.randint(0, 100, (2, 16))
    stages = [nn.Sequential(nn.Embedding(100, 64), _Block()), nn.Sequential(_Block(), _Head())]
    profile = profile_stages(stages, tokens, loss_fn=_ce, target=tokens, warmup=0, repeats=2)
    assert len(calls) == 2  # the last stage's W, timed twice (the first stage has no I: its W is B)
    bare, costs = profile.cost_model(), profile.cost_model(action_overhead=0.25)
    for s in range(2):
        assert [f(s) for f in (costs.f, costs.i, costs.w, costs.b)] == pytest.approx(
            [f(s) + 0.25 for f in (bare.f, bare.i, bare.w, bare.b)])


def test_profile_measures_what_w_keeps_per_stage_and_saves_a_cost_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Embedding(100, 64), _Block()), nn.Sequential(_Block(), _Block(), _Head())]
    tokens = torch.randint(0, 100, (2, 16))
    profile = profile_stages(stages, tokens, loss_fn=_ce, target=tokens, warmup=1, repeats=1)
    first, last = profile.stages
    assert first.w_fraction == 1.0  # token ids need no gradient: W is a full backward
    assert 0.2 < last.w_fraction < 0.9  # W needs the linear layers' inputs, not every saved tensor
    costs = profile.cost_model(w_fraction="measured")
    assert costs.stage_w_fraction == (1.0, last.w_fraction) and costs.w_fraction == 1.0
    path = tmp_path / "costs.json"
    profile.save(str(path))
    assert json.loads(path.read_text())["time_unit"] == "s"
    assert main(["simulate", "zb-h1", "-d", "2", "-m", "4", "--costs", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["makespan"] > 0 and data["units"]["time_unit"] == "s"  # measured seconds, labelled so


def test_measured_layer_costs_round_trip_and_drive_plan(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    hidden = torch.randn(2, 16, 64)
    target = torch.randint(0, 100, (2, 16))
    lc = measure_layer_costs(_Block(), _Head(), hidden, loss_fn=_ce, target=target,
                             embedding=nn.Embedding(100, 64), warmup=1, repeats=3)
    assert lc.params == sum(p.numel() for p in _Block().parameters())
    assert lc.embedding_params == 6400 and lc.boundary_bytes == 2 * 16 * 64 * 4
    path = tmp_path / "layer.json"
    save_layer_costs(lc, path)
    assert load_layer_costs(path) == lc
    code = main(["plan", "--hidden", "64", "--heads", "4", "--seq", "16", "--layers", "8", "--vocab", "100",
                 "--microbatch-size", "2", "--gpus", "4", "--global-batch", "16", "--memory", "1",
                 "--profile", str(path), "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert all(p["layout"]["tp"] == 1 for p in data["best"])  # measured at TP 1 only


class _Mixed(nn.Module):
    """Takes and returns (hidden, bool mask, int offset), like the runtime's reference GPT layers."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, offset: int) -> tuple:
        return torch.relu(self.lin(x)) * mask[..., None] + offset, mask, offset


def test_stages_with_mixed_tuple_inputs() -> None:
    torch.manual_seed(0)
    x, mask = torch.randn(4, 8, 64), torch.ones(4, 8, dtype=torch.bool)
    head = nn.Sequential()  # identity head on the last stage's first output

    class _Last(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _Mixed()

        def forward(self, x: torch.Tensor, mask: torch.Tensor, offset: int) -> torch.Tensor:
            return head(self.inner(x, mask, offset)[0])

    profile = profile_stages([_Mixed(), _Last()], (x, mask, 1), loss_fn=_mse, target=torch.zeros(4, 8, 64),
                             warmup=1, repeats=2)
    first, last = profile.stages
    assert first.output_bytes == 4 * 8 * 64 * 4  # only the float tensor crosses as activation bytes
    assert first.time_b > 0 and last.time_b > 0
    assert first.activation_bytes >= 4 * 8 * 64 * 4  # at least the Linear input


def test_replayed_action_times_cover_every_compute_action_and_replace_the_profiled_ones() -> None:
    from pipeoffload.costs import CostModel
    from pipeoffload.ir import ActionKind as K
    from pipeoffload.profiling import replayed_action_times, with_action_times
    from pipeoffload.runtime import PipelineRunner

    torch.manual_seed(0)
    schedule = generate("group-interleaved", 1, 4, 2)  # one rank, two stages, split backward
    runner = PipelineRunner([nn.Linear(8, 8), nn.Linear(8, 8)], schedule, 0, measure_memory=False,
                            loss_fn=lambda out, t: ((out - t) ** 2).mean())
    times = replayed_action_times([runner], torch.randn(4, 8), torch.randn(4, 8), steps=2, warmup=1)
    assert set(times) == {(k, s) for k in (K.F, K.I, K.W) for s in (0, 1)}
    assert all(t > 0 for t in times.values())
    assert all(p.grad is None for stage in runner.stages.values() for p in stage.module.parameters())
    base = CostModel(time_f=(1.0, 2.0), time_i=(3.0, 4.0), time_w=(5.0, 6.0), action_overhead=0.5)
    costs = with_action_times(base, {(K.F, 0): 0.25, (K.W, 1): 0.75})
    assert (costs.f(0), costs.f(1), costs.i(0), costs.w(1), costs.w(0)) == (0.25, 2.5, 3.5, 0.75, 5.5)
    assert costs.action_overhead == 0.0


class _Ticking(nn.Module):
    """A Linear whose forward advances ``ticks`` by ``forward`` and whose backward by ``backward``: a
    clock that moves only while this stage computes."""

    def __init__(self, ticks: list[float], forward: float, backward: float) -> None:
        super().__init__()
        self.linear, self.ticks, self.costs = nn.Linear(8, 8), ticks, (forward, backward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ticks, (forward, backward) = self.ticks, self.costs

        class Tick(torch.autograd.Function):
            @staticmethod
            def forward(ctx: object, y: torch.Tensor) -> torch.Tensor:
                return y.view_as(y)

            @staticmethod
            def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
                ticks[0] += backward
                return grad

        ticks[0] += forward
        return Tick.apply(self.linear(x))


def test_replayed_action_times_read_each_action_on_the_clock_given() -> None:
    from pipeoffload.ir import ActionKind as K
    from pipeoffload.profiling import replayed_action_times
    from pipeoffload.runtime import PipelineRunner

    torch.manual_seed(0)
    ticks = [0.0]
    runner = PipelineRunner([_Ticking(ticks, 2.0, 5.0), _Ticking(ticks, 3.0, 7.0)], generate("interleaved-1f1b", 1, 4, 2),
                            0, measure_memory=False, loss_fn=_mse)
    handlers = dict(runner._handlers)
    times = replayed_action_times([runner], torch.randn(4, 8), torch.randn(4, 8), steps=2, warmup=1,
                                  clock=lambda: ticks[0])
    assert times == {(K.F, 0): 2.0, (K.F, 1): 3.0, (K.B, 0): 5.0, (K.B, 1): 7.0}
    assert runner._handlers == handlers  # the runner is left as it was
    walls = replayed_action_times([runner], torch.randn(4, 8), torch.randn(4, 8), steps=1, warmup=0)
    assert set(walls) == set(times) and all(0 < t < 1 for t in walls.values())  # the trace's seconds
    cpu = replayed_action_times([runner], torch.randn(4, 8), torch.randn(4, 8), steps=1, warmup=0, clock=time.thread_time)
    assert set(cpu) == set(times) and all(0 < t < 1 for t in cpu.values())


def test_concurrent_action_times_call_the_barrier_before_every_step_and_keep_every_sample() -> None:
    from pipeoffload.ir import ActionKind as K
    from pipeoffload.profiling import concurrent_action_times
    from pipeoffload.runtime import PipelineRunner

    torch.manual_seed(0)
    runner = PipelineRunner([nn.Linear(8, 8), nn.Linear(8, 8)], generate("interleaved-1f1b", 1, 4, 2), 0,
                            measure_memory=False, loss_fn=lambda out, t: ((out - t) ** 2).mean())
    calls = []
    times = concurrent_action_times(runner, torch.randn(4, 8), torch.randn(4, 8), barrier=lambda: calls.append(1),
                                    steps=3, warmup=1)
    assert len(calls) == 4  # warm-up included: every replayed step starts together
    assert set(times) == {(k, s) for k in (K.F, K.B) for s in (0, 1)}
    assert all(len(v) == 3 * 4 for v in times.values())  # 3 steps x 4 microbatches, warm-up left out
    assert all(p.grad is None for stage in runner.stages.values() for p in stage.module.parameters())


def test_profile_reads_the_clock_it_is_given() -> None:
    ticks = iter(range(10_000))
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Embedding(100, 64), _Block()), nn.Sequential(_Block(), _Head())]
    tokens = torch.randint(0, 100, (2, 16))
    profile = profile_stages(stages, tokens, loss_fn=_ce, target=tokens, warmup=0, repeats=1,
                             clock=lambda: float(next(ticks)))
    assert all(s.time_f == 1.0 and s.time_b == 1.0 for s in profile.stages)  # one tick per timed call
