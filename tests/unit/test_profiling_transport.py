"""``measure_message_costs``'s transport CPU (``message_cpu``): what the ranks' other threads spend per message."""
import pytest


def test_the_transport_threads_cpu_per_message_is_measured():
    pytest.importorskip("torch")
    from pipeoffload.profiling import measure_message_costs, synthetic_run

    run = synthetic_run(4 * 128 * 64, ranks=2, microbatches=4, depth=1, steps=3, warmup=1)
    assert 0 < run.transport_cpu < 0.05  # gloo's I/O thread copies and waits on every message
    costs = measure_message_costs(4 * 128 * 64, ranks=2, microbatches=4, depth=1, steps=3, warmup=1)
    assert 0 < costs.message_cpu < 0.05
