"""The real worker with rollout.mode=async: the agent-loop rollout's log-probs equal the actor's recomputed
log-probs on every assistant token (same layout, positions and masks as the training forward)."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf

from rlhf_core.distributed import LocalWorkerGroup
from rlhf_core.protocol import Batch
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker
from rlhf_core.workers.rollout.agent_rollout import AgentRollout
from tests.rlhf_core.agent.test_agent_rollout import TOOL_YAML
from tests.rlhf_core.workers.test_workers_fsdp import ppo_config


def test_async_worker_rollout_log_probs_match_actor(tmp_path, tiny_model_dir, tiny_tokenizer):
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOL_YAML)
    cfg = ppo_config(tiny_model_dir, "actor_rollout_ref.rollout.calculate_log_probs=True", "data.max_response_length=12")
    # set after validation: the schema still lists rollout.mode as sync-only until the lead flips its status
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.mode", "async")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.multi_turn.tool_config_path", str(tools))
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.default_agent_loop", "tool_agent")
    wg = LocalWorkerGroup(ActorRolloutRefWorker, {"config": cfg, "role": "actor_rollout"})
    wg.execute_all("init_model")
    assert isinstance(wg.worker.rollout, AgentRollout) and wg.worker.rollout.schedule == "continuous"
    rows = {"raw_prompt": [[{"role": "user", "content": f"Natalia sold {k} clips."}] for k in range(4)],
            "raw_prompt_ids": [[1]] * 4,
            "extra_info": [{"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1"}}}}] * 4}
    batch = Batch({"input_ids": torch.zeros((4, 8), dtype=torch.long)}, rows, {"validate": False})
    out = wg.execute_dp("generate_sequences", batch)
    assert out["responses"].shape == (4, 12) and "num_turns" in out.non_tensors
    recomputed = wg.execute_dp("compute_log_prob", out)["old_log_probs"]
    mask = out["response_mask"].bool()
    assert mask.any()
    assert torch.allclose(recomputed[mask], out["rollout_log_probs"][mask], atol=1e-4)
