"""The PPO driver's scoring helpers: reward-model scores before the reward manager, and ReMax's greedy baseline.

* :func:`add_rm_scores` — ``reward_model.enable``: the reward-model group's ``rm_scores (B, T)`` (score on the
  last valid response token) are merged into the batch *before* the reward manager, which then returns them
  unchanged (``rlhf_core.reward.managers``; verl's ``_compute_reward`` order).
* :func:`add_reward_baselines` — ``adv_estimator: remax`` (Li et al. 2023, arXiv:2310.10505, Alg. 1): once per
  prompt, a greedy response (``do_sample=False``) is generated and scored exactly like the sampled ones (reward
  model, then reward manager); its summed score is ``reward_baselines (B,)`` of every sample of that prompt.
  (verl scores the greedy response with the reward manager only, so with a reward model enabled its baseline is
  the rule score while the rewards are the RM's; here both come from the same scorer.)
* :func:`start_reward` / :func:`finish_reward` — the [reward] stage; with ``reward_model.launch_reward_fn_async``
  the reward manager runs in a background thread from [reward] until [adv] needs the scores, overlapping the
  old-log-prob, reference and value passes (verl 0.6's ``compute_reward_async`` Ray task); same scores.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
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


_REWARD_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward_fn")


def merge_reward(batch: Batch, result: dict) -> Batch:
    """``batch`` plus ``token_level_scores (B, T)`` float32 and the manager's per-sample extra columns (those with
    one value per row) from ``result = reward_fn(batch, return_dict=True)``."""
    extras = {k: np.asarray(v, dtype=object) for k, v in (result.get("reward_extra_info") or {}).items()
              if len(v) == len(batch)}
    return batch.merge(Batch({"token_level_scores": result["reward_tensor"].float()}, extras))


def start_reward(batch: Batch, reward_fn: Callable, rm_wg: Any | None, launch_async: bool) -> tuple[Batch, Any]:
    """[reward]: reward-model scores (synchronous, as verl), then the reward manager: called now, or with
    ``launch_async`` (``reward_model.launch_reward_fn_async``) submitted to a background thread. Returns
    (batch with ``rm_scores`` when a reward model runs, the manager's result or its :class:`Future`); pass both to
    :func:`finish_reward`."""
    batch = add_rm_scores(batch, rm_wg)
    if launch_async:
        return batch, _REWARD_THREAD.submit(reward_fn, batch, return_dict=True)
    return batch, reward_fn(batch, return_dict=True)


def finish_reward(batch: Batch, pending: Any) -> Batch:
    """``batch`` (rows in the order :func:`start_reward` saw) merged with the reward manager's result, waiting for
    it when it runs in the background (its exception is raised here); ``batch`` as is when ``pending`` is None (the
    result was merged already: dynamic sampling)."""
    if pending is None:
        return batch
    return merge_reward(batch, pending.result() if isinstance(pending, Future) else pending)
