"""PPO policy loss (clipped, dual-clip) and clipped value loss, with the policy-loss registry.

The registry is keyed by verl's ``actor_rollout_ref.actor.policy_loss.loss_mode`` (``vanilla`` here; ``gspo``,
``gpg``, ``geo_mean`` in ``policy_loss_seq``, ``clip_cov``, ``kl_cov`` in ``policy_loss_cov``, ``cispo``,
``dppo_tv``, ``dppo_kl`` in ``policy_loss_logp``, ``sapo``, ``dro`` in ``policy_loss_smooth``). Every entry is
called the same way, ``loss_fn(inputs, config) -> (pg_loss, metrics)``:

* ``inputs`` (:class:`PolicyLossInputs`): this (micro-)batch's ``(B, T)`` tensors ``old_log_prob``, ``log_prob``,
  ``advantages``, ``response_mask``, the optional ``rollout_is_weights`` and the mini-batch-wide
  ``global_tokens`` / ``global_seqs`` counts;
* ``config`` (:class:`PolicyLossConfig`): ``loss_agg_mode`` and the loss scalars, read once from
  ``actor_rollout_ref.actor`` by :meth:`PolicyLossConfig.from_actor_config`;
* ``metrics``: ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` as 0-d *detached* float32 tensors (no device sync
  inside the micro-batch loop); call ``float()`` / ``.item()`` when logging.

Custom losses: ``@register_policy_loss("my_loss")`` on a function with that signature, then
``policy_loss.loss_mode=my_loss``. A loss written for verl (``core_algos.register_policy_loss``), i.e. with verl's
signature ``(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
rollout_is_weights=None)`` returning ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` (verl 0.6) or
``(pg_loss, metrics dict)`` (later verl), is recognised by its first parameter's name ``old_log_prob`` and registered
through :class:`VerlPolicyLoss`, which calls it as verl's actor does (``config`` = the actor config).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import torch

from rlhf_core.algos.loss_agg import agg_loss
from rlhf_core.algos.utils import masked_mean
from rlhf_core.registry import Registry


@dataclasses.dataclass(frozen=True)
class PolicyLossInputs:
    """The tensors of one (micro-)batch that every policy loss reads.

    Attributes:
        old_log_prob: ``(B, T)`` float32, log π_old of the response tokens (rollout-time policy).
        log_prob: ``(B, T)`` float32, log π_θ of the same tokens; the gradient flows through this one only.
        advantages: ``(B, T)`` float32, A per token.
        response_mask: ``(B, T)`` 0/1 (float or bool), the valid response tokens.
        rollout_is_weights: ``(B, T)`` float32 rollout importance-sampling weights or ``None``; the losses use them
            detached.
        global_tokens, global_seqs: valid tokens / sequences of the whole mini-batch over all micro-batches and
            ranks, or ``None`` (this batch alone); with them the loss is this micro-batch's contribution
            (``rlhf_core.algos.loss_agg``).
        loss_scale_factor: ``actor.loss_scale_factor``: the constant divisor of ``seq-mean-token-sum-norm``
            (``None``: the response length ``T``; :func:`~rlhf_core.algos.loss_agg.agg_loss`).
    Raises:
        ValueError: when a tensor's shape differs from ``response_mask``'s or is not 2-d, naming the field.
    """

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None
    global_tokens: float | None = None
    global_seqs: float | None = None
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.response_mask.shape)
        if len(shape) != 2:
            raise ValueError(f"PolicyLossInputs.response_mask must be (B, T), got shape {shape}")
        for name in ("old_log_prob", "log_prob", "advantages", "rollout_is_weights"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"PolicyLossInputs.{name} has shape {tuple(value.shape)}; response_mask has {shape}")

    def aggregate(self, pg_losses: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
        """The scalar of a per-token policy loss: ``(B, T)`` ``pg_losses`` × the detached ``rollout_is_weights``
        when given, then ``agg_loss(·, response_mask, loss_agg_mode, global_tokens, global_seqs)``."""
        if self.rollout_is_weights is not None:
            pg_losses = pg_losses * self.rollout_is_weights.detach()
        return agg_loss(pg_losses, self.response_mask, loss_agg_mode, global_tokens=self.global_tokens,
                        global_seqs=self.global_seqs, loss_scale_factor=self.loss_scale_factor)


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """The settings every policy loss is called with (verl's names; defaults live in ``rlhf_core/configs/*.yaml``).

    Attributes:
        loss_agg_mode: ``actor.loss_agg_mode`` (``rlhf_core.algos.loss_agg.LOSS_AGG_MODES``).
        clip_ratio_low, clip_ratio_high: ε_low, ε_high (``actor.clip_ratio_low/high``; null → ``actor.clip_ratio``).
        clip_ratio_c: the dual-clip bound c (``actor.clip_ratio_c``).
        clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio, ppo_kl_coef: ``actor.policy_loss.*``.
        tau_pos, tau_neg: SAPO's gate temperatures (``actor.tau_pos`` / ``actor.tau_neg``).
        dro_beta: DRO's penalty coefficient β (``actor.policy_loss.dro_beta``; ``None`` unless loss_mode=dro).
        actor_config: the ``actor_rollout_ref.actor`` node these were read from, handed as ``config`` to losses
            with verl's signature (:class:`VerlPolicyLoss`); not compared.
    """

    loss_agg_mode: str
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    tau_pos: float
    tau_neg: float
    dro_beta: float | None
    actor_config: Any = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_actor_config(cls, actor_config: Any) -> "PolicyLossConfig":
        """Read the settings from ``actor_rollout_ref.actor`` (as verl's losses do: a null ``clip_ratio_low`` /
        ``clip_ratio_high`` falls back to ``clip_ratio``)."""
        clip, low, high = actor_config.clip_ratio, actor_config.clip_ratio_low, actor_config.clip_ratio_high
        pl = actor_config.policy_loss
        return cls(loss_agg_mode=str(actor_config.loss_agg_mode), clip_ratio_low=float(clip if low is None else low),
                   clip_ratio_high=float(clip if high is None else high),
                   clip_ratio_c=float(actor_config.clip_ratio_c), clip_cov_ratio=float(pl.clip_cov_ratio),
                   clip_cov_lb=float(pl.clip_cov_lb), clip_cov_ub=float(pl.clip_cov_ub),
                   kl_cov_ratio=float(pl.kl_cov_ratio), ppo_kl_coef=float(pl.ppo_kl_coef),
                   tau_pos=float(actor_config.tau_pos), tau_neg=float(actor_config.tau_neg),
                   dro_beta=None if pl.dro_beta is None else float(pl.dro_beta), actor_config=actor_config)


PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossConfig], tuple[torch.Tensor, dict[str, torch.Tensor]]]
_POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss_mode")
_VERL_METRICS = ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")


class VerlPolicyLoss:
    """A policy loss written with verl's signature, called as a :data:`PolicyLossFn`.

    It is called as verl's actor calls it: ``fn(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode=config.loss_agg_mode, config=config.actor_config, rollout_is_weights=...)``. verl losses aggregate
    over the batch they are given, so with ``global_tokens`` / ``global_seqs`` the result is rescaled into this
    micro-batch's contribution: × local valid tokens / ``global_tokens`` (``token-mean``), × local valid sequences /
    ``global_seqs`` (``seq-mean-*``), unchanged for ``token-sum``. For a loss that aggregates with ``agg_loss`` this
    equals passing the global counts. The return may be verl 0.6's ``(pg_loss, pg_clipfrac, ppo_kl,
    pg_clipfrac_lower)`` or later verl's ``(pg_loss, metrics)`` (an ``actor/`` prefix on metric names is dropped);
    metrics come back as 0-d detached float32 tensors.

    Raises (on call):
        ValueError: when ``config.actor_config`` is ``None`` (verl losses read their settings from it; build the
            config with :meth:`PolicyLossConfig.from_actor_config`), or the loss returns another shape of result.
    """

    def __init__(self, fn: Callable[..., tuple]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
        if config.actor_config is None:
            raise ValueError(f"policy loss {self.fn.__qualname__} has verl's signature and reads its settings from "
                             "the actor config: build PolicyLossConfig with from_actor_config(actor_config)")
        out = self.fn(inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.response_mask,
                      loss_agg_mode=config.loss_agg_mode, config=config.actor_config,
                      rollout_is_weights=inputs.rollout_is_weights)
        if isinstance(out, tuple) and len(out) == 4:
            pg_loss, metrics = out[0], dict(zip(_VERL_METRICS, out[1:]))
        elif isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
            pg_loss, metrics = out[0], {k.removeprefix("actor/"): v for k, v in out[1].items()}
        else:
            raise ValueError(f"policy loss {self.fn.__qualname__} returned {type(out).__name__}; expected verl's "
                             "(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) or (pg_loss, metrics dict)")
        return pg_loss * self._contribution_scale(inputs, config.loss_agg_mode), {
            k: torch.as_tensor(v).detach().float() for k, v in metrics.items()}

    @staticmethod
    def _contribution_scale(inputs: PolicyLossInputs, loss_agg_mode: str) -> float:
        """Local count ÷ global count for ``loss_agg_mode`` (1 without global counts or for ``token-sum``)."""
        mask = inputs.response_mask
        if loss_agg_mode == "token-mean" and inputs.global_tokens is not None:
            return float(mask.float().sum()) / max(float(inputs.global_tokens), 1e-8)
        if loss_agg_mode.startswith("seq-mean") and inputs.global_seqs is not None:
            return float((mask != 0).any(dim=-1).sum()) / max(float(inputs.global_seqs), 1e-8)
        return 1.0


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator adding a policy loss under ``policy_loss.loss_mode`` = ``name``; returns the function unchanged.

    A function whose first parameter is named ``old_log_prob`` has verl's signature and is registered wrapped in
    :class:`VerlPolicyLoss`; any other is registered as is and must be a :data:`PolicyLossFn`
    ``(inputs: PolicyLossInputs, config: PolicyLossConfig) -> (pg_loss, metrics)``.

    Raises:
        ValueError: when ``name`` is already registered to another loss.
    """
    add = _POLICY_LOSSES.register(name)

    def decorator(fn: Callable) -> Callable:
        params = list(inspect.signature(fn).parameters)
        add(VerlPolicyLoss(fn) if params[:1] == ["old_log_prob"] else fn)
        return fn

    return decorator


