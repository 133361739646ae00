"""Turn generated token ids into the rollout output batch (shared by the HF and vLLM engines)."""
from __future__ import annotations

from typing import Sequence

import torch

from rlhf_core.protocol import Batch

# Validation calls are numbered from here (far beyond any run's count of training calls), see sampling_call_index.
VALIDATION_CALLS = 1 << 30


def sampling_call_index(calls: int, meta: dict) -> tuple[int, bool]:
    """(the call index that seeds this generate call, whether it counts as a training call).

    A training call uses the engine's counter ``calls`` (saved in the checkpoint's extra state, so a resumed run
    continues the same sequence of seeds) and advances it. A validation call (``meta["validate"]``) is seeded by
    ``VALIDATION_CALLS + 4096·meta["global_steps"] + meta["val_batch"]`` and leaves the counter alone: validating
    more or less often (``val_before_train`` runs again on every resume) never shifts the training samples."""
    if meta.get("validate"):
        return VALIDATION_CALLS + 4096 * int(meta.get("global_steps", 0)) + int(meta.get("val_batch", 0)), False
    return int(calls), True


def response_mask_from(responses: torch.Tensor, lengths: torch.Tensor, eos_ids: Sequence[int],
                       ignore_eos: bool = False) -> torch.Tensor:
    """``(B, T)`` int64 mask: generated positions (``< lengths``) up to and including the first EOS.

    With ``ignore_eos`` every generated position is valid (EOS tokens do not end the response)."""
    T = responses.shape[-1]
    generated = torch.arange(T, device=responses.device)[None, :] < lengths[:, None]
    if ignore_eos or not eos_ids:
        return generated.long()
    is_eos = torch.isin(responses, torch.tensor(list(eos_ids), device=responses.device)) & generated
    # eos strictly before t  ⇔  cumsum of is_eos up to t−1 > 0
    before = (torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()) > 0
    return (generated & ~before).long()


def build_rollout_batch(prompt_batch: Batch, responses: torch.Tensor, response_mask: torch.Tensor,
                        pad_token_id: int, rollout_log_probs: torch.Tensor | None = None) -> Batch:
    """The ARCHITECTURE output: ``prompts (B,P)``, ``responses (B,T)`` (pad id outside the mask),
    ``input_ids/attention_mask/position_ids (B,P+T)``, ``response_mask (B,T)`` [+ ``rollout_log_probs (B,T)``].

    Non-tensor columns and ``meta`` of ``prompt_batch`` are carried over."""
    prompts = prompt_batch["input_ids"]
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_token_id)).long()
    attention_mask = torch.cat([prompt_batch["attention_mask"].long(), response_mask.long()], dim=-1)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=-1),
               "attention_mask": attention_mask, "position_ids": position_ids, "response_mask": response_mask.long()}
    if rollout_log_probs is not None:
        tensors["rollout_log_probs"] = (rollout_log_probs.float() * response_mask).float()
    return Batch(tensors, dict(prompt_batch.non_tensors), dict(prompt_batch.meta))


def sampling_params(config, meta: dict) -> dict:
    """Effective ``do_sample``, ``temperature``, ``top_k`` (0 = off), ``top_p`` for one call (verl semantics).

    ``meta['validate']`` → ``rollout.val_kwargs``; ``meta['do_sample']`` overrides; not sampling or temperature 0
    → greedy."""
    validate = bool(meta.get("validate", False))
    src = config.val_kwargs if validate else config
    do_sample = bool(meta.get("do_sample", src.do_sample))
    temperature = float(src.temperature if validate else meta.get("temperature", src.temperature))
    top_k = int(src.top_k)
    top_p = float(src.top_p)
    if temperature <= 0:
        do_sample = False
    return {"do_sample": do_sample, "temperature": temperature if do_sample else 1.0,
            "top_k": max(top_k, 0), "top_p": top_p}
