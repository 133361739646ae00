"""The policy-loss calling convention: PolicyLossInputs / PolicyLossConfig, and custom losses written with verl's
signature (``VerlPolicyLoss``), which must give the native losses' numbers, micro-batch contributions included."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from rlhf_core.algos import (
    LOSS_AGG_MODES,
    PolicyLossConfig,
    PolicyLossInputs,
    VerlPolicyLoss,
    agg_loss,
    get_policy_loss_fn,
    global_token_and_seq_counts,
    masked_mean,
    register_policy_loss,
)

from tests.rlhf_core.algos.test_algos_losses import _random_batch


def actor_config(loss_agg_mode="token-mean"):
    """An ``actor_rollout_ref.actor`` node with the settings the losses read (asymmetric clip: null low → 0.2)."""
    return OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                             "loss_agg_mode": loss_agg_mode, "tau_pos": 1.0, "tau_neg": 1.05,
                             "policy_loss": {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0,
                                             "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1,
                                             "dro_beta": None}})


# A custom loss as a verl 0.6 user writes it: verl's positional signature, settings read from the actor config,
# aggregation over the batch it is given, and the 4-tuple return. This one is PPO clip + dual clip, i.e. "vanilla".
@register_policy_loss("test_verl_signature_vanilla")
def verl_signature_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                           rollout_is_weights=None):
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    unclipped, clipped = -advantages * ratio, -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    ppo_term = torch.maximum(unclipped, clipped)
    dual = -advantages * config.clip_ratio_c
    pg_losses = torch.where(advantages < 0, torch.minimum(ppo_term, dual), ppo_term)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_clipfrac = masked_mean((clipped > unclipped).float(), response_mask)
    pg_clipfrac_lower = masked_mean(((ppo_term > dual) & (advantages < 0)).float(), response_mask)
    return agg_loss(pg_losses, response_mask, loss_agg_mode), pg_clipfrac, masked_mean(-neg_kl, response_mask), \
        pg_clipfrac_lower


# A custom loss in later verl's style: (pg_loss, metrics dict with "actor/" names and float values).
@register_policy_loss("test_verl_signature_dict")
def verl_signature_dict(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                        rollout_is_weights=None):
    metrics = {"actor/ppo_kl": 0.1, "actor/pg_clipfrac": 0.0}
    return agg_loss(-advantages * log_prob, response_mask, loss_agg_mode), metrics


def _batch():
    """test_algos_losses' random (8, 6) batch (one fully masked row) and rollout IS weights in [0.5, 1.5)."""
    old, new, adv, mask = _random_batch()
    return old, new, adv, mask, torch.rand(mask.shape, generator=torch.Generator().manual_seed(1)) + 0.5


def test_a_verl_signature_loss_is_registered_through_the_adapter_and_returned_unchanged():
    fn = get_policy_loss_fn("test_verl_signature_vanilla")
    assert isinstance(fn, VerlPolicyLoss) and fn.fn is verl_signature_vanilla
    assert fn.__name__ == "verl_signature_vanilla"
    assert not isinstance(verl_signature_vanilla, VerlPolicyLoss)  # the decorator hands back the user's function


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_verl_signature_loss_equals_the_native_loss_whole_batch_and_per_micro_batch(mode):
    old, new, adv, mask, weights = _batch()
    config = PolicyLossConfig.from_actor_config(actor_config(mode))
    native, adapted = get_policy_loss_fn("vanilla"), get_policy_loss_fn("test_verl_signature_vanilla")

    whole = PolicyLossInputs(old, new, adv, mask, rollout_is_weights=weights)
    (want, want_m), (got, got_m) = native(whole, config), adapted(whole, config)
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    assert {k: float(v) for k, v in got_m.items()} == pytest.approx({k: float(v) for k, v in want_m.items()}, abs=1e-7)
    assert all(v.dim() == 0 and v.dtype == torch.float32 and not v.requires_grad for v in got_m.values())

    # micro-batches of 3, 3, 2 rows with the mini-batch's global counts: the adapter rescales verl's per-batch
    # aggregate into the same contribution the native loss gives, and the contributions add up to the whole loss
    n_tok, n_seq = global_token_and_seq_counts(mask)
    total = 0.0
    for rows in (slice(0, 3), slice(3, 6), slice(6, 8)):
        part = PolicyLossInputs(old[rows], new[rows], adv[rows], mask[rows], rollout_is_weights=weights[rows],
                                global_tokens=n_tok, global_seqs=n_seq)
        contribution = adapted(part, config)[0].item()
        assert contribution == pytest.approx(native(part, config)[0].item(), abs=1e-6)
        total += contribution
    assert total == pytest.approx(want.item(), rel=1e-5, abs=1e-6)  # float32: summed in another order


def test_dict_return_with_actor_prefixed_metrics_and_token_mean_contribution():
    # L = −A·logπ on the 2 valid tokens: −1·(−1) = 1, −2·(−0.5) = 1 → the batch's token-mean is 1. This micro-batch
    # holds 2 of the mini-batch's 4 tokens → contribution 1 · 2/4 = 0.5; ∂/∂logπ = −A/4 = [−0.25, −0.5, 0 (masked)].
    lp = torch.tensor([[-1.0, -0.5, -3.0]], requires_grad=True)
    inputs = PolicyLossInputs(torch.zeros(1, 3), lp, torch.tensor([[1.0, 2.0, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]]),
                              global_tokens=4.0, global_seqs=2.0)
    loss, metrics = get_policy_loss_fn("test_verl_signature_dict")(inputs, PolicyLossConfig.from_actor_config(
        actor_config("token-mean")))
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.25, -0.5, 0.0]]))
    assert set(metrics) == {"ppo_kl", "pg_clipfrac"}
    assert metrics["ppo_kl"].dtype == torch.float32 and metrics["ppo_kl"].item() == pytest.approx(0.1)


def test_verl_signature_loss_needs_the_actor_config_and_a_verl_return():
    inputs = PolicyLossInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    bare = dataclasses.replace(PolicyLossConfig.from_actor_config(actor_config()), actor_config=None)
    with pytest.raises(ValueError, match="from_actor_config"):
        get_policy_loss_fn("test_verl_signature_vanilla")(inputs, bare)
    with pytest.raises(ValueError, match="returned float"):
        VerlPolicyLoss(lambda old_log_prob, *a, **k: 1.0)(inputs, PolicyLossConfig.from_actor_config(actor_config()))


def test_inputs_are_frozen_and_shapes_are_checked_by_name():
    ones = torch.ones(2, 3)
    inputs = PolicyLossInputs(ones, ones, ones, ones)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.log_prob = ones
    with pytest.raises(ValueError, match=r"PolicyLossInputs.advantages has shape \(2, 1\); response_mask has \(2, 3\)"):
        PolicyLossInputs(ones, ones, torch.ones(2, 1), ones)
    with pytest.raises(ValueError, match="rollout_is_weights"):
        PolicyLossInputs(ones, ones, ones, ones, rollout_is_weights=torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"response_mask must be \(B, T\)"):
        PolicyLossInputs(ones[0], ones[0], ones[0], ones[0])
