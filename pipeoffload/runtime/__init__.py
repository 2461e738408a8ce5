"""The torch.distributed runtime: stages, activation store, transport, and the interpreter.

This package (with ``pipeoffload.models``) is the only part of pipeoffload that imports torch.
"""
from typing import TYPE_CHECKING

from pipeoffload._lazy import lazy_names

if TYPE_CHECKING:  # for type checkers; at run time ``__getattr__`` below loads them
    from pipeoffload.runtime.comm import LoopbackTransport, ProcessGroupTransport, Transport
    from pipeoffload.runtime.copier import Copier, CudaCopier, SyncCopier
    from pipeoffload.runtime.executor import PipelineError, PipelineRunner
    from pipeoffload.runtime.offload import ActivationStore
    from pipeoffload.runtime.spec import Const, Spec, TensorSpec, spec_of, split_microbatches
    from pipeoffload.runtime.stage import PipelineStage
    from pipeoffload.runtime.trace import (
        Trace,
        TraceRecord,
        compare_with_simulation,
        simulated_peaks,
        write_chrome_trace,
    )

# Every name loads on first use, from its module: importing the package imports no torch, so
# ``python -m pipeoffload.runtime`` (whose package runpy imports before ``__main__``) can say in one line
# that torch is missing instead of a traceback.
_HOMES = {
    "LoopbackTransport": "comm", "ProcessGroupTransport": "comm", "Transport": "comm", "Copier": "copier",
    "CudaCopier": "copier", "SyncCopier": "copier", "PipelineError": "executor", "PipelineRunner": "executor",
    "ActivationStore": "offload", "Const": "spec", "Spec": "spec", "TensorSpec": "spec", "spec_of": "spec",
    "split_microbatches": "spec", "PipelineStage": "stage", "Trace": "trace", "TraceRecord": "trace",
    "compare_with_simulation": "trace", "simulated_peaks": "trace", "write_chrome_trace": "trace",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

# The launchers' waits once a spawned rank has failed (``launch.spawn``'s ``grace`` and ``settle``), shared by
# `pipeoffload train` and ``python -m pipeoffload.runtime --spawn`` (here, torch-free: train's module reads them
# before torch is imported). GRACE: seconds the other ranks get to exit (naming the failure themselves) once
# one has lost a peer, so that the rank it lost is seen to. SETTLE: seconds they get once one has failed by its
# own error or died: the run's message is that rank's, and a rank blocked in start-up (a store wait in joining
# the group or building the mesh, a collective of the data's loading) cannot see it, so it waited out GRACE.
GRACE = 5.0
SETTLE = 1.0


__all__ = [
    "ActivationStore", "Const", "Copier", "CudaCopier", "LoopbackTransport", "PipelineError", "PipelineRunner",
    "PipelineStage", "ProcessGroupTransport", "Spec", "SyncCopier", "TensorSpec", "Trace", "TraceRecord", "Transport", "compare_with_simulation", "simulated_peaks", "spec_of",
    "split_microbatches", "write_chrome_trace",
]
