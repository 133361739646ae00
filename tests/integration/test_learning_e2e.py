"""Does the RL learn? A short version of ``make learn`` (issue 15), asserting a rise well beyond seed noise.

The task, model sizes, warm-up and GRPO settings are the ``countdown`` experiment's (``experiments/countdown.yaml``)
with fewer train problems, fewer held-out problems and a step budget instead of its wall-clock budget, so
the figure does not depend on the machine's load (:data:`SHORT`; about 6 minutes at one thread with another job
beside it). The warm-up SFT
sees only unsolvable prompts with non-solutions (format only): every rise comes from the reward. Accuracy is our
own validation, greedy, on :data:`N_TEST` held-out problems (``val-core/countdown/acc/mean@1``) before the first
step and after the last.

Seed noise, measured with exactly these settings by ``python tests/integration/test_learning_e2e.py SEED``
(BENCHMARKS.md "The CI learning test"), sets :data:`MIN_GAIN`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flows.experiment import Experiment, load_experiment
from rlhf_core.trainer.tracking import read_metrics_jsonl

pytestmark = pytest.mark.ray  # starts Ray: calls run_ppo

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "countdown.yaml"
N_TRAIN, N_TEST = 4000, 300
SHORT = {"sft_steps": 300, "grpo_steps": 25}
ACC = "val-core/countdown/acc/mean@1"
MIN_GAIN = 0.08  # seeds 0 and 1 gained +0.143 and +0.173; one accuracy on 300 problems has an SE of about 0.026


def _sft(exp: Experiment, model: str, files: dict, out: Path) -> str:
    from rlhf_core.config import load_config
    from rlhf_core.trainer.sft_trainer import run_sft

    cfg = load_config("sft_trainer", [
        *exp.sft.overrides, f"model.partial_pretrain={model}", f"data.train_files={files['train']}",
        f"data.val_files={files['test']}", f"trainer.total_training_steps={SHORT['sft_steps']}",
        "trainer.total_epochs=1", "trainer.logger=[console]", f"trainer.default_local_dir={out}",
        "trainer.project_name=learn", "trainer.experiment_name=sft"])
    return run_sft(cfg)["hf_model_dir"]


def _grpo(exp: Experiment, model: str, files: dict, out: Path, seed: int) -> dict[int, dict]:
    from rlhf_core.config import load_config
    from rlhf_core.trainer.main_ppo import run_ppo

    cfg = load_config("ppo_trainer", [
        *exp.ppo.overrides, f"actor_rollout_ref.model.path={model}", f"data.train_files={files['train']}",
        f"data.val_files={files['test']}", f"data.val_batch_size={N_TEST}", "algorithm.adv_estimator=grpo",
        f"data.seed={seed}", "trainer.total_training_seconds=null",
        f"trainer.total_training_steps={SHORT['grpo_steps']}", "trainer.val_before_train=True",
        f"trainer.test_freq={SHORT['grpo_steps']}", "trainer.save_freq=-1", "trainer.logger=[console,file]", "ray_init.num_cpus=1",
        f"trainer.default_local_dir={out}", f"trainer.validation_data_dir={out}/val",
        "trainer.project_name=learn", "trainer.experiment_name=grpo"])
    run_ppo(cfg)
    return read_metrics_jsonl(str(out / "metrics.jsonl"))


def learning_run(work: Path, seed: int) -> tuple[float, float, int]:
    """Data, tiny model, warm-up and GRPO under ``work``; returns ``(accuracy before, after, GRPO steps)``."""
    import torch

    from rlhf_core.data.countdown import generate_countdown
    from tasks.remote import build_model_remote

    exp = load_experiment(EXPERIMENT)
    assert exp.data.generator == "countdown"
    files = generate_countdown(str(work / "data"), N_TRAIN, N_TEST, seed=0, **exp.data.generator_args)
    model = build_model_remote(files["train"], str(work / "model"), dict(exp.model.tiny))  # the flow's build_model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the warm-up runs in this process: one thread, as `make test` has it
    try:
        warm = _sft(exp, model, files, work / "sft")
    finally:
        torch.set_num_threads(threads)
    metrics = _grpo(exp, warm, files, work / "grpo", seed)
    last = max(metrics)
    return metrics[0][ACC], metrics[last][ACC], last


@pytest.mark.slow
def test_grpo_raises_held_out_countdown_accuracy_beyond_seed_noise(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    before, after, steps = learning_run(tmp_path, seed=0)
    assert steps == SHORT["grpo_steps"]
    assert after - before >= MIN_GAIN, (before, after)


if __name__ == "__main__":  # the noise measurement: python tests/integration/test_learning_e2e.py SEED [WORKDIR]
    import json
    import tempfile

    seed = int(sys.argv[1])
    work = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="learn-ci-"))
    print(json.dumps(dict(zip(("before", "after", "steps"), learning_run(work, seed)), seed=seed, work=str(work))))
