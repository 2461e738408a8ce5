"""The launcher's agent options follow the installed torch's ``LocalElasticAgent`` signature."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from pipeoffload.runtime.launch import agent_options  # noqa: E402


class _Older:  # torch 2.11's agent: no shutdown_timeout
    def __init__(self, spec: object, logs_specs: object, start_method: str = "spawn", exit_barrier_timeout: float = 300) -> None:
        pass


class _Newer(_Older):
    def __init__(self, spec: object, logs_specs: object, start_method: str = "spawn", exit_barrier_timeout: float = 300,
                 shutdown_timeout: float = 30) -> None:
        pass


def test_shutdown_timeout_is_passed_only_where_the_agent_takes_it() -> None:
    assert agent_options(_Newer) == {"shutdown_timeout": 0}
    assert agent_options(_Older) == {}
    _Older(None, None, **agent_options(_Older))  # what failed with a TypeError on torch 2.11
