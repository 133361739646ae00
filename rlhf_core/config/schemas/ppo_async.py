"""verl 0.9's off-policy trainers: the top-level ``rollout`` section (standalone rollout workers, from verl's
``one_step_off_ppo_trainer.yaml`` / ``fully_async_ppo_trainer.yaml``) and ``async_training``.

verl picks these trainers by entry module (``python -m verl.experimental.one_step_off_policy.main_ppo``); ours
picks them with ``async_training.mode`` (ours) on ``rlhf ppo``. The one-step off-policy trainer is
``rlhf_core.trainer.one_step_off_policy``; the fully asynchronous trainer (a minimal version, docs/OFF_POLICY.md) is
``rlhf_core.trainer.fully_async``: ``staleness_threshold``, ``trigger_parameter_sync_step``, ``require_batches``,
``partial_rollout`` and ``concurrent_samples_per_replica`` are read; its other keys are accepted at verl's defaults
only.
"""

from dataclasses import dataclass

from rlhf_core.config.spec import check_section, key

FULLY_ASYNC_WHY = ("the fully asynchronous trainer here is a minimal version of verl's fully_async_policy "
                   "(docs/OFF_POLICY.md) without dynamic resource scheduling")


# verl 0.9: off-policy trainers (one-step / fully async)
@dataclass
class StandaloneRolloutConfig:
    """``rollout`` (top level): the rollout workers apart from the trainer's (verl's one-step and fully async
    configs); read only when ``async_training.mode`` is not ``on_policy``."""

    nnodes: int = key(1, 'nodes of the standalone rollout workers (async_training.mode=one_step_off_policy or '
                      'fully_async)')
    n_gpus_per_node: int = key(8, 'rollout ranks per node (on CPU: worker processes per node) of the standalone '
                               'rollout workers (async_training.mode=one_step_off_policy or fully_async)')
    total_rollout_steps: int = key(100, 'fully async: total rollout samples (prompts) generated; the trainer runs at '
                                   'most total_rollout_steps // (ppo_mini_batch_size × require_batches) steps')

    def __post_init__(self) -> None:
        check_section([f"{{section}}.{k} must be >= 1, got {v}." for k, v in
                       (("nnodes", self.nnodes), ("n_gpus_per_node", self.n_gpus_per_node))
                       if isinstance(v, int) and v < 1])


@dataclass
class AsyncTrainingConfig:
    """``async_training``: verl's fully async keys, plus ``mode``/``one_step_overlap`` (ours) choosing the trainer."""

    mode: str = key('on_policy', 'which PPO driver runs: on_policy (RayPPOTrainer, rollout colocated with the actor); '
                    'one_step_off_policy (verl one_step_off_policy: standalone rollout workers generate step k+1 '
                    'while step k updates, staleness 1); fully_async (verl fully_async_policy: a rollouter thread '
                    'generates into a bounded queue, staleness bounded by staleness_threshold)',
                    choices=('on_policy', 'one_step_off_policy', 'fully_async'), ours=True)
    one_step_overlap: bool = key(True, 'one_step_off_policy: generate the next batch during the update (staleness 1); '
                                 'false = generate after the weight sync (staleness 0, the on-policy run exactly)',
                                 ours=True)
    staleness_threshold: float = key(0.1, 'fully async: samples generated between two parameter syncs are at most '
                                     'required × (1 + staleness_threshold) × trigger_parameter_sync_step (verl\'s '
                                     'max_required_samples); 0 with trigger 1 is on-policy')
    trigger_parameter_sync_step: int = key(4, 'fully async: trainer steps between parameter syncs (weight pushes)')
    require_batches: int = key(1, 'fully async: ppo mini-batches the trainer takes per step (required samples = '
                               'ppo_mini_batch_size × require_batches)')
    partial_rollout: bool = key(True, 'fully async: a parameter sync interrupts the chunk being generated at a token '
                                'boundary, loads the new weights and resumes the open responses from prompt + '
                                'prefix (each token\'s rollout log-prob from the weights that sampled it; '
                                'fully_async/partial/* metrics; agent loops: the load lands between two decoding '
                                'steps and the open trajectories go on); False: the sync waits for the chunk')
    use_trainer_do_validate: bool = key(False, "fully async: validate on the trainer's actor group (it gets a "
                                        "colocated rollout engine) with the actor's current weights, while the "
                                        "rollouter goes on generating; False: on the rollout group, with its weights")
    use_dynamic_resource_scheduling: bool = key(False, 'fully async: hybrid rollout replicas on trainer devices',
                                                only=None, why=FULLY_ASYNC_WHY)
    dynamic_schedule_policy: str = key('default', 'fully async: name of the dynamic scheduling policy', only=None,
                                       why=FULLY_ASYNC_WHY)
    dynamic_schedule_deactivate_ratio: float = key(0.3, 'fully async: buffered-sample ratio that deactivates hybrid '
                                                   'replicas', only=None, why=FULLY_ASYNC_WHY)
    dynamic_schedule_enable_rebalance: bool = key(True, 'fully async: rebalance in-flight requests onto activated '
                                                  'replicas', only=None, why=FULLY_ASYNC_WHY)
    concurrent_samples_per_replica: int = key(16, 'fully async: prompts (each with its rollout.n responses) a rollout '
                                              'rank generates at once: the rollouter cuts each loader batch into '
                                              'sub-batches of min(rollout.nnodes × rollout.n_gpus_per_node × this, '
                                              'ppo_mini_batch_size × require_batches) prompts and queues each '
                                              'prompt\'s group as soon as its sub-batch is done, so a parameter sync '
                                              'between two sub-batches gives one step groups of two versions (verl\'s '
                                              'max_concurrent_samples = replicas × this, capped at '
                                              'max_required_samples)')

