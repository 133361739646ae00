"""The PPO driver's scoring helpers: reward-model scores before the reward manager, and ReMax's greedy baseline.

* :func:`add_rm_scores` — ``reward_model.enable``: the reward-model group's ``rm_scores (B, T)`` (score on the
  last valid response token) are merged into the batch *before* the reward manager, which then returns them
  unchanged (``rlhf_core.reward.managers``; verl's ``_compute_reward`` order).
* :func:`add_reward_baselines` — ``adv_estimator: remax`` (Li et al. 2023, arXiv:2310.10505, Alg. 1): once per
  prompt, a greedy response (``do_sample=False``) is generated and scored exactly like the sampled ones (reward
  model, then reward manager); its summed score is ``reward_baselines (B,)`` of every sample of that prompt.
  (verl scores the greedy response with the reward manager only, so with a reward model enabled its baseline is
  the rule score while the rewards are the RM's; here both come from the same scorer.)
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from rlhf_core.protocol import Batch
from rlhf_core.trainer.driver_utils import ensure_response_mask, pad_to_divisor, unpad


def add_rm_scores(batch: Batch, rm_wg: Any | None) -> Batch:
    """``batch`` plus ``rm_scores (B, T)`` float32 from ``rm_wg.compute_rm_score`` (rows padded to a multiple of
    the group's world size for the dp dispatch, then unpadded). Unchanged when ``rm_wg`` is None or the batch
    already holds ``rm_scores``."""
    if rm_wg is None or "rm_scores" in batch:
        return batch
    padded, pad = pad_to_divisor(batch, rm_wg.world_size)
    return batch.merge(unpad(rm_wg.execute_dp("compute_rm_score", padded), pad), "reward model compute_rm_score")


def score_batch(batch: Batch, reward_fn: Callable, rm_wg: Any | None = None) -> tuple[Batch, dict]:
    """(batch with ``rm_scores`` when a reward model runs, ``reward_fn(batch, return_dict=True)``)."""
    batch = add_rm_scores(batch, rm_wg)
    return batch, reward_fn(batch, return_dict=True)


def add_reward_baselines(prompts: Batch, batch: Batch, actor_wg: Any, reward_fn: Callable, rm_wg: Any | None,
                         global_steps: int) -> Batch:
    """[gen_max] ``batch`` plus ``reward_baselines (B,)`` float32: the summed score of one greedy response per
    prompt, looked up by ``uid`` (so any row order of ``batch`` works).

    Args:
        prompts: the step's prompts *before* the ``rollout.n`` repetition, with ``uid`` (one row per prompt).
        batch: the sampled responses (``B = prompts × n`` rows, each with the ``uid`` of its prompt).
        actor_wg: the actor/rollout group (``generate_sequences``).
        reward_fn, rm_wg: the training reward manager and the reward-model group (or None).
        global_steps: written into the rollout's meta like the sampled generation.
    Raises:
        KeyError: when a row of ``batch`` has a ``uid`` that is not among ``prompts``.
    """
    greedy = Batch(dict(prompts.tensors), dict(prompts.non_tensors),
                   {**prompts.meta, "global_steps": global_steps, "validate": False, "do_sample": False})
    padded, pad = pad_to_divisor(greedy, actor_wg.world_size)
    greedy = ensure_response_mask(greedy.merge(unpad(actor_wg.execute_dp("generate_sequences", padded), pad)))
    _, result = score_batch(greedy, reward_fn, rm_wg)
    by_uid = dict(zip((str(u) for u in greedy["uid"]), result["reward_tensor"].float().sum(-1).tolist()))
    baselines = torch.tensor([by_uid[str(u)] for u in batch["uid"]], dtype=torch.float32)
    return batch.merge(Batch({"reward_baselines": baselines}))