def registered_policy_losses() -> list[str]:
    """The names ``policy_loss.loss_mode`` accepts now: the built-in losses and any registered since (sorted)."""
    return _POLICY_LOSSES.names()


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The :data:`PolicyLossFn` registered under ``name``.

    Raises:
        ValueError: for an unknown name, listing the registered ones.
    """
    return _POLICY_LOSSES.get(name)


def pg_metrics(pg_clipfrac: torch.Tensor, ppo_kl: torch.Tensor, pg_clipfrac_lower: torch.Tensor) -> dict:
    """The three policy-loss metrics as 0-d detached float32 tensors (what every loss returns)."""
    return {"pg_clipfrac": pg_clipfrac.detach().float(), "ppo_kl": ppo_kl.detach().float(),
            "pg_clipfrac_lower": pg_clipfrac_lower.detach().float()}


def clipped_surrogate(advantages: torch.Tensor, ratio: torch.Tensor, clip_ratio_low: float,
                      clip_ratio_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's two surrogate terms (arXiv:1707.06347, eq. 7), ``(B, T)`` float each: ``(−A·r, −A·clip(r, 1−ε_low,
    1+ε_high))``; their elementwise max is the clipped loss."""
    return -advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)


@register_policy_loss("vanilla")
def compute_policy_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7) with dual clip (Ye et al. 2020,
    arXiv:1912.09729, eq. 5); verl ``compute_policy_loss_vanilla``.

    r = exp(clamp(logπ − logπ_old, −20, 20)); L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high));
    for A < 0: L = min(L, −A·c) with c = ``clip_ratio_c`` (> 1). When given, the detached
    ``rollout_is_weights`` multiply L per token. The scalar is :meth:`PolicyLossInputs.aggregate` with
    ``config.loss_agg_mode``.

    Returns:
        ``(pg_loss 0-d tensor, metrics)`` with metrics (0-d detached float32, masked means over this batch):
        ``pg_clipfrac`` (fraction of tokens where the clipped term is active), ``ppo_kl`` = mean(logπ_old − logπ),
        ``pg_clipfrac_lower`` (fraction of A<0 tokens where the dual clip is active).
    Raises:
        ValueError: when ``clip_ratio_c <= 1``.
    """
    clip_ratio_c, advantages, mask = config.clip_ratio_c, inputs.advantages, inputs.response_mask
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    log_ratio = torch.clamp(inputs.log_prob - inputs.old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped, loss_clipped = clipped_surrogate(advantages, ratio, config.clip_ratio_low, config.clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_ppo, -advantages * clip_ratio_c)
    negative = advantages < 0
    pg_losses = torch.where(negative, loss_dual, loss_ppo)
    pg_loss = inputs.aggregate(pg_losses, config.loss_agg_mode)
    with torch.no_grad():
        metrics = pg_metrics(masked_mean((loss_clipped > loss_unclipped).float(), mask),
                             masked_mean(-log_ratio, mask),
                             masked_mean(((loss_ppo > -advantages * clip_ratio_c) & negative).float(), mask))
    return pg_loss, metrics


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (PPO2 baseline, verl ``compute_value_loss``): ½·agg(max((V−R)², (V_clip−R)²)).

    V_clip = V_old + clip(V − V_old, −``cliprange_value``, +``cliprange_value``); ``None`` disables clipping.

    Args:
        vpreds: ``(B, T)`` float, current critic values V (gradient flows through these).
        returns: ``(B, T)`` float targets R. values: ``(B, T)`` float V_old at rollout.
        response_mask: ``(B, T)`` 0/1.
        loss_scale_factor: ``critic.loss_scale_factor``, the divisor of ``seq-mean-token-sum-norm`` (``None``: ``T``).
    Returns:
        ``(vf_loss 0-d tensor, vf_clipfrac 0-d detached float32)``; vf_clipfrac = masked mean of
        1[(V_clip−R)² > (V−R)²].
    """
    if cliprange_value is None:
        vclipped = vpreds
    else:
        vclipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
    loss1 = (vpreds - returns) ** 2
    loss2 = (vclipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss1, loss2), response_mask, loss_agg_mode,
                             global_tokens=global_tokens, global_seqs=global_seqs,
                             loss_scale_factor=loss_scale_factor)
    with torch.no_grad():
        clipfrac = masked_mean((loss2 > loss1).float(), response_mask)
    return vf_loss, clipfrac.detach().float()
