"""Pure tensor RL math (no I/O, no Ray/Prefect/MLflow/vLLM): advantage estimators, policy/value losses,
loss aggregation, KL estimators and controllers, rollout importance sampling, PF-PPO resampling.

Importing the package registers every estimator and policy loss (the ``advantages_outcome``, ``advantages_gdpo``,
``advantages_token_baseline``, ``policy_loss_seq``, ``policy_loss_cov``, ``policy_loss_logp`` and
``policy_loss_smooth`` modules register theirs on import).

Names follow verl's ``core_algos`` so custom code ports by changing the import.
"""
from rlhf_core.algos.advantages import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_adv_estimator,
    get_adv_estimator_fn,
    register_adv_est,
    registered_adv_estimators,
)
from rlhf_core.algos.advantages_outcome import (  # registers opo, grpo_passk, gpg
    compute_gpg_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
)
from rlhf_core.algos.advantages_gdpo import compute_gdpo_outcome_advantage  # registers gdpo
from rlhf_core.algos.advantages_token_baseline import (  # registers (tir_)optimal_token_baseline
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
    sum_pi_squared_from_logits,
)
from rlhf_core.algos.kl import KL_KINDS, kl_penalty, kl_penalty_full
from rlhf_core.algos.kl_controller import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
)
from rlhf_core.algos.loss_agg import LOSS_AGG_MODES, agg_loss, global_token_and_seq_counts
from rlhf_core.algos.policy_loss import (
    PolicyLossConfig,
    PolicyLossInputs,
    VerlPolicyLoss,
    compute_policy_loss,
    compute_value_loss,
    get_policy_loss_fn,
    register_policy_loss,
    registered_policy_losses,
)
from rlhf_core.algos.policy_loss_cov import (  # registers clip_cov, kl_cov
    compute_policy_loss_clip_cov,
    compute_policy_loss_kl_cov,
)
from rlhf_core.algos.policy_loss_logp import (  # registers cispo, dppo_tv, dppo_kl
    compute_policy_loss_cispo,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
)
from rlhf_core.algos.policy_loss_seq import (  # registers gspo, gpg, geo_mean
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
)
from rlhf_core.algos.policy_loss_smooth import (  # registers sapo, dro
    compute_policy_loss_dro,
    compute_policy_loss_sapo,
)
from rlhf_core.algos.pf_ppo import PF_PPO_REWEIGHT_METHODS, pf_ppo_resample_indices, pf_ppo_weights
from rlhf_core.algos.rollout_is import compute_rollout_importance_weights
from rlhf_core.algos.utils import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "PF_PPO_REWEIGHT_METHODS", "compute_gdpo_outcome_advantage", "compute_gpg_outcome_advantage",
    "compute_grpo_passk_outcome_advantage", "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage", "compute_optimal_token_baseline_advantage", "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov", "compute_policy_loss_dppo_kl", "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro", "compute_policy_loss_sapo", "compute_policy_loss_geo_mean",
    "sum_pi_squared_from_logits",
    "compute_policy_loss_gpg", "compute_policy_loss_gspo", "compute_policy_loss_kl_cov", "pf_ppo_resample_indices",
    "pf_ppo_weights", "PolicyLossConfig", "PolicyLossInputs", "VerlPolicyLoss",
    "AdaptiveKLController", "FixedKLController", "KL_KINDS", "LOSS_AGG_MODES", "agg_loss", "apply_kl_penalty",
    "compute_gae_advantage_return", "compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage",
    "compute_policy_loss", "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage", "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_importance_weights", "compute_value_loss", "entropy_from_logits", "get_adv_estimator",
    "get_adv_estimator_fn", "get_kl_controller", "get_policy_loss_fn", "global_token_and_seq_counts",
    "kl_penalty", "kl_penalty_full", "logprobs_from_logits", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "register_adv_est", "register_policy_loss", "registered_adv_estimators",
    "registered_policy_losses",
]
