"""The actor's micro-batch loss (verl ``DataParallelPPOActor.update_policy``'s loss assembly): the
:data:`~rlhf_core.workers.update_loop.MicroLoss` that :class:`~rlhf_core.workers.actor.DataParallelPPOActor` hands
to :func:`~rlhf_core.workers.update_loop.run_update`.

``loss = pg_loss − entropy_coeff·entropy_loss + kl_loss_coef·kl_loss``, every term aggregated by
``loss_agg_mode`` with the mini-batch's global token and sequence counts (all ranks), so that the micro-batch
contributions sum to the mini-batch's loss whatever the micro-batch split or the world size. With
``distillation.enabled`` the distillation term against the teacher's log-probs in the batch is added as verl's
``distillation_ppo_loss`` does (:func:`~rlhf_core.algos.distillation.combine_with_policy_loss`; without
``use_task_rewards`` and ``use_policy_gradient`` the PPO loss is not computed at all).
"""
from __future__ import annotations

from typing import Any, TYPE_CHECKING

import torch

from rlhf_core.algos.distillation import (DistillationInputs, combine_with_policy_loss, distillation_loss,
                                          needs_policy_loss, uses_topk)
from rlhf_core.algos.loss_agg import agg_loss
from rlhf_core.algos.policy_loss import PolicyLossConfig, PolicyLossInputs, get_policy_loss_fn
from rlhf_core.algos.rollout_correction import compute_policy_loss_bypass_mode
from rlhf_core.algos.rollout_is import compute_rollout_importance_weights
from rlhf_core.protocol import Batch
from rlhf_core.workers.fsdp_utils import device

# the teacher's tensors the loss reads: top-k log-probs and ids (forward_kl_topk), else the sampled token's log-prob
TEACHER_KEYS = {True: ("teacher_topk_log_probs", "teacher_topk_ids"), False: ("teacher_log_probs",)}

if TYPE_CHECKING:
    from rlhf_core.workers.actor import DataParallelPPOActor


def rollout_is_weights(config: Any, mb: Batch) -> torch.Tensor | None:
    """The rollout importance-sampling weights ``(b, T)`` the policy loss multiplies in: the batch's
    ``rollout_is_weights`` (the trainer's ``algorithm.rollout_correction``) when present; else, with the verl 0.6 key
    ``actor.rollout_is`` on and ``rollout_log_probs`` in the batch, computed here from ``old_log_probs`` and
    ``rollout_log_probs`` (:func:`~rlhf_core.algos.rollout_is.compute_rollout_importance_weights` with the
    ``rollout_is_*`` keys); else None (no weights)."""
    if "rollout_is_weights" in mb:
        return mb["rollout_is_weights"]
    if not config.rollout_is or "rollout_log_probs" not in mb:
        return None
    weights, _ = compute_rollout_importance_weights(
        mb["old_log_probs"], mb["rollout_log_probs"], mb["response_mask"],
        level=config.rollout_is_level, mode=config.rollout_is_mode,
        threshold=config.rollout_is_threshold, threshold_lower=config.rollout_is_threshold_lower,
        veto_threshold=config.rollout_is_veto_threshold)
    return weights


