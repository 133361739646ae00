"""checkpoint.async_save and the torch profiler through a real 2-rank run (Ray worker groups, FSDP2 on gloo)."""
from __future__ import annotations

import json
import os

import pytest

from test_ppo_e2e import gsm8k_parquet, ppo_config  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_async_save_and_profiler_on_two_ranks(tiny_model_dir, gsm8k_parquet, tmp_path):  # noqa: F811
    from rlhf_core.trainer.main_ppo import run_ppo

    out = tmp_path / "run"
    cfg = ppo_config(tiny_model_dir, gsm8k_parquet, str(out), "grpo",
                     "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2", "trainer.save_freq=1",
                     "trainer.test_freq=-1", "trainer.val_before_train=false",
                     "actor_rollout_ref.actor.checkpoint.async_save=true",
                     "global_profiler.tool=torch", "global_profiler.steps=[2]", f"global_profiler.save_path={out}/prof",
                     "actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.all_ranks=true")
    result = run_ppo(cfg)
    assert result["global_step"] == 2
    assert (out / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    for step in (1, 2):  # both async checkpoints complete, no .tmp left behind
        actor = out / f"global_step_{step}" / "actor"
        assert {"model", "optim", "huggingface"} <= set(os.listdir(actor))
        assert not (out / f"global_step_{step}" / "actor.tmp").exists()
    assert sorted(os.listdir(out / "prof")) == ["step_2"]
    assert sorted(os.listdir(out / "prof" / "step_2")) == ["actor_rank_0.json", "actor_rank_1.json"]
    events = json.loads((out / "prof" / "step_2" / "actor_rank_1.json").read_text())["traceEvents"]
    assert any(str(e.get("name", "")).startswith("aten::") for e in events)
