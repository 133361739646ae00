"""GDPO advantage ``gdpo`` (``algorithm.adv_estimator``; verl 0.9 ``compute_gdpo_outcome_advantage``).

Source: GDPO, Group reward-Decoupled normalization Policy Optimization (arXiv:2601.05242). With several reward
components r^(1..K) per response (format, accuracy, ...), GRPO normalises their sum, so the component with the
largest spread decides the sign of every advantage. GDPO normalises each component within the prompt's group
first, then adds them and normalises the sum over the batch:

    A_i^(k) = (r_i^(k) − mean_g(r^(k))) / (std_g(r^(k)) + ε)      (per component; GRPO's normalisation)
    Â_i     = Σ_k c_k · A_i^(k)                                   (c_k = ``algorithm.gdpo_reward_weights``, default 1)
    A_i,t   = whiten(Â)_i,t                                       (mean/unbiased std over all valid tokens of the batch)

Components come from the reward function's dict result (``reward_extra_info``), named by
``algorithm.gdpo_reward_keys``; the trainer passes them as ``reward_components``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from rlhf_core.algos.advantages import _finish, compute_grpo_outcome_advantage, register_adv_est
from rlhf_core.algos.groups import group_stats_vectorized
from rlhf_core.algos.utils import masked_whiten


def reward_components_from(columns: Mapping[str, Any], keys: Sequence[str], batch_size: int) -> dict[str, torch.Tensor]:
    """The per-sample reward components ``keys`` from per-sample columns (the batch's reward extra info) as
    ``(B,)`` float32 tensors.

    Raises:
        ValueError: naming the key, when ``keys`` is empty, a key is missing (listing the available ones), has
            another length than the batch, or holds a value that is not a number (None: the scorer did not
            return the key for that sample).
    """
    if not keys:
        raise ValueError("adv_estimator 'gdpo' needs algorithm.gdpo_reward_keys: the reward function's dict keys "
                         "of the reward components (e.g. [format_reward, accuracy_reward])")
    out = {}
    for key in keys:
        if key not in columns:
            raise ValueError(f"algorithm.gdpo_reward_keys: {key!r} is not in the reward extra info; the reward "
                             f"function returned {sorted(columns)} (return a dict with {key!r})")
        values = list(columns[key])
        if len(values) != batch_size:
            raise ValueError(f"algorithm.gdpo_reward_keys: {key!r} has {len(values)} values for {batch_size} samples")
        try:
            out[key] = torch.tensor([float(v) for v in values], dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            bad = next(i for i, v in enumerate(values) if not isinstance(v, (int, float)))
            raise ValueError(f"algorithm.gdpo_reward_keys: {key!r} of sample {bad} is {values[bad]!r}, not a "
                             f"number") from exc
    return out


@register_adv_est("gdpo")
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
    reward_components: Mapping[str, torch.Tensor] | None = None, reward_weights: Sequence[float] | None = None,
    epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (module docstring): per-component group normalisation, weighted sum, batch whitening.

    Each component's group normalisation is ``grpo``'s (unbiased std; a group of one has mean 0, std 1; a group
    whose values are equal gets 0; ``norm_adv_by_std_in_grpo=False`` only centres). Without ``reward_components``
    the one component is Σ_t ``token_level_rewards`` (GRPO followed by batch whitening), as verl without keys.

    Args:
        token_level_rewards, response_mask: ``(B, T)``. index: ``(B,)`` group keys (``uid``).
        reward_components: name → ``(B,)`` float per-sample score of that component (see
            :func:`reward_components_from`). reward_weights: c_k, one per component in its order; None = all 1.
    Returns:
        ``(advantages, returns)`` ``(B, T)`` float32, both the whitened Â, 0 at masked positions.
    Raises:
        ValueError: when ``reward_weights`` does not have one weight per component, or a component is not ``(B,)``.
    """
    b = token_level_rewards.shape[0]
    comps = list(reward_components.values()) if reward_components else [token_level_rewards.float().sum(-1)]
    names = list(reward_components) if reward_components else ["token_level_rewards"]
    weights = [1.0] * len(comps) if reward_weights is None else [float(c) for c in reward_weights]
    if len(weights) != len(comps):
        raise ValueError(f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(comps)} reward "
                         f"components {names}")
    mask = response_mask.float()
    total = torch.zeros(b, dtype=torch.float64, device=response_mask.device)
    for name, comp, c in zip(names, comps, weights):
        if comp.reshape(-1).shape[0] != b:
            raise ValueError(f"gdpo reward component {name!r} has shape {tuple(comp.shape)}, expected ({b},)")
        # one sequence score per row: a (B, 1) "reward" summed by grpo (valid row mask so empty responses count too)
        score = comp.reshape(b, 1).to(response_mask.device).float()
        adv, _ = compute_grpo_outcome_advantage(token_level_rewards=score, response_mask=torch.ones_like(score),
                                                index=index, epsilon=epsilon, group_stats=group_stats_vectorized,
                                                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
        total += c * adv[:, 0].double()
    a = masked_whiten(total.unsqueeze(-1) * mask.double(), mask.double())
    return _finish(a, a, response_mask)
