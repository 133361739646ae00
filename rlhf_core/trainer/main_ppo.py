"""``rlhf ppo key=value ...`` (verl's ``python -m verl.trainer.main_ppo``).

Choice: the driver runs **in-process** (not as a ``num_cpus=0`` Ray task like verl's ``TaskRunner``). It only
holds batches and scalars; the models live in Ray worker actors. Running in-process keeps tracebacks, logging
and the return value direct for the CLI and the Prefect tasks, and costs no extra Ray process.

Worker placement: ``trainer.nnodes × trainer.n_gpus_per_node`` ranks per group — the actor/rollout(/ref) group,
plus a critic group when ``algorithm.adv_estimator == gae`` and a reward-model group (``"rm"``) when
``reward_model.enable``. On GPUs the groups share each GPU (fractional
``num_gpus``); on CPU the cluster's CPUs are split fractionally so that both groups fit
(``min(1, CPUs ÷ (ranks × groups))`` per worker).
"""
from __future__ import annotations

import logging
import sys
from typing import Any

from omegaconf import DictConfig

from rlhf_core.trainer.ppo_trainer import RayPPOTrainer

logger = logging.getLogger(__name__)


def need_reference_policy(config: DictConfig) -> bool:
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def resolve_device(config: DictConfig) -> str:
    """``trainer.device``: ``auto`` → ``cuda`` when the Ray cluster has GPUs, else ``cpu``."""
    import ray

    device = str(config.trainer.get("device", "auto") or "auto")
    if device != "auto":
        return device
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def worker_resources(config: DictConfig, n_groups: int) -> tuple[float, float]:
    """(num_cpus_per_worker, num_gpus_per_worker) so that ``n_groups`` groups of ranks fit the cluster."""
    import ray

    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    if resolve_device(config) == "cuda":
        return 1.0 / n_groups, 1.0 / n_groups
    cpus = float(ray.cluster_resources().get("CPU", 1))
    per = min(1.0, cpus / (world * n_groups))
    return max(0.01, int(per * 100) / 100), 0.0


TIMEOUT_KEY = "trainer.ray_wait_register_center_timeout"


def build_worker_groups(config: DictConfig) -> dict[str, Any]:
    """The Ray worker groups for this config: ``actor_rollout`` (role actor_rollout_ref when a reference policy
    is needed), ``critic`` for GAE and ``rm`` (``RewardModelWorker``) when ``reward_model.enable``.

    ``trainer.ray_wait_register_center_timeout`` (seconds) bounds the wait for each group's placement group
    (per placement strategy) and for its actors to start. Raises ``TimeoutError`` naming that key; groups
    already built are shut down first."""
    from rlhf_core.distributed.worker_group import RayWorkerGroup
    from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    use_critic = config.algorithm.adv_estimator == "gae"
    use_rm = bool(config.get("reward_model") is not None and config.reward_model.get("enable", False))
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    cpus, gpus = worker_resources(config, 1 + int(use_critic) + int(use_rm))
    role = "actor_rollout_ref" if need_reference_policy(config) else "actor_rollout"
    timeout = float(config.trainer.get("ray_wait_register_center_timeout", 300) or 300)
    specs = [("actor_rollout", ActorRolloutRefWorker, {"config": config, "role": role}, "actor")]
    if use_critic:
        specs.append(("critic", CriticWorker, {"config": config}, "critic"))
    if use_rm:
        from rlhf_core.workers.reward_model import RewardModelWorker

        specs.append(("rm", RewardModelWorker, {"config": config}, "rm"))
    wgs: dict[str, Any] = {}
    for key, cls, kwargs, prefix in specs:
        try:
            wgs[key] = RayWorkerGroup(cls, world, kwargs, num_cpus_per_worker=cpus, num_gpus_per_worker=gpus,
                                      name_prefix=prefix, pg_timeout_s=timeout, ready_timeout_s=timeout,
                                      nnodes=int(config.trainer.nnodes))
        except TimeoutError as exc:
            for wg in wgs.values():
                wg.shutdown()
            raise TimeoutError(f"{exc} — raise {TIMEOUT_KEY} (now {timeout:g} s) if the cluster is only slow "
                               f"to start") from exc
    return wgs


