"""Per-token KL estimators between the policy and the reference (``algorithm.kl_penalty``, ``actor.kl_loss_type``).

d = logπ − logπ_ref per token. Estimators follow Schulman, "Approximating KL divergence" (2020,
http://joschu.net/blog/kl-approx.html): k1 = d, k2 = ½d², k3 = e^{−d} + d − 1 (verl ``kl_penalty``).
"""
from __future__ import annotations

import torch

KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k2+", "k3+", "low_var_kl+", "kl+",
            "abs+", "mse+")


def _k2(d: torch.Tensor) -> torch.Tensor:
    return 0.5 * d.square()


def _low_var_kl(d: torch.Tensor) -> torch.Tensor:
    # x = clamp(−d, ±20) *before* exp: e^20 is finite, so value and gradient stay finite for any d.
    x = torch.clamp(-d, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(x) - x - 1.0, min=-10.0, max=10.0)


def _forward(d: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return d
    if kind == "abs":
        return d.abs()
    if kind in ("mse", "k2"):
        return _k2(d)
    if kind in ("low_var_kl", "k3"):
        return _low_var_kl(d)
    if kind == "full":
        raise ValueError("kl_penalty 'full' needs the full logits: use kl_penalty_full(logits, ref_logits)")
    raise ValueError(f"unknown kl_penalty {kind!r}; expected one of {list(KL_KINDS)} or 'full'")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of π vs π_ref from the sampled tokens' log-probs (SEMANTICS "KL estimators").

    * ``kl``/``k1``: d · ``abs``: |d| · ``mse``/``k2``: ½d²
    * ``low_var_kl``/``k3``: with x = clamp(−d, −20, 20): eˣ − x − 1, clamped to [−10, 10]
    * suffix ``+`` (``k1+``, ``k3+``, ...): straight-through — value of the named estimator, gradient of k2:
      k2 − stopgrad(k2) + stopgrad(named).

    No masking here: the caller multiplies by / aggregates with ``response_mask``.

    Args:
        log_prob, ref_log_prob: ``(B, T)`` float.
    Returns:
        ``(B, T)``, dtype of ``log_prob``.
    Raises:
        ValueError: for an unknown kind, or ``full`` (see :func:`kl_penalty_full`).
    """
    d = log_prob - ref_log_prob
    if kind.endswith("+"):
        named = _forward(d, kind[:-1])
        k2 = _k2(d)
        return k2 - k2.detach() + named.detach()
    return _forward(d, kind)


def kl_penalty_full(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Exact KL(π ‖ π_ref) = Σ_v π_v (log π_v − log π_ref,v) per position, from full logits (``kl_penalty: full``).

    Computed with log_softmax in float32; a token banned by the policy (logit −inf) contributes 0.

    Args:
        logits, ref_logits: ``(B, T, V)`` float (same V).
    Returns:
        ``(B, T)`` float32, ≥ 0 up to rounding.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    logq = torch.log_softmax(ref_logits.float(), dim=-1)
    p = logp.exp()
    diff = torch.where(p > 0, logp - logq, torch.zeros((), device=p.device))
    return (p * diff).sum(dim=-1)
