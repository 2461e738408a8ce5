"""bf16 autocast's weight-cast cache in the plan's per-rank memory (train's blocks).

``train_step`` runs the whole pipeline of a step inside one ``torch.autocast`` region: autocast casts
every linear's weight and bias to bf16 at its first use and keeps that cast in its cache, reused by every
later microbatch, until the region ends. Those bytes are neither parameters nor activations (the store
excludes them). What this proves on CPU: which parameters autocast casts (read off the ``_to_copy`` calls
under a dispatch mode, so the bias casts, which no backward saves, are counted too), that a second
microbatch in the same region casts none again (the cache holds them), and that the planner's
``layer_cast_cache_bytes``/``head_cast_cache_bytes`` are those casts' bytes exactly. Not proved here: the
allocator's bytes (CPU has no peak counter) and tp > 1 (row-parallel biases whole is read off
``models.tensor_parallel``)."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeoffload.llama_config import LlamaShape
from pipeoffload.models.gpt import GPTConfig, gpt_layers
from pipeoffload.models.llama import llama_layers
from pipeoffload.planner.emit import train_blocks, train_setup
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.planner.search import find_plans
from pipeoffload.planner.stagecosts import Layout, layer_costs, stage_costs


class _ParameterCasts(TorchDispatchMode):
    """Records every ``_to_copy`` of a parameter (by storage) and the bytes of its result."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__()
        self.storages = {p.untyped_storage().data_ptr() for p in params}
        self.casts: list[int] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and args[0].untyped_storage().data_ptr() in self.storages:
            self.casts.append(out.nbytes)
        return out


def _casts_per_microbatch(layers: list[torch.nn.Module], vocab: int, seq: int, microbatches: int) -> list[int]:
    """Bytes of the parameter casts each microbatch's forward and backward makes, all in one autocast
    region (as ``train_step`` runs a step)."""
    stage = torch.nn.ModuleList(layers).train()
    mode = _ParameterCasts(list(stage.parameters()))
    made = []
    with torch.autocast("cpu", dtype=torch.bfloat16), mode:
        for _ in range(microbatches):
            before = len(mode.casts)
            values: Any = (torch.randint(0, vocab, (2, seq)), None, 0)
            for layer in layers[:-1]:
                values = layer(*values)
            layers[-1](*values).float().sum().backward()
            made.append(sum(mode.casts[before:]))
    return made


def _planned(spec: ModelSpec) -> float:
    return spec.layers * spec.layer_cast_cache_bytes() + spec.head_cast_cache_bytes()


@pytest.mark.parametrize(("hidden", "heads", "vocab", "seq", "layers"), [(32, 4, 96, 16, 2), (48, 3, 64, 8, 3)])
def test_gpt_casts_are_cached_once_per_step_and_planned(hidden: int, heads: int, vocab: int, seq: int,
                                                        layers: int) -> None:
    made = _casts_per_microbatch(gpt_layers(GPTConfig(vocab=vocab, seq=seq, hidden=hidden, heads=heads,
                                                      layers=layers)), vocab, seq, 3)
    spec = train_blocks(ModelSpec(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab), 2)
    assert made[1:] == [0, 0]  # the later microbatches reuse the first one's casts: held for the step
    assert made[0] == _planned(spec) > 0


@pytest.mark.parametrize(("kv", "ffn", "head_dim", "qkv_bias", "tie", "extra"),
                         [(4, 96, 0, False, False, {}), (2, 160, 0, False, True, {}), (2, 96, 8, True, False, {}),
                          # Llama's attention_bias and mlp_bias; Qwen3 (its q/k norms are not cast) with o_proj's
                          (2, 96, 0, True, False, {"o_bias": True, "mlp_bias": True}),
                          (2, 96, 32, True, True, {"o_bias": True, "architecture": "Qwen3ForCausalLM"}),
                          (1, 96, 0, False, False, {"architecture": "Phi3ForCausalLM"})])  # split q/k/v, gate/up
