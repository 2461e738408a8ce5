"""A Hugging Face folder trained on gloo ranks by `train --plan auto` held to one layout: the losses equal
transformers' step by step and each rank's measured activation peak is what its plan predicted (shared by the
families' multi-rank tests)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.dist.test_plan_auto_peak import _predicted
from tests.dist.test_train_llama import STEPS, _losses, reference_run
from tests.hf_fixtures import TEXT


def train_as_planned(tmp_path: Path, source: Path, nproc: int, pp: int, tp: int) -> tuple[Any, Any, Path]:
    """(config, transformers' model after the same steps, run folder) of a run whose losses equal transformers'
    within 1e-5 and whose ranks' peaks are planned at most 4 % above what they measure."""
    data = tmp_path / "data.txt"
    data.write_text(TEXT * 20)
    argv = ["--model", f"hf:{source}", "--data", str(data), "--plan", "auto", "--memory", "0.01", "--gpu", "a100",
            "--nproc", str(nproc), "--pp", str(pp), "--tp", str(tp), "--global-batch", "8", "--seq-len", "64",
            "--steps", str(STEPS), "--warmup", "2", "--lr", "3e-3", "--dtype", "fp32", "--out", str(tmp_path / "run"),
            "--eval-every", "100", "--no-progress"]
    cfg, predicted = _predicted(argv)
    assert (cfg.parallel.pp, cfg.parallel.tp, cfg.parallel.dp) == (pp, tp, nproc // (pp * tp))
    got = _losses(cfg)
    want, ref = reference_run(cfg, source)
    assert len(got) == STEPS and max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)
    run = Path(cfg.run.out)
    measured = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["peak_act_bytes"]
    for rank, peak in enumerate(measured):  # global ranks: pipeline rank 0's TP ranks, then rank 1's
        plan = predicted[rank // tp]
        assert peak <= plan <= 1.04 * peak, (rank, plan, peak)
    return cfg, ref, run
