"""verl 0.9's off-policy trainers: the top-level ``rollout`` section (standalone rollout workers, from verl's
``one_step_off_ppo_trainer.yaml`` / ``fully_async_ppo_trainer.yaml``) and ``async_training``.

verl picks these trainers by entry module (``python -m verl.experimental.one_step_off_policy.main_ppo``); ours
picks them with ``async_training.mode`` (ours) on ``rlhf ppo``. The one-step off-policy trainer is
``rlhf_core.trainer.one_step_off_policy``; the fully asynchronous trainer is not built: ``mode=fully_async`` and
its keys away from their defaults are refused.
"""

from dataclasses import dataclass

from rlhf_core.config.spec import check_section, key

FULLY_ASYNC_WHY = ("the fully asynchronous trainer (verl's fully_async_policy) is not built yet: "
                   "async_training.mode=fully_async is refused")


# verl 0.9: off-policy trainers (one-step / fully async)
@dataclass
class StandaloneRolloutConfig:
    """``rollout`` (top level): the rollout workers apart from the trainer's (verl's one-step and fully async
    configs); read only when ``async_training.mode`` is not ``on_policy``."""

    nnodes: int = key(1, 'nodes of the standalone rollout workers (async_training.mode=one_step_off_policy)')
    n_gpus_per_node: int = key(8, 'rollout ranks per node (on CPU: worker processes per node) of the standalone '
                               'rollout workers (async_training.mode=one_step_off_policy)')
    total_rollout_steps: int = key(100, 'total rollout samples of the fully asynchronous trainer', only=None,
                                   why=FULLY_ASYNC_WHY)

    def __post_init__(self) -> None:
        check_section([f"{{section}}.{k} must be >= 1, got {v}." for k, v in
                       (("nnodes", self.nnodes), ("n_gpus_per_node", self.n_gpus_per_node))
                       if isinstance(v, int) and v < 1])


@dataclass
class AsyncTrainingConfig:
    """``async_training``: verl's fully async keys, plus ``mode``/``one_step_overlap`` (ours) choosing the trainer."""

    mode: str = key('on_policy', 'which PPO driver runs: on_policy (RayPPOTrainer, rollout colocated with the actor); '
                    'one_step_off_policy (verl one_step_off_policy: standalone rollout workers generate step k+1 '
                    'while step k updates, staleness 1); fully_async (refused: not built yet)',
                    choices=('on_policy', 'one_step_off_policy', 'fully_async'), ours=True)
    one_step_overlap: bool = key(True, 'one_step_off_policy: generate the next batch during the update (staleness 1); '
                                 'false = generate after the weight sync (staleness 0, the on-policy run exactly)',
                                 ours=True)
    staleness_threshold: float = key(0.1, 'fully async: maximum sample staleness', only=None, why=FULLY_ASYNC_WHY)
    trigger_parameter_sync_step: int = key(4, 'fully async: trainer steps between parameter syncs', only=None,
                                           why=FULLY_ASYNC_WHY)
    require_batches: int = key(1, 'fully async: ppo mini-batches the trainer takes at once', only=None,
                               why=FULLY_ASYNC_WHY)
    partial_rollout: bool = key(True, 'fully async: resume interrupted generation after a parameter sync',
                                only=None, why=FULLY_ASYNC_WHY)
    use_trainer_do_validate: bool = key(False, 'fully async: validate in the trainer', only=None, why=FULLY_ASYNC_WHY)
    use_dynamic_resource_scheduling: bool = key(False, 'fully async: hybrid rollout replicas on trainer devices',
                                                only=None, why=FULLY_ASYNC_WHY)
    dynamic_schedule_policy: str = key('default', 'fully async: name of the dynamic scheduling policy', only=None,
                                       why=FULLY_ASYNC_WHY)
    dynamic_schedule_deactivate_ratio: float = key(0.3, 'fully async: buffered-sample ratio that deactivates hybrid '
                                                   'replicas', only=None, why=FULLY_ASYNC_WHY)
    dynamic_schedule_enable_rebalance: bool = key(True, 'fully async: rebalance in-flight requests onto activated '
                                                  'replicas', only=None, why=FULLY_ASYNC_WHY)
    concurrent_samples_per_replica: int = key(16, 'fully async: concurrent generation requests per replica',
                                              only=None, why=FULLY_ASYNC_WHY)

    def __post_init__(self) -> None:
        check_section([f"{{section}}.mode=fully_async: {FULLY_ASYNC_WHY}; use mode=one_step_off_policy "
                       "(staleness 1) or on_policy."] if self.mode == "fully_async" else [])
