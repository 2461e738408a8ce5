"""The package's public functions do not shadow its modules.

``pipeoffload.simulate`` and ``pipeoffload.validate`` are the functions; their modules are
``pipeoffload.simulator`` and ``pipeoffload.validation``. Were a function named like a submodule,
``import pipeoffload.<name> as m`` would bind the function (the package attribute wins).
"""
from __future__ import annotations

import importlib
import pkgutil
import types

import pipeoffload


def test_no_public_name_is_also_a_submodule() -> None:
    modules = {m.name for m in pkgutil.iter_modules(pipeoffload.__path__)}
    assert modules, "no submodules found"
    assert not modules & set(pipeoffload.__all__)


def test_functions_and_their_modules() -> None:
    import pipeoffload.simulator as simulator
    import pipeoffload.validation as validation

    assert isinstance(simulator, types.ModuleType) and isinstance(validation, types.ModuleType)
    assert pipeoffload.simulate is simulator.simulate and callable(pipeoffload.simulate)
    assert pipeoffload.validate is validation.validate and callable(pipeoffload.validate)
    for name in ("simulator", "validation", "semantics", "intervals"):
        assert isinstance(importlib.import_module(f"pipeoffload.{name}"), types.ModuleType)


def test_the_functions_work_from_the_package() -> None:
    schedule = pipeoffload.generate("1f1b", 2, 4)
    pipeoffload.validate(schedule)
    assert pipeoffload.simulate(schedule, pipeoffload.CostModel()).makespan > 0
