"""Policy filtration for PPO (``algorithm.use_pf_ppo``, ``algorithm.pf_ppo.*``): resample the batch by reward.

PF-PPO (Zhang et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation", arXiv:2409.06957, §3):
before the PPO update, the batch is resampled with replacement, each response drawn with probability proportional to
a weight of its score, so that responses whose reward is more reliable (high and low) dominate the update. verl
``core_algos.compute_pf_ppo_reweight_data``; the trainer applies it after the advantage stage (see
``rlhf_core.trainer.ppo_trainer``).
"""
from __future__ import annotations

import torch

PF_PPO_REWEIGHT_METHODS = ("pow", "max_min", "max_random")


@torch.no_grad()
def pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float) -> torch.Tensor:
    """Sampling weight per response, before normalisation.

    ``pow``: |s|^``weight_pow``; ``max_min``: 1 for the responses whose score is the batch max or min, else 0 (the
    paper's best-worst filter); ``max_random``: 0.4 for the max-score responses, 0.1 for the others (best-random).
    Then w ← max(w + 1e-8, 1e-8), so every response keeps a tiny chance (as verl).

    Args:
        scores: ``(B,)`` float, the sequence scores Σ_t token_level_scores.
    Returns:
        ``(B,)`` float weights > 0.
    Raises:
        ValueError: for a method other than pow, max_min, max_random (naming ``algorithm.pf_ppo.reweight_method``).
    """
    s = scores.float()
    if reweight_method == "pow":
        w = torch.pow(torch.abs(s), weight_pow)
    elif reweight_method == "max_min":
        w = ((s == s.max()) | (s == s.min())).float()
    elif reweight_method == "max_random":
        w = torch.where(s == s.max(), 0.4, 0.1)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={reweight_method!r} is not one of "
                         f"{list(PF_PPO_REWEIGHT_METHODS)}")
    return torch.clamp(w + 1e-8, min=1e-8)


@torch.no_grad()
def pf_ppo_resample_indices(scores: torch.Tensor, reweight_method: str, weight_pow: float,
                            generator: torch.Generator | None = None) -> torch.Tensor:
    """B row indices drawn with replacement, P(i) ∝ :func:`pf_ppo_weights` (``torch.multinomial``).

    Args:
        scores: ``(B,)`` float sequence scores.
        generator: RNG on the CPU (``None``: the global one, as verl).
    Returns:
        ``(B,)`` int64 indices into the batch (CPU).
    """
    weights = pf_ppo_weights(scores.detach().cpu(), reweight_method, weight_pow)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)
