"""``fsdp_config.pad_to_length`` / ``pad_to_length_bucket`` (verl 0.9's FSDP engine): every packed micro-batch is
rounded up to a multiple of the bucket in tokens, so a packed forward takes one of few shapes (kernels compiled or
autotuned per shape are reused); the pad tokens cost a forward and are dropped before the loss."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from rlhf_core.config.structured import full_key


def pad_bucket_of(engine_cfg: Mapping[str, Any]) -> int | None:
    """``engine_cfg.pad_to_length_bucket`` when ``engine_cfg.pad_to_length`` (a role's ``fsdp_config`` or
    ``critic.fsdp``: verl 0.9's engine reads these copies), else ``None``.

    Raises:
        ValueError: naming the key, for a bucket below 1."""
    if not engine_cfg.pad_to_length:
        return None
    bucket = int(engine_cfg.pad_to_length_bucket)
    if bucket < 1:
        raise ValueError(f"{full_key(engine_cfg, 'pad_to_length_bucket')}={bucket} must be at least 1")
    return bucket


def pad_pack_to_bucket(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                       bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of dummy tokens appended to a left-padded micro-batch so that its valid tokens number a multiple of
    ``bucket`` (verl 0.9 ``pad_to_length``: a packed forward then takes one of few shapes, so kernels compiled or
    tuned per shape are reused). Each dummy row is a sequence of its own (token 0 at positions ``0..k-1`` in the
    last ``k`` columns), so a packed forward, which attends per sequence, gives the real rows the outputs it gave
    without them; the caller drops the rows after the first ``b``.

    Args:
        ids, mask: ``(b, L)``; pos: ``(b, L)`` (or ``(b, 3, L)``). Returns the three with ``b + r`` rows."""
    b, L = mask.shape
    n = int(mask.sum())
    extra = -n % bucket
    if extra == 0 or L == 0:
        return ids, mask, pos
    lengths = [L] * (extra // L) + ([extra % L] if extra % L else [])
    col = torch.arange(L, device=mask.device)
    d_mask = torch.stack([(col >= L - k).to(mask.dtype) for k in lengths])
    d_pos = (d_mask.cumsum(-1) - 1).clamp(min=0).to(pos.dtype)
    if pos.dim() == 3:
        d_pos = d_pos[:, None, :].expand(-1, pos.shape[1], -1)
    return (torch.cat([ids, torch.zeros_like(d_mask, dtype=ids.dtype)]), torch.cat([mask, d_mask]),
            torch.cat([pos, d_pos]))
