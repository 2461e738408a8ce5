"""Planner: cost model from model + hardware, Formula 1, and a search over layouts and schedules.

Pure Python (no torch). ``ModelSpec``/``HardwareSpec`` describe what is trained on what; ``layer_costs``
and ``stage_costs`` turn them into a per-stage ``CostModel``; ``find_plans`` simulates candidate plans.
"""
from pipeoffload.planner.compare_tp import Comparison, compare_tp
from pipeoffload.planner.estimate import Estimate, EstimateRequest, estimate
from pipeoffload.planner.evaluate import ScheduleChoice, simulate_choice
from pipeoffload.planner.formulas import formula1_k, offload_time
from pipeoffload.planner.hardware import (
    HARDWARE_PRESETS,
    NETWORK_PRESETS,
    HardwareSpec,
    hardware_preset,
    load_hardware,
)
from pipeoffload.planner.layertime import LayerTimes, layer_times
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.plans import InfeasibleError, Plan, PlanRequest, SearchResult
from pipeoffload.planner.presets import MODEL_PRESETS, model_preset
from pipeoffload.planner.search import find_plans
from pipeoffload.planner.stagecosts import LayerCosts, Layout, TrainingSetup, layer_costs, stage_costs

__all__ = [
    "Comparison", "Estimate", "EstimateRequest", "estimate", "LayerTimes", "NETWORK_PRESETS", "compare_tp", "layer_times",
    "HARDWARE_PRESETS", "HardwareSpec", "InfeasibleError", "LayerCosts", "Layout", "MODEL_PRESETS",
    "ModelSpec", "Plan", "PlanRequest", "ScheduleChoice", "SearchResult", "TrainingSetup", "formula1_k",
    "hardware_preset", "layer_costs", "load_hardware", "model_preset", "offload_time", "find_plans",
    "simulate_choice", "stage_costs",
]
