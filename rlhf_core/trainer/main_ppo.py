"""``rlhf ppo key=value ...`` (verl's ``python -m verl.trainer.main_ppo``).

Choice: the driver runs **in-process** (not as a ``num_cpus=0`` Ray task like verl's ``TaskRunner``). It only
holds batches and scalars; the models live in Ray worker actors. Running in-process keeps tracebacks, logging
and the return value direct for the CLI and the Prefect tasks, and costs no extra Ray process.

Worker placement: ``trainer.nnodes × trainer.n_gpus_per_node`` ranks per group — the actor/rollout(/ref) group,
plus a critic group when ``critic.enable`` (null: when ``algorithm.adv_estimator == gae``) and a reward-model
group (``"rm"``) when ``reward_model.enable``. On GPUs the groups share each GPU (fractional
``num_gpus``); on CPU the cluster's CPUs are split fractionally so that both groups fit
(``min(1, CPUs ÷ (ranks × groups))`` per worker). That reservation is not the thread count: the roles run one
after another, so each rank runs ``CPUs of its node ÷ ranks on it`` intra-op threads (:func:`worker_threads`), or
the role's ``fsdp_config.cpu_threads`` (ours) where a user splits the cores between roles.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

import ray
from omegaconf import DictConfig, OmegaConf

from rlhf_core.config import ConfigError, validate_ppo_config
from rlhf_core.config.notices import engine_errors
from rlhf_core.agent.registry import check_datasets
from rlhf_core.config.validate import use_critic as critic_in_use
from rlhf_core.data import DataError
from rlhf_core.data.factory import create_rl_dataset
from rlhf_core.distributed.ray_init import init_ray, ppo_ray_extra, write_ray_timeline
from rlhf_core.distributed.worker_group import RayWorkerGroup
from rlhf_core.models.kv_cache import check_rollout_kv_cache
from rlhf_core.models.hub import check_hub_models, ppo_model_keys
from rlhf_core.models.loading import check_local_path, load_tokenizer, local_path, model_tokenizer_path
from rlhf_core.models.lora import check_lora_adapter
from rlhf_core.models.preflight import check_model_files, require_chat_template
from rlhf_core.reward import load_reward_manager, reward_function_from_config
from rlhf_core.reward.genrm import check_genrm, genrm_enabled
from rlhf_core.workers.genrm_server import genrm_kwargs, start_genrm
from rlhf_core.workers.teacher import check_teachers
from rlhf_core.reward.scorers import UnknownDataSourceError, check_default_data_source
from rlhf_core.reward.scorers.sandbox_fusion import sandbox_from_config
from rlhf_core.storage import unwritable_output
from rlhf_core.distributed.threads import threads_per_rank
from rlhf_core.trainer.checkpoint_callback import check_checkpoint_callback
from rlhf_core.trainer.commands import ppo_main
from rlhf_core.trainer.ppo_trainer import RayPPOTrainer
from rlhf_core.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from rlhf_core.workers.reward_model import RewardModelWorker

logger = logging.getLogger(__name__)


def need_reference_policy(config: DictConfig) -> bool:
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def resolve_device(config: DictConfig) -> str:
    """``trainer.device``: ``auto`` → ``cuda`` when the Ray cluster has GPUs, else ``cpu``."""
    device = str(config.trainer.device)
    if device != "auto":
        return device
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def worker_resources(config: DictConfig, n_groups: int) -> tuple[float, float]:
    """(num_cpus_per_worker, num_gpus_per_worker) so that ``n_groups`` groups of ranks fit the cluster."""
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    if resolve_device(config) == "cuda":
        return 1.0 / n_groups, 1.0 / n_groups
    cpus = float(ray.cluster_resources().get("CPU", 1))
    per = min(1.0, cpus / (world * n_groups))
    return max(0.01, int(per * 100) / 100), 0.0


def worker_threads(config: DictConfig, cpu_threads: int | None) -> int:
    """Intra-op threads per rank of one group: ``cpu_threads`` (a role's ``fsdp_config.cpu_threads``) when set,
    else the CPUs of a node (Ray's count, which ``ray_init.num_cpus`` sets) ÷ ``trainer.n_gpus_per_node``."""

    return threads_per_rank(ray.cluster_resources().get("CPU", 1), int(config.trainer.nnodes),
                            int(config.trainer.n_gpus_per_node), cpu_threads)


TIMEOUT_KEY = "trainer.ray_wait_register_center_timeout"


def build_worker_groups(config: DictConfig) -> dict[str, Any]:
    """The Ray worker groups for this config: ``actor_rollout`` (role actor_rollout_ref when a reference policy
    is needed), ``critic`` when ``critic.enable`` (null: for GAE) and ``rm`` (``RewardModelWorker``) when
    ``reward_model.enable``, unless the reward model is a generative one (:func:`~rlhf_core.reward.genrm.
    genrm_enabled`: served to the reward function instead).

    ``trainer.ray_wait_register_center_timeout`` (seconds) bounds the wait for each group's placement group
    (per placement strategy) and for its actors to start. Raises ``TimeoutError`` naming that key; groups
    already built are shut down first."""
    use_critic = critic_in_use(config)  # critic.enable; null = only for gae
    use_rm = bool(config.reward_model.enable) and not genrm_enabled(config)
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    cpus, gpus = worker_resources(config, 1 + int(use_critic) + int(use_rm))
    role = "actor_rollout_ref" if need_reference_policy(config) else "actor_rollout"
    timeout = float(config.trainer.ray_wait_register_center_timeout)
    specs = [("actor_rollout", ActorRolloutRefWorker, {"config": config, "role": role}, "actor",
              config.actor_rollout_ref.actor.fsdp_config.cpu_threads)]
    collective_timeout = {"actor_rollout": float(config.actor_rollout_ref.nccl_timeout)}  # verl: the actor's only
    if use_critic:
        specs.append(("critic", CriticWorker, {"config": config}, "critic", config.critic.fsdp.cpu_threads))
    if use_rm:
        specs.append(("rm", RewardModelWorker, {"config": config}, "rm",
                      config.reward_model.model.fsdp_config.cpu_threads))
    wgs: dict[str, Any] = {}
    for key, cls, kwargs, prefix, cpu_threads in specs:
        try:
            wgs[key] = RayWorkerGroup(cls, world, kwargs, num_cpus_per_worker=cpus, num_gpus_per_worker=gpus,
                                      name_prefix=prefix, pg_timeout_s=timeout, ready_timeout_s=timeout,
                                      num_threads=worker_threads(config, cpu_threads), nnodes=int(config.trainer.nnodes),
                                      collective_timeout_s=collective_timeout.get(key))
        except TimeoutError as exc:
            for wg in wgs.values():
                wg.shutdown()
            raise TimeoutError(f"{exc} — raise {TIMEOUT_KEY} (now {timeout:g} s) if the cluster is only slow "
                               f"to start") from exc
    return wgs


def build_datasets(config: DictConfig, tokenizer: Any) -> tuple[Any, Any]:
    """The training and validation datasets, checked before Ray starts.

    Raises:
        DataError: a bad file or row (see :class:`~rlhf_core.data.rl_dataset.RLHFDataset`), fewer training rows
            than ``data.train_batch_size``, or a row without the ground truth the default scorer needs or with a
            data source it has no scorer for.
    """
    data = config.data
    train = create_rl_dataset(list(_as_list(data.train_files)), tokenizer, data,
                              max_samples=int(data.train_max_samples))
    if len(train) < int(data.train_batch_size):  # the loader drops the last partial batch: no step at all
        raise DataError(f"data.train_batch_size={int(data.train_batch_size)} is larger than the {len(train)} training "
                        f"rows of data.train_files={_as_list(data.train_files)} (after train_max_samples and "
                        "filter_overlong_prompts): not one full batch")
    val = None
    if data.val_files:
        val = create_rl_dataset(list(_as_list(data.val_files)), tokenizer, data,
                                max_samples=int(data.val_max_samples), is_train=False)
    if not config.reward_model.enable and not config.custom_reward_function.path:
        has_sandbox = sandbox_from_config(config) is not None
        for ds in (train, val):
            check_rule_reward_inputs(ds, str(data.reward_fn_key), has_sandbox)
    check_datasets(config.actor_rollout_ref.rollout, (train, val))  # agent_name / tools_kwargs name known loops/tools
    return train, val


def check_rule_reward_inputs(dataset: Any, reward_fn_key: str = "data_source", has_sandbox: bool = False) -> None:
    """The default (rule) scorer needs ``reward_model.ground_truth`` on every row and a ``reward_fn_key``
    (``data.reward_fn_key``, default ``data_source``) it has a scorer for
    (:func:`~rlhf_core.reward.scorers.check_default_data_source`; ``has_sandbox``: a Sandbox Fusion url is set,
    which code sources need): check both before Ray starts, instead of at the first reward of a step.

    Datasets without ``rows``/``sources`` (a ``custom_cls``) are left to the reward manager.

    Raises:
        DataError: naming the file and row of the first row without a ground truth or with a data source the
            default scorer does not know.
    """
    rows, sources = getattr(dataset, "rows", None), getattr(dataset, "sources", None)
    if rows is None or sources is None:
        return
    checked: set = set()
    for row, src in zip(rows, sources):
        rm = row.get("reward_model")
        if not isinstance(rm, dict) or rm.get("ground_truth") is None:
            raise DataError(f"{src}: the default reward function needs reward_model.ground_truth, the row has "
                            f"reward_model={rm!r} (set custom_reward_function.path or reward_model.enable to score "
                            "without it)")
        source = row.get(reward_fn_key)
        if source in checked:
            continue
        try:
            check_default_data_source(source, has_sandbox)
        except UnknownDataSourceError as exc:
            raise DataError(f"{src}: {exc}") from None
        checked.add(source)


def driver_tokenizer_path(config: DictConfig) -> str:
    """The tokenizer the driver uses for the datasets and reward managers: ``data.tokenizer`` when set, else the
    actor's (``actor_rollout_ref.model.tokenizer_path``, null = ``model.path``); it is loaded with
    ``data.trust_remote_code`` (verl's ``main_ppo``)."""
    if config.data.tokenizer is not None:
        return str(config.data.tokenizer)
    return model_tokenizer_path(config.actor_rollout_ref.model)


def load_driver_tokenizer(config: DictConfig) -> Any:
    """The driver's tokenizer (:func:`driver_tokenizer_path`); a tokenizer class shipped as code in that folder
    (``auto_map``) is used only with ``data.trust_remote_code`` (else transformers falls back to a built-in one).
    ``actor_rollout_ref.model.custom_chat_template`` replaces its chat template, as in the workers: the prompts
    are rendered in the format the actor is trained on."""
    from rlhf_core.models.loading import load_tokenizer, local_path

    return load_tokenizer(local_path(driver_tokenizer_path(config)), bool(config.data.trust_remote_code),
                          config.actor_rollout_ref.model.custom_chat_template)


def check_model_paths(config: DictConfig) -> None:
    """Refuse, before Ray starts, a local model path that does not exist for a role this config builds:
    ``actor_rollout_ref.model.path``, ``critic.model.path`` and ``critic.model.tokenizer_path`` when the critic is
    in use (``critic.enable``; null = for GAE) and ``reward_model.model.path`` when ``reward_model.enable``
    (:func:`~rlhf_core.models.loading.check_local_path`), or a model folder without ``config.json`` or with
    missing or truncated weights (:func:`~rlhf_core.models.preflight.check_model_files`); a hub id (these keys and
    ``data.tokenizer``) that cannot be loaded here: offline and not cached, or the hub unreachable
    (:func:`~rlhf_core.models.hub.check_hub_model`); a local ``lora_adapter_path`` of the actor (and of the
    critic in use) that holds no adapter or contradicts the LoRA keys (:func:`~rlhf_core.models.lora.
    check_lora_adapter`). Remote URLs are left to the loaders.

    Raises:
        FileNotFoundError: naming the key, its value and the expanded path (the first missing one).
        ConfigError: naming the key, its value and the missing or truncated file, or the hub id and what to do.
        ValueError: naming ``lora_adapter_path`` and the LoRA key its adapter contradicts.
    """
    keys = ppo_model_keys(config)
    for key in keys:
        path = str(OmegaConf.select(config, key))
        try:
            check_local_path(path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{key}={path!r}: {exc}") from None
        if not key.endswith(("tokenizer_path", "hf_config_path")):  # a tokenizer / config.json only: no weights
            check_model_files(key, path)
    check_hub_models(config, keys + ["data.tokenizer"])  # a hub id that cannot load here: one line, in seconds
    roles = [config.actor_rollout_ref.model] + ([config.critic.model] if "critic.model.path" in keys else [])
    for model_cfg in roles:
        if model_cfg.lora_adapter_path is not None and "://" not in str(model_cfg.lora_adapter_path):
            check_lora_adapter(model_cfg)


def check_chat_template(config: DictConfig, tokenizer: Any) -> None:
    """The built-in dataset renders every prompt (a chat message list, ``data.prompt_key``) with the driver
    tokenizer's chat template, as do the workers: refuse a tokenizer without one before the data is read. A
    ``data.custom_cls`` dataset is left to itself.

    Raises:
        ConfigError: naming the tokenizer's key and path and ``data.prompt_key``.
    """
    if config.data.custom_cls.path:
        return
    key = "data.tokenizer" if config.data.tokenizer is not None else "actor_rollout_ref.model.path"
    require_chat_template(tokenizer, f"{key}={driver_tokenizer_path(config)!r}",
                          f"the prompts (data.prompt_key={config.data.prompt_key!r}) are chat messages rendered with "
                          "it; add a chat template to that folder or set data.tokenizer to a tokenizer that has one")


def make_trainer(config: DictConfig, *args: Any) -> RayPPOTrainer:
    """The driver ``async_training.mode`` names, on the Ray worker groups it needs: ``on_policy`` →
    :class:`RayPPOTrainer`; ``one_step_off_policy`` → :class:`~rlhf_core.trainer.one_step_off_policy.
    OneStepOffPolicyTrainer`; ``fully_async`` → :class:`~rlhf_core.trainer.fully_async.FullyAsyncTrainer` (the same
    worker groups). ``args``: the trainer's ``tokenizer, reward_fn, val_reward_fn, train_dataset, val_dataset``."""
    if config.async_training.mode == "fully_async":
        from rlhf_core.trainer.fully_async import FullyAsyncTrainer
        from rlhf_core.trainer.one_step_off_policy import build_one_step_worker_groups

        tokenizer, *rest = args
        return FullyAsyncTrainer(config, tokenizer, build_one_step_worker_groups, *rest)
    if config.async_training.mode == "one_step_off_policy":
        from rlhf_core.trainer.one_step_off_policy import OneStepOffPolicyTrainer, build_one_step_worker_groups

        tokenizer, *rest = args
        return OneStepOffPolicyTrainer(config, tokenizer, build_one_step_worker_groups, *rest)
    tokenizer, *rest = args
    return RayPPOTrainer(config, tokenizer, build_worker_groups, *rest)


def ray_extra(config: DictConfig) -> dict:
    """``ray.init`` arguments beyond the declared ones: ``ray_kwargs.ray_init``, with the environment of
    ``rollout.full_determinism`` in every worker's ``runtime_env``
    (:func:`rlhf_core.distributed.ray_init.ppo_ray_extra`, which the pipeline's stages use too)."""
    return ppo_ray_extra(config)


def run_ppo(config: DictConfig) -> dict[str, Any]:
    """Validate ``config``, start Ray, build everything, train; returns
    ``{"metrics": last step's metrics, "global_step": int, "checkpoint_dir": str | None,
    "worker_nodes": the Ray node id of each actor rank}``.

    Raises:
        ValueError: from config validation (before any model is loaded; a ConfigError also when the package of
            ``rollout.name`` is not importable, or when ``trainer.default_local_dir`` is on a read-only file system
            or not writable) or a bad ``resume_from_path``.
        FileNotFoundError: a role's local model path that does not exist (:func:`check_model_paths`), before Ray.
        ConfigError: before Ray, a model folder with missing or truncated weights (:func:`check_model_paths`), a
            tokenizer without a chat template (:func:`check_chat_template`), or a rollout KV cache that cannot fit
            (:func:`~rlhf_core.models.kv_cache.check_rollout_kv_cache`).
        DataError: before Ray, a bad data file or fewer training rows than one batch (:func:`build_datasets`).
        ConfigError: before Ray, a ``trainer.checkpoint_callback_class`` file that is missing or fails to import,
            or that has no such class (:func:`~rlhf_core.trainer.checkpoint_callback.check_checkpoint_callback`).
        ConfigError: before any model loads, a generative reward model whose judge is not a causal LM or whose
            reward function lacks ``reward_router_address``/``reward_model_tokenizer``
            (:func:`~rlhf_core.reward.genrm.check_genrm`).

    A generative reward model (:func:`~rlhf_core.reward.genrm.genrm_enabled`) is served on ``127.0.0.1`` from just
    before the reward managers are built until the run ends (:func:`~rlhf_core.reward.genrm.start_genrm`).
    """
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    validate_ppo_config(config, world)
    if engine_errors(config):  # a rollout engine that is not installed fails here in one line, before anything loads
        raise ConfigError(engine_errors(config)[0])
    # cheap, local checks first (output folder, model paths, tokenizer, data files, reward function), then Ray
    unwritable = unwritable_output("trainer.default_local_dir", str(config.trainer.default_local_dir))
    if unwritable:  # the lock, metrics.jsonl and checkpoints go there: refuse a read-only place before Ray
        raise ConfigError(unwritable)
    check_model_paths(config)
    check_teachers(config)  # distillation: each teacher's folder and its tokenizer vocabulary (= the student's)
    use_genrm = genrm_enabled(config)
    if use_genrm:  # the judge and the function's signature, before any model loads
        check_genrm(config, reward_function_from_config(config))
    tokenizer = load_driver_tokenizer(config)
    check_chat_template(config, tokenizer)
    train_ds, val_ds = build_datasets(config, tokenizer)
    check_rollout_kv_cache(config, None if val_ds is None else len(val_ds))
    check_checkpoint_callback(config)  # trainer.checkpoint_callback_class: the file and its class, before Ray
    genrm = start_genrm(config) if use_genrm else None
    try:
        return _train(config, tokenizer, train_ds, val_ds, None if genrm is None else genrm_kwargs(genrm))
    finally:
        if genrm is not None:
            genrm.stop()


def _train(config: DictConfig, tokenizer: Any, train_ds: Any, val_ds: Any, fn_kwargs: dict | None) -> dict[str, Any]:
    """:func:`run_ppo` once its checks passed: the reward managers (``fn_kwargs``: a generative reward model's
    arguments to the reward function), Ray, the trainer, ``fit``."""
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0, reward_fn_kwargs=fn_kwargs)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, reward_fn_kwargs=fn_kwargs)
    init_ray(config.ray_init.address, config.ray_init.num_cpus, config.ray_kwargs.ray_init.runtime_env.py_executable,
             ray_extra(config))
    trainer = make_trainer(config, tokenizer, reward_fn, val_reward_fn, train_ds, val_ds)
    try:
        metrics = trainer.fit()
        actor_wg = trainer.wgs["actor_rollout"]
        nodes = actor_wg.node_ids() if hasattr(actor_wg, "node_ids") else []
    finally:
        try:
            write_ray_timeline(config.ray_init.timeline_json_file)  # = ray_kwargs.timeline_json_file
        finally:
            trainer.shutdown()
    return {"metrics": metrics, "global_step": trainer.global_steps, "checkpoint_dir": trainer.last_checkpoint_dir,
            "worker_nodes": nodes}


main = ppo_main  # `rlhf ppo` / `python -m rlhf_core.trainer.main_ppo`: parsed before this module is imported


def _as_list(value: Any) -> list:
    return [value] if isinstance(value, str) else list(value)


if __name__ == "__main__":
    sys.exit(main())