def build_datasets(config: DictConfig, tokenizer: Any) -> tuple[Any, Any]:
    from rlhf_core.data.rl_dataset import create_rl_dataset

    data = config.data
    train = create_rl_dataset(list(_as_list(data.train_files)), tokenizer, data,
                              max_samples=int(data.get("train_max_samples", -1) or -1))
    val = None
    if data.get("val_files"):
        val = create_rl_dataset(list(_as_list(data.val_files)), tokenizer, data,
                                max_samples=int(data.get("val_max_samples", -1) or -1))
    if not config.reward_model.get("enable", False) and not config.custom_reward_function.get("path"):
        for ds in (train, val):
            check_rule_reward_inputs(ds)
    return train, val


def check_rule_reward_inputs(dataset: Any) -> None:
    """The default (rule) scorer needs ``reward_model.ground_truth`` on every row: check it before Ray starts.

    Datasets without ``rows``/``sources`` (a ``custom_cls``) are left to the reward manager.

    Raises:
        DataError: naming the file and row of the first row without a ground truth.
    """
    from rlhf_core.data import DataError

    rows, sources = getattr(dataset, "rows", None), getattr(dataset, "sources", None)
    if rows is None or sources is None:
        return
    for row, src in zip(rows, sources):
        rm = row.get("reward_model")
        if not isinstance(rm, dict) or rm.get("ground_truth") is None:
            raise DataError(f"{src}: the default reward function needs reward_model.ground_truth, the row has "
                            f"reward_model={rm!r} (set custom_reward_function.path or reward_model.enable to score "
                            "without it)")


def run_ppo(config: DictConfig) -> dict[str, Any]:
    """Validate ``config``, start Ray, build everything, train; returns
    ``{"metrics": last step's metrics, "global_step": int, "checkpoint_dir": str | None,
    "worker_nodes": the Ray node id of each actor rank}``.

    Raises:
        ValueError: from config validation (before any model is loaded) or a bad ``resume_from_path``.
    """
    from rlhf_core.config import validate_ppo_config
    from rlhf_core.distributed.ray_init import init_ray
    from rlhf_core.models.loading import load_tokenizer, local_path
    from rlhf_core.reward import load_reward_manager

    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    validate_ppo_config(config, world)
    # cheap, local checks first (model path, tokenizer, data files, reward function), then Ray
    model_cfg = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(local_path(str(model_cfg.path)), bool(model_cfg.get("trust_remote_code", False)))
    train_ds, val_ds = build_datasets(config, tokenizer)
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1)
    ray_cfg = config.get("ray_init") or {}
    init_ray(ray_cfg.get("address"), ray_cfg.get("num_cpus"))
    trainer = RayPPOTrainer(config, tokenizer, build_worker_groups, reward_fn, val_reward_fn, train_ds, val_ds)
    try:
        metrics = trainer.fit()
        actor_wg = trainer.wgs["actor_rollout"]
        nodes = actor_wg.node_ids() if hasattr(actor_wg, "node_ids") else []
    finally:
        trainer.shutdown()
    return {"metrics": metrics, "global_step": trainer.global_steps, "checkpoint_dir": trainer.last_checkpoint_dir,
            "worker_nodes": nodes}


def main(argv: list[str] | None = None) -> int:
    """``rlhf ppo key=value ...``: load ``ppo_trainer`` with the overrides and run; returns the exit code."""
    from rlhf_core.config import load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print("usage: rlhf ppo [key=value ...]   verl's ppo_trainer.yaml keys, e.g.\n"
              "  rlhf ppo data.train_files=train.parquet actor_rollout_ref.model.path=MODEL "
              "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4\n"
              "`rlhf config show` prints every key; `rlhf config check [overrides]` validates without training.")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config("ppo_trainer", argv)
    result = run_ppo(config)
    print(f"ppo finished at global step {result['global_step']}; checkpoint: {result['checkpoint_dir']}")
    return 0


def _as_list(value: Any) -> list:
    return [value] if isinstance(value, str) else list(value)


if __name__ == "__main__":
    sys.exit(main())
