"""Nested containers (dicts, lists) cross stage boundaries: their tensors are sent and get gradients.
And the ranks run under torch's elastic agent."""
from __future__ import annotations

import pytest
from runtime_workers import container_worker

from pipeoffload.runtime.launch import spawn

pytestmark = pytest.mark.dist


def test_dict_and_list_between_ranks_train_like_one_process():
    result = spawn(container_worker, 2, (), timeout=60, deadline=240)
    assert result.ok, result.errors
    last = result.results[1]
    assert last["loss_diff"] and max(last["loss_diff"]) < 1e-6, last
    for r in range(2):
        assert max(result.results[r]["grad_diff"]) < 1e-6, (r, result.results[r])
        # spawn is torch's elastic agent (no restarts); what a rank returns comes back, tensors included
        launcher = result.results[r]["launcher"]
        assert launcher["TORCHELASTIC_RUN_ID"] and launcher["TORCHELASTIC_MAX_RESTARTS"] == "0", launcher
        assert result.results[r]["tensor"].tolist() == [float(r)] * 2
