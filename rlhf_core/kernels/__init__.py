"""The CPU speed kernels behind one seam: packing (``use_remove_padding``), attention by matrix products, the
shared-prefix forward, the rollout's grouped decode attention and its reordered decode weights, float32 linears
on oneDNN.

Three entry points, nothing done at import:

* :func:`install` (once per process, where a worker or an engine sets up): registers the attention functions in
  transformers' ``AttentionInterface`` — ``"sdpa"`` becomes :func:`~rlhf_core.kernels.packing.varlen_sdpa`
  (transformers' SDPA, by matrix products for bf16 on CPU, per sequence for a packed forward) and
  :data:`~rlhf_core.kernels.grouped_attention.ATTN_NAME` the grouped decode attention.
* :func:`support` (:class:`KernelSupport`): what the kernels can do for one model, computed once per model.
* :func:`prepare`: what every role's model builder applies before sharding: :func:`install`, float32 linears on
  oneDNN where that is faster, and the refusal of ``use_remove_padding`` for a model that cannot pack.

This package imports only torch, transformers and its own modules (a layer below ``rlhf_core.workers``).
"""
from __future__ import annotations

from torch import nn

from rlhf_core.kernels.model_support import KernelSupport, support

__all__ = ["KernelSupport", "install", "installed", "prepare", "require_installed", "support"]

_INSTALLED = False


def install() -> None:
    """Register the kernels' attention functions with transformers (idempotent; process-wide, as transformers'
    ``AttentionInterface`` is): ``"sdpa"`` → :func:`~rlhf_core.kernels.packing.varlen_sdpa`, which is
    transformers' own ``sdpa_attention_forward`` for every call except bf16 on CPU (the same attention by matrix
    products, :mod:`~rlhf_core.kernels.matmul_attention`) and a packed forward carrying its layout (causal
    attention within each sequence); and ``"rlhf_grouped_prefix"`` → the rollout's grouped decode attention,
    switched on only inside ``grouped_attention.grouped_decode``."""
    global _INSTALLED
    if _INSTALLED:
        return
    from transformers import AttentionInterface

    from rlhf_core.kernels.grouped_attention import ATTN_NAME, grouped_attention
    from rlhf_core.kernels.packing import varlen_sdpa

    AttentionInterface.register("sdpa", varlen_sdpa)
    AttentionInterface.register(ATTN_NAME, grouped_attention)
    _INSTALLED = True


def installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return _INSTALLED


def require_installed(what: str) -> None:
    """Raise ``RuntimeError`` naming ``what`` unless :func:`install` has run (a kernel that needs its attention
    registered, called from a process that never set the kernels up)."""
    if not _INSTALLED:
        raise RuntimeError(f"{what} needs rlhf_core.kernels.install() to have run in this process (it registers "
                           "the kernels' attention functions with transformers); call it once where the worker "
                           "or engine sets up")


def prepare(model: nn.Module, packed_key: str | None = None) -> KernelSupport:
    """Apply the kernels to one role's model before it is sharded; returns its :class:`KernelSupport`.

    :func:`install`; every plain float32 ``nn.Linear`` onto oneDNN where that is the faster library on this CPU
    (:func:`~rlhf_core.kernels.onednn_linear.use_onednn_linears`); with ``packed_key`` (the config key that turned
    packing on, e.g. ``critic.model.use_remove_padding``) a model that cannot pack is refused.

    Raises:
        ValueError: naming ``packed_key``, the reason and the remedy, when ``packed_key`` is given and the model
            cannot be packed (:func:`~rlhf_core.kernels.packing.check_packing_support`).
    """
    from rlhf_core.kernels.onednn_linear import use_onednn_linears
    from rlhf_core.kernels.packing import check_packing_support

    install()
    described = support(model)
    if packed_key is not None:
        check_packing_support(model, packed_key)
    use_onednn_linears(model)  # float32 products on oneDNN where MKL is the slower library (non-Intel CPUs)
    return described