def test_llama_casts_are_cached_once_per_step_and_planned(kv: int, ffn: int, head_dim: int, qkv_bias: bool,
                                                          tie: bool, extra: dict) -> None:
    shape = LlamaShape(vocab=100, hidden=64, layers=2, heads=4, kv_heads=kv, ffn_hidden=ffn, head_dim=head_dim,
                       qkv_bias=qkv_bias, tie_embeddings=tie, max_positions=16, **extra)
    made = _casts_per_microbatch(llama_layers(shape, tie=False), 100, 16, 2)
    assert made[1] == 0
    assert made[0] == _planned(train_blocks(shape.model_spec("llama", 16), 2)) > 0


def test_fp32_and_paper_models_plan_no_cache() -> None:
    spec = ModelSpec(layers=2, hidden=64, heads=4, seq=32)
    assert spec.layer_cast_cache_bytes() == spec.head_cast_cache_bytes() == 0  # Megatron's layer
    assert train_blocks(spec, 4).layer_cast_cache_bytes() == 0  # train in fp32: no autocast


def test_stage_costs_put_the_cache_on_the_ranks_holding_the_stages() -> None:
    spec = train_blocks(ModelSpec(layers=4, hidden=64, heads=4, seq=32, vocab=500), 2)
    hw = hardware_preset("a100")
    sc = stage_costs(layer_costs(spec, hw), hw, Layout(pp=2, tp=1, dp=1), 1, 4, split=(1, 3))
    layer = 2 * (12 * 64 * 64 + 9 * 64)  # qkv, proj, fc1, fc2 weights and biases in bf16
    assert sc.cast_cache_per_rank == (layer, 3 * layer + 2 * (500 * 64 + 500))
    fp32 = stage_costs(layer_costs(train_blocks(spec, 4), hw), hw, Layout(pp=2, tp=1, dp=1), 1, 4, split=(1, 3))
    assert fp32.cast_cache_per_rank == ()


def test_a_bf16_train_plan_counts_the_cache_in_its_parameter_memory() -> None:
    """One rank, one schedule: the bf16 plan's parameter memory is the fp32 plan's (train keeps fp32
    weights and gradients either way) plus the cast cache."""
    base = ModelSpec(layers=4, hidden=64, heads=4, seq=32, vocab=500)

    def parameters(dtype_bytes: int) -> float:
        req = PlanRequest(model=train_blocks(base, dtype_bytes), hardware=hardware_preset("a100"), gpus=1,
                          global_batch=4, memory_budget=40 * GIB, setup=train_setup(), schedules=("1f1b",),
                          offload=("none",), recompute=("none",), top=1)
        return find_plans(req).best(1)[0].memory.parameters

    cache = 4 * 2 * (12 * 64 * 64 + 9 * 64) + 2 * (500 * 64 + 500)
    assert parameters(2) - parameters(4) == cache


def test_the_first_stage_plans_its_token_ids_as_w_s() -> None:
    """The embedding's saved ids (``trainblocks.embedding_bytes``) join the first stage's activations and
    what its W needs; the paper models' first stage is unchanged."""
    hw, layout = hardware_preset("a100"), Layout(pp=2, tp=1, dp=1)
    spec = train_blocks(ModelSpec(layers=4, hidden=64, heads=4, seq=32, vocab=500, microbatch=2), 4)
    lc = layer_costs(spec, hw)
    sc = stage_costs(lc, hw, layout, 1, 4, split=(2, 2))
    ids = 8 * 64 + 8 * 32  # the token ids of 2 x 32 tokens, GPT's positions' index
    assert sc.costs.activation[0] * sc.unit_bytes == pytest.approx(2 * lc.activation_bytes + ids, rel=1e-12)
    w_first = (2 * lc.w_bytes + ids) / (2 * lc.activation_bytes + ids)  # type: ignore[operator]
    assert sc.costs.stage_w_fraction[0] == pytest.approx(w_first, rel=1e-12)
    paper = layer_costs(ModelSpec(layers=4, hidden=64, heads=4, seq=32, vocab=500), hw)
    assert paper.embedding_activation_bytes == 0.0
