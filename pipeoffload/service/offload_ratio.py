"""The offload ratio k = (D2H + H2D time of one layer's activations) / (F + I + W time of that layer),
from the paper's Formula 1 and from the cost model (``pipeoffload k``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.planner.formulas import formula1_k, offload_time
from pipeoffload.planner.hardware import HardwareSpec, check_hardware
from pipeoffload.planner.model import ModelSpec, check_model
from pipeoffload.planner.stagecosts import layer_copy_and_compute, layer_costs
from pipeoffload.service.checks import boolean, check_finite, checked, int_at_least


@dataclass(frozen=True)
class OffloadRatioRequest:
    """The offload ratio k of one layer of ``model`` on ``hardware`` (``pipeoffload k``): ``run`` gives an
    ``OffloadRatioResult`` with the paper's Formula 1 and the cost model's k (copy over compute time)."""

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1  # tensor-parallel size for the cost-model k
    partial_recompute: bool = True  # LGD partial recomputation: ~20 instead of 34 sbh saved per layer
    shared_host_link: bool = False  # with tp > 1 the TP peer copies at the same time over one PCIe switch

    def __post_init__(self) -> None:
        check_model(self.model)
        check_hardware(self.hardware)
        object.__setattr__(self, "tp", checked("tp", int_at_least, self.tp))  # text such as "2" is kept as 2
        for name in ("partial_recompute", "shared_host_link"):
            checked(name, boolean, getattr(self, name))
        m, tp, per_node = self.model, self.tp, self.hardware.gpus_per_node
        if m.heads % tp or m.num_kv_heads % tp or m.ffn_size % tp:
            raise ConfigError.named(lambda n: f"{n.given('tp', tp)}: must divide the model's heads ({m.heads}), KV "
                                    f"heads ({m.num_kv_heads}) and FFN width ({m.ffn_size}); use "
                                    f"{n.given('tp', m.tp_sizes(per_node))}")
        if tp > per_node:  # as estimate and plan refuse it
            raise ConfigError.named(lambda n: f"{n.given('tp', tp)} is above the {per_node} GPUs per node (tensor "
                                    f"parallelism stays inside a node); use a smaller {n('tp')}")


@dataclass(frozen=True)
class OffloadRatioResult:
    """What ``run(OffloadRatioRequest(...))`` gives: the paper's Formula 1 k and the cost model's k of one
    layer, with the times and saved bytes the latter comes from; ``as_dict`` is ``k --json``'s object."""

    request: OffloadRatioRequest
    formula1_k: float  # the paper's Formula 1: 10 B_c / (3 (6h + s) B_o)
    cost_model_k: float  # the cost model's copy time / compute time of one layer and microbatch
    layer_compute_s: float  # F + I + W of one layer and microbatch
    layer_copy_s: float  # D2H + H2D of its saved activations
    saved_bytes_per_sbh: float  # saved activation bytes per layer in units of s*b*h

    @property
    def offload_time(self) -> float:
        return offload_time(self.formula1_k)

    def as_dict(self) -> dict[str, Any]:
        """The object ``k --json`` prints."""
        model, hw = self.request.model, self.request.hardware
        return {
            "model": model.name, "formula1_k": self.formula1_k, "offload_time": self.offload_time,
            "cost_model_k": self.cost_model_k, "hidden": model.hidden, "seq": model.seq, "B_c_flops": hw.flops, "B_o_bytes_per_s": hw.offload_bandwidth,
            "saved_bytes_per_sbh": self.saved_bytes_per_sbh, "layer_compute_s": self.layer_compute_s,
            "layer_copy_s": self.layer_copy_s, "tp": self.request.tp,
            "gpu": hw.name, "sources": {k: hw.sources.get(k, "") for k in ("achievable_fraction", "d2h_bandwidth")},
        }


def offload_ratio(req: OffloadRatioRequest) -> OffloadRatioResult:
    model, hw = req.model, req.hardware
    lc = layer_costs(model, hw, req.tp, partial_recompute=req.partial_recompute)
    share = 2.0 if req.shared_host_link and hw.shares_pcie_switch and req.tp > 1 else 1.0
    copy, compute = layer_copy_and_compute(lc, hw, share)
    result = OffloadRatioResult(
        req, formula1_k=formula1_k(model.hidden, model.seq, hw.flops, hw.offload_bandwidth),
        cost_model_k=copy / compute, layer_compute_s=compute, layer_copy_s=copy,
        saved_bytes_per_sbh=lc.activation_bytes * req.tp / (model.tokens * model.hidden))
    check_finite(result.as_dict(), "k")
    return result
