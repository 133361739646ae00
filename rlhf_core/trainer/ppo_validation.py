"""Validation during PPO (verl's ``RayPPOTrainer._validate``).

For every batch of the validation set: give each prompt a ``uid``, repeat it ``rollout.val_kwargs.n`` times
(interleaved), generate with ``meta["validate"] = True`` (the rollout then samples with ``val_kwargs``: greedy by
default), add the reward model's ``rm_scores`` when an ``rm_wg`` is given, score with ``val_reward_fn`` and
collect one row per sample. Metrics come from
``rlhf_core.metrics.validation`` (``val-core/<data_source>/<var>/mean@N`` ...). Every sample is written to
``<trainer.validation_data_dir>/val_step_<N>.parquet`` (columns ``step, data_source, uid, sample_idx, prompt,
response, ground_truth, score`` + ``num_turns, tool_calls, tool_failures`` for agent-loop rollouts + the reward
manager's extra columns) when that key is set, and the first
``trainer.log_val_generations`` samples (seeded shuffle, like verl) are printed.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from rlhf_core.faults import fault_point
from rlhf_core.metrics.samples import trajectory_columns, write_samples_parquet
from rlhf_core.metrics.validation import process_validation_metrics, val_metrics_to_names
from rlhf_core.protocol import Batch
from rlhf_core.trainer.reward_stage import score_batch
from rlhf_core.trainer.driver_utils import add_uids, ensure_response_mask, pad_to_divisor, unpad

logger = logging.getLogger(__name__)

BASE_COLUMNS = ("step", "data_source", "uid", "sample_idx", "prompt", "response", "ground_truth", "score")


class Validator:
    """Runs validation on ``val_dataloader`` with the actor group's rollout; see the module docstring."""

    def __init__(self, config: Any, tokenizer: Any, actor_wg: Any, val_reward_fn: Callable | None,
                 val_dataloader: Any, rm_wg: Any = None):
        self.config = config
        self.rm_wg = rm_wg
        self.tokenizer = tokenizer
        self.actor_wg = actor_wg
        self.val_reward_fn = val_reward_fn
        self.val_dataloader = val_dataloader

    def validate(self, global_step: int) -> dict[str, float]:
        """Generate, score and summarise the whole validation set; returns ``{metric name: value}``, with
        ``val-aux/reward/num_errors``: the samples scored 0 because their score could not be computed."""
        if self.val_reward_fn is None or self.val_dataloader is None:
            return {}
        fault_point("validate", int(global_step))  # test-only (RLHF_FAULT); free when unset
        rows: list[dict[str, Any]] = []
        if hasattr(self.val_dataloader, "batches_done"):
            # a ResumableDataLoader: epoch e is a seeded shuffle (data.validation_shuffle); the order of a validation
            # depends on its global step only, not on how many validations ran before (a resumed run validates again)
            self.val_dataloader.epoch, self.val_dataloader.batches_done = int(global_step), 0
        for index, batch in enumerate(self.val_dataloader):
            rows.extend(self._validate_batch(batch, global_step, index))
        raw = process_validation_metrics([r["data_source"] for r in rows], [r["uid"] for r in rows],
                                         validation_infos(rows), seed=42)
        self._log_generations(rows)
        self._write_samples(rows, global_step)
        # samples whose score could not be computed (scored 0 by the reward manager), over the whole validation set
        n_errors = sum(int(r.get("reward_error") or 0) for r in rows)
        return {**val_metrics_to_names(raw), "val-aux/reward/num_errors": float(n_errors)}

    def _validate_batch(self, batch: Batch, global_step: int, index: int = 0) -> list[dict[str, Any]]:
        kw = self.config.actor_rollout_ref.rollout.val_kwargs
        n = int(kw.n)
        batch = add_uids(batch).repeat_interleave(n)
        # global_steps and val_batch seed the sampling (the training-call counter of the rollout stays untouched)
        batch.meta.update({"validate": True, "do_sample": bool(kw.do_sample),
                           "global_steps": global_step, "val_batch": index})
        padded, pad = pad_to_divisor(batch, self.actor_wg.world_size)
        out = unpad(self.actor_wg.execute_dp("generate_sequences", padded), pad)
        batch = ensure_response_mask(batch.merge(out))
        batch, result = score_batch(batch, self.val_reward_fn, self.rm_wg)
        scores = result["reward_tensor"].float().sum(-1).tolist()
        extras = result.get("reward_extra_info") or {}
        prompts = self._decode_prompts(batch)
        responses = self._decode_responses(batch)
        turns = trajectory_columns(batch.non_tensors)  # multi-turn: num_turns, tool_calls, tool_failures
        rows = []
        for i in range(len(batch)):
            reward_model = batch["reward_model"][i] if "reward_model" in batch else None
            row = {
                "step": int(global_step),
                "data_source": str(batch["data_source"][i]) if "data_source" in batch else "unknown",
                "uid": str(batch["uid"][i]),
                "sample_idx": i % n,
                "prompt": prompts[i],
                "response": responses[i],
                "ground_truth": None if not isinstance(reward_model, dict) else _to_str(reward_model.get("ground_truth")),
                "score": float(scores[i]),
            }
            row.update({key: values[i] for key, values in turns.items()})
            for key, values in extras.items():
                if key not in BASE_COLUMNS and key not in turns and len(values) == len(batch):
                    row[key] = _plain(values[i])
            rows.append(row)
        return rows

    def _decode_prompts(self, batch: Batch) -> list[str]:
        prompts = batch["prompts"] if "prompts" in batch else batch["input_ids"]
        mask = batch["attention_mask"][:, : prompts.shape[1]]
        return [self.tokenizer.decode(ids[m.bool()].tolist(), skip_special_tokens=True)
                for ids, m in zip(prompts, mask)]

    def _decode_responses(self, batch: Batch) -> list[str]:
        lengths = batch["response_mask"].sum(-1).tolist()
        return [self.tokenizer.decode(ids[: int(n)].tolist(), skip_special_tokens=True)
                for ids, n in zip(batch["responses"], lengths)]

    def _log_generations(self, rows: list[dict[str, Any]]) -> None:
        k = int(self.config.trainer.log_val_generations)
        if k <= 0 or not rows:
            return
        order = sorted(range(len(rows)), key=lambda i: rows[i]["prompt"])
        np.random.RandomState(42).shuffle(order)
        for i in order[:k]:
            r = rows[i]
            logger.info("[val sample] step %s score %.3f\n[prompt] %s\n[response] %s\n[ground_truth] %s",
                        r["step"], r["score"], r["prompt"], r["response"], r["ground_truth"])

    def _write_samples(self, rows: list[dict[str, Any]], global_step: int) -> str | None:
        out_dir = self.config.trainer.validation_data_dir
        if not out_dir or not rows:
            return None
        return write_samples_parquet(rows, str(out_dir), f"val_step_{global_step}")


def validation_infos(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Per-sample variables for ``process_validation_metrics``: ``reward`` (the summed score) and every extra
    column of the reward manager (keys of ``rows[0]`` beyond :data:`BASE_COLUMNS`).

    A column whose values are all numbers or bools (python or numpy) becomes floats, so a scorer's
    ``acc: True/False`` is the 0/1 core variable ``acc``. Any other column (e.g. ``pred`` strings, or one with
    ``None`` for samples that lack the key) is passed through unchanged: ``process_validation_metrics`` does not
    summarise non-numeric variables but uses ``pred`` for the majority vote (``maj@n``).
    """
    infos: dict[str, list] = {"reward": [float(r["score"]) for r in rows]}
    for key in (k for k in (rows[0] if rows else {}) if k not in BASE_COLUMNS):
        values = [r.get(key) for r in rows]
        if all(isinstance(v, bool | int | float | np.integer | np.floating | np.bool_) for v in values):
            infos[key] = [float(v) for v in values]
        else:
            infos[key] = values
    return infos


def _to_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _plain(value: Any) -> Any:
    """numpy scalars → python scalars (parquet-friendly); other values unchanged."""
    return value.item() if isinstance(value, np.generic) else value
