"""The RL learns (issue 15): a short Countdown run whose greedy accuracy must rise far beyond seed noise.

The preset ``configs/presets/countdown.yaml`` end to end through the core (no Prefect): Countdown data (seed 0),
the tiny model built on its text, the warm-up SFT on format-only answers (never a solution), then GRPO with
``trainer.total_training_seconds`` as the only stop. The trainer validates greedily (``val_kwargs.do_sample=False,
n=1``) on the held-out problems before the first step and when the budget is spent; the test asserts the gain
of ``val-core/countdown/acc/mean@1``.

Noise, what was measured and what was not (write new measurements here):
* evaluation noise: a fixed model's accuracy on N = 500 problems has a binomial standard error
  sqrt(p (1 - p) / 500), at most 0.022; for a gain from about 0.1 to 0.2 the SE of the difference is about 0.02.
* the only 300-s run of this set-up (BENCHMARKS.md, run rA: +0.120) used the first warm-up data, which taught the
  model to avoid solutions; one TRL step alone moved that checkpoint's accuracy by +0.14, so rA says nothing about
  the margin. With the current warm-up data (unreachable targets) this test's gain has NOT been measured yet, nor
  has its seed-to-seed spread.
MIN_GAIN = 0.06 (three evaluation SEs) is therefore provisional: measure three seeds, write the figures here and
in BENCHMARKS.md, and set MIN_GAIN well below the smallest gain and far above the spread. The run takes
TRAIN_SECONDS of GRPO plus the 500-step warm-up (about 10 minutes on the loaded 2-core machine), not 2 minutes.
"""
from __future__ import annotations

import os

import pandas as pd
import pytest
import yaml

from rlhf_core.trainer.tracking import read_metrics_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESET = os.path.join(REPO, "configs", "presets", "countdown.yaml")
TRAIN_SECONDS = 300
METRIC = "val-core/countdown/acc/mean@1"
MIN_GAIN = 0.06  # provisional: three evaluation SEs; not yet checked against measured seeds (module doc)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_grpo_raises_countdown_accuracy(tmp_path, monkeypatch):
    from rlhf_core.config import load_config
    from rlhf_core.data.countdown import generate_countdown
    from rlhf_core.models.tiny import build_tiny_model
    from rlhf_core.trainer.main_ppo import run_ppo
    from rlhf_core.trainer.sft_trainer import run_sft

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    preset = yaml.safe_load(open(PRESET))
    files = generate_countdown(str(tmp_path / "data"), preset["pipeline"]["train_prompts"],
                               preset["pipeline"]["val_prompts"], seed=0)
    texts = [t for e in pd.read_parquet(files["train"])["extra_info"] for t in (e["question"], e["answer"])]
    model = build_tiny_model(texts, tmp_path / "model", **preset["model"])
    sft = run_sft(load_config("sft_trainer", [
        *preset["sft"], f"model.partial_pretrain={model}", f"data.train_files={files['train']}",
        f"data.val_files={files['test']}", f"trainer.default_local_dir={tmp_path / 'sft'}",
        "trainer.total_epochs=1", "trainer.logger=[console]"]))
    out = tmp_path / "ppo"
    result = run_ppo(load_config("ppo_trainer", [
        *preset["ppo"], f"actor_rollout_ref.model.path={sft['hf_model_dir']}", f"data.train_files={files['train']}",
        f"data.val_files={files['test']}", "algorithm.adv_estimator=grpo",
        f"trainer.total_training_seconds={TRAIN_SECONDS}",
        "trainer.total_training_steps=100000", "trainer.test_freq=100000", "trainer.save_freq=-1",
        "trainer.logger=[console,file]", f"trainer.default_local_dir={out}",
        "trainer.project_name=learn", "trainer.experiment_name=slow"]))
    metrics = read_metrics_jsonl(str(out / "metrics.jsonl"))
    last = result["global_step"]
    assert last >= 5, f"only {last} GRPO steps in {TRAIN_SECONDS} s"
    before, after = metrics[0][METRIC], metrics[last][METRIC]
    assert after - before >= MIN_GAIN, (before, after, last)
