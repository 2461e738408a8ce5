"""The torch.distributed runtime: stages, activation store, transport, and the interpreter.

This package (with ``pipeoffload.models``) is the only part of pipeoffload that imports torch.
"""
from pipeoffload.runtime.comm import LoopbackTransport, ProcessGroupTransport, Transport
from pipeoffload.runtime.copier import Copier, CudaCopier, SyncCopier
from pipeoffload.runtime.executor import PipelineError, PipelineRunner
from pipeoffload.runtime.offload import ActivationStore
from pipeoffload.runtime.spec import Const, Spec, TensorSpec, spec_of, split_microbatches
from pipeoffload.runtime.stage import PipelineStage
from pipeoffload.runtime.trace import Trace, TraceRecord, compare_with_simulation, simulated_peaks, write_chrome_trace

__all__ = [
    "ActivationStore", "Const", "Copier", "CudaCopier", "LoopbackTransport", "PipelineError", "PipelineRunner",
    "PipelineStage", "ProcessGroupTransport", "Spec", "SyncCopier", "TensorSpec", "Trace", "TraceRecord", "Transport", "compare_with_simulation", "simulated_peaks", "spec_of",
    "split_microbatches", "write_chrome_trace",
]