def actor_micro_loss(actor: "DataParallelPPOActor", mb: Batch, temperature: float, n_tok: float, n_seq: float,
                     bypass: Any = None) -> tuple[torch.Tensor, dict]:
    """This micro-batch's contribution to the mini-batch loss (0-d tensor with grad), and its metric contributions
    (summed over micro-batches and ranks: the mini-batch's values).

    Args:
        actor: the policy (its ``config`` = ``actor_rollout_ref.actor``, its forward ``_log_prob_entropy`` and, for
            the KL loss, ``kl_loss_terms``).
        mb: the micro-batch (``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``,
            ``advantages``, ``old_log_probs`` unless on-policy, ...; see ``DataParallelPPOActor.update_policy``).
        temperature: the rollout temperature the logits are divided by.
        n_tok, n_seq: the mini-batch's valid tokens and sequences over all ranks.
        bypass: the ``algorithm.rollout_correction`` settings in bypass mode (the loss is then
            :func:`~rlhf_core.algos.rollout_correction.compute_policy_loss_bypass_mode`), else None.
    """
    cfg = actor.config
    mode = cfg.loss_agg_mode
    # verl 0.9: the divisor of seq-mean-token-sum-norm for every term (policy, entropy, KL); None: T
    scale = None if cfg.loss_scale_factor is None else float(cfg.loss_scale_factor)
    entropy_coeff = float(cfg.entropy_coeff)
    dev = device()
    mask = mb["response_mask"].to(dev)
    use_kl_loss = bool(cfg.use_kl_loss)
    full_kl = use_kl_loss and cfg.kl_loss_type == "full"
    # the entropy enters the loss only with entropy_coeff (verl computes it only then, too); the logged
    # actor/entropy is the rollout batch's pre-update entropy, from compute_log_prob (the trainer's old_log_prob)
    # on-policy shortcut (workers/on_policy.py): without old_log_probs the first forward provides them, and
    # the pre-update actor/entropy the skipped old_log_prob stage would have logged
    on_policy = "old_log_probs" not in mb
    entropy_metric = bool(entropy_coeff) or bool(cfg.calculate_entropy)  # verl 0.9: actor/entropy_loss
    distill = actor.distillation  # distillation.distillation_loss when distillation.enabled, else None
    topk = distill is not None and uses_topk(distill.loss_mode)
    log_prob, entropy, *rest = actor._log_prob_entropy(mb, temperature, with_entropy=entropy_metric or on_policy,
                                                       return_logits=full_kl or topk, entropy_grad=bool(entropy_coeff))
    old_log_prob = log_prob.detach() if on_policy else mb["old_log_probs"].to(dev)
    is_w = rollout_is_weights(cfg, mb)
    if distill is not None:
        d_inputs = DistillationInputs(
            log_prob, old_log_prob, mask, rollout_is_weights=None if is_w is None else is_w.to(dev),
            global_tokens=n_tok, global_seqs=n_seq, loss_scale_factor=scale, logits=rest[0] if topk else None,
            **{k: mb[k].to(dev) for k in TEACHER_KEYS[topk]})
        d_loss, d_metrics = distillation_loss(d_inputs, distill, cfg)
        d_metrics["distillation/loss"] = float(d_loss.detach())  # a contribution: summed, the mini-batch's loss
        if not needs_policy_loss(distill):  # verl: no PPO loss (nor its entropy / KL terms) at all
            if on_policy:
                d_metrics["actor/entropy"] = float(agg_loss(entropy.detach(), mask, mode, global_tokens=n_tok,
                                                            global_seqs=n_seq, loss_scale_factor=scale))
            return d_loss, d_metrics
    inputs = PolicyLossInputs(old_log_prob, log_prob, mb["advantages"].to(dev), mask,
                              rollout_is_weights=None if is_w is None else is_w.to(dev), global_tokens=n_tok,
                              global_seqs=n_seq, loss_scale_factor=scale)
    if bypass is not None:
        pg_loss, pg_metrics = compute_policy_loss_bypass_mode(inputs, PolicyLossConfig.from_actor_config(cfg), bypass)
    else:
        loss_fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)
        pg_loss, pg_metrics = loss_fn(inputs, PolicyLossConfig.from_actor_config(cfg))
    loss = pg_loss
    metrics = {"actor/pg_loss": float(pg_loss.detach())}
    if entropy_metric:
        entropy_loss = agg_loss(entropy, mask, mode, global_tokens=n_tok, global_seqs=n_seq, loss_scale_factor=scale)
        if entropy_coeff:
            loss = loss - entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = float(entropy_loss.detach())  # a share: summed, the mini-batch's value
    share = float(mask.sum()) / max(n_tok, 1e-8)  # token share: turns micro-batch means into mini-batch means
    if on_policy:  # a mini-batch-normalised share: summed over micro-batches it is the batch's entropy
        metrics["actor/entropy"] = float(agg_loss(entropy.detach(), mask, mode, global_tokens=n_tok,
                                                  global_seqs=n_seq, loss_scale_factor=scale))
    metrics.update({k if k.startswith("rollout_corr/") else f"actor/{k}": float(v) * share
                    for k, v in pg_metrics.items()})
    if use_kl_loss:
        kl = actor.kl_loss_terms(mb, log_prob, rest[0] if rest else None, temperature)
        kl_loss = agg_loss(kl, mask, mode, global_tokens=n_tok, global_seqs=n_seq, loss_scale_factor=scale)
        loss = loss + float(cfg.kl_loss_coef) * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())
    if distill is not None:  # verl distillation_ppo_loss
        metrics.update(d_metrics)
        loss = combine_with_policy_loss(loss, d_loss, distill)
    return loss, metrics
