"""The SFT driver (verl's ``fsdp_sft_trainer``): epochs of global batches, validation, checkpoints, final HF model.

Workers: ``trainer.nnodes × trainer.n_gpus_per_node`` ranks of :class:`~rlhf_core.trainer.sft_worker.SFTWorker`
— one rank runs **in-process** (``LocalWorkerGroup``: no Ray start-up, same FSDP2 code path), more ranks run on
Ray (``RayWorkerGroup``). The driver holds the dataloaders, splits each global batch of ``data.train_batch_size``
samples over the ranks, and logs ``train/loss``, ``train/lr`` (the LR the update ran at), ``val/loss``.

Checkpoints: ``<default_local_dir>/global_step_<N>/{actor/, data.pt}`` + the tracker file, via the same
:class:`~rlhf_core.trainer.checkpoint_manager.CheckpointManager` as PPO (``resume_mode`` auto/disable/resume_path,
``max_ckpt_to_keep``). At the end rank 0 writes ``<default_local_dir>/hf_model`` — a plain Hugging Face directory
(config, tokenizer, full weights, LoRA merged) that PPO can start from.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import ray
from omegaconf import DictConfig

from rlhf_core.config import ConfigError, validate_sft_config
from rlhf_core.data import DataError
from rlhf_core.data.loader import build_dataloader
from rlhf_core.data.rl_dataset import collate_fn
from rlhf_core.data.sft_dataset import create_sft_dataset
from rlhf_core.distributed.ray_init import init_ray
from rlhf_core.distributed.threads import threads_per_rank
from rlhf_core.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup
from rlhf_core.models.hub import check_hub_model
from rlhf_core.models.loading import check_local_path, load_tokenizer
from rlhf_core.models.lora import check_lora_adapter
from rlhf_core.models.preflight import check_model_files, require_chat_template
from rlhf_core.progress import progress
from rlhf_core.protocol import Batch
from rlhf_core.storage import unwritable_output
from rlhf_core.trainer.commands import sft_main
from rlhf_core.trainer.checkpoint_manager import CheckpointManager, parse_global_step
from rlhf_core.trainer.driver_utils import balance_batch, mean_rank_metrics
from rlhf_core.trainer.metrics_file import prepare_metrics_file
from rlhf_core.trainer.sft_worker import SFTWorker, sft_tokenizer_path
from rlhf_core.trainer.tracking import Tracking

logger = logging.getLogger(__name__)


def sft_collate(items: list[dict]) -> Batch:
    return collate_fn(items)


class SFTTrainer:
    """Args: ``config`` (``sft_trainer``), ``train_dataset``/``val_dataset`` (``SFTDataset``-like),
    ``tracker`` (``log(data, step)``; ``None`` → from ``trainer.logger``)."""

    def __init__(self, config: DictConfig, train_dataset: Any, val_dataset: Any = None, tracker: Any = None):
        self.config = config
        t, data = config.trainer, config.data
        self.world_size = int(t.nnodes) * int(t.n_gpus_per_node)
        seed = None if t.seed is None else int(t.seed)  # an explicit 0 stays 0
        workers = int(data.num_workers)  # DataLoader worker processes reading the samples (verl: num_workers)
        self.train_loader = build_dataloader(train_dataset, int(data.train_batch_size), shuffle=True, seed=seed,
                                             drop_last=True, collate_fn=sft_collate, num_workers=workers)
        self.val_loader = None
        if val_dataset is not None and len(val_dataset):
            bs = min(int(data.train_batch_size), len(val_dataset))
            bs -= bs % self.world_size
            self.val_loader = build_dataloader(val_dataset, max(bs, self.world_size), shuffle=False, seed=seed,
                                               drop_last=True, collate_fn=sft_collate, num_workers=workers)
        steps_per_epoch = len(self.train_loader)
        given = t.total_training_steps
        self.total_steps = int(given) if given is not None else steps_per_epoch * int(t.total_epochs)
        if self.total_steps <= 0:
            raise ValueError(f"SFT has 0 training steps: {len(train_dataset)} samples, "
                             f"data.train_batch_size={data.train_batch_size}")
        self.checkpoints = CheckpointManager(t.default_local_dir, t.default_hdfs_dir, t.max_ckpt_to_keep, None)
        self.tracker = tracker
        self.global_step = 0
        self.wg = None
        self._profiling = False  # the workers profile (trainer.profile_interval)

    def init_workers(self) -> None:
        kwargs = {"config": self.config, "total_steps": self.total_steps}
        if self.world_size == 1:
            self.wg = LocalWorkerGroup(SFTWorker, kwargs)
        else:
            init_ray(self.config.ray_init.address, self.config.ray_init.num_cpus)
            gpus = 1.0 if str(self.config.trainer.device) != "cpu" and _cluster_has_gpu() else 0.0
            t = self.config.trainer
            threads = threads_per_rank(ray.cluster_resources().get("CPU", 1), int(t.nnodes), int(t.n_gpus_per_node),
                                       self.config.model.fsdp_config.cpu_threads)
            self.wg = RayWorkerGroup(SFTWorker, self.world_size, kwargs, num_cpus_per_worker=1,
                                     num_gpus_per_worker=gpus, name_prefix="sft", num_threads=threads)
        self.wg.execute_all("init_model")

    def fit(self) -> dict[str, Any]:
        """Train; returns ``{"metrics": last metrics, "global_step": N, "hf_model_dir": str,
        "checkpoint_dir": str | None}``."""
        self.checkpoints.lock.acquire()  # before any worker: a second run on default_local_dir stops here
        t = self.config.trainer
        resume_from = self.checkpoints.resolve_resume(t.resume_mode, t.resume_from_path, ("actor",))
        if self.wg is None:
            self.init_workers()
        if self.tracker is None:  # its metrics file without the steps this run logs again (metrics_file)
            prepare_metrics_file(self.config, None if resume_from is None else parse_global_step(resume_from))
            self.tracker = Tracking(t.project_name, t.experiment_name, t.logger, config=self.config)
        last_ckpt = self._resume(resume_from)
        steps_per_epoch = len(self.train_loader)
        save_freq, test_freq = _freq(t.save_freq, steps_per_epoch), _freq(t.test_freq, steps_per_epoch)
        metrics: dict[str, float] = {}
        n_epochs = -(-self.total_steps // steps_per_epoch)
        start_epoch = self.global_step // steps_per_epoch
        for epoch in range(start_epoch, n_epochs):
            for batch in progress(self.train_loader, f"SFT epoch {epoch + 1}/{n_epochs}", unit="step"):
                if self.global_step >= self.total_steps:
                    break
                self.global_step += 1
                is_last = self.global_step >= self.total_steps
                self._profile(start=True)
                metrics = mean_rank_metrics(self.wg.execute_dp("train_step", self.balanced(batch)))
                self._profile(start=False, last=is_last)
                metrics["train/epoch"] = epoch
                if self.val_loader is not None and (is_last or (test_freq > 0 and self.global_step % test_freq == 0)):
                    metrics.update(self.validate())
                self.tracker.log(metrics, step=self.global_step)
                if is_last or (save_freq > 0 and self.global_step % save_freq == 0):
                    last_ckpt = self.save_checkpoint()
        hf_dir = os.path.join(str(t.default_local_dir), "hf_model")
        self.wg.execute_all("save_hf_model", hf_dir)
        return {"metrics": metrics, "global_step": self.global_step, "hf_model_dir": hf_dir,
                "checkpoint_dir": last_ckpt}

    def _profile(self, start: bool, last: bool = False) -> None:
        """verl's ``trainer.profile_interval = [first, last]``: the workers start profiling before step ``first``
        and stop (writing the trace, then the finish hook) after step ``last``, or after the run's last step
        when it ends inside the interval (a run resumed inside it does not profile, as verl). The workers record only with ``profiler.enable`` (and their rank
        chosen); ``[-1, -1]`` profiles nothing."""
        first, end = (int(v) for v in self.config.trainer.profile_interval)
        if first < 1:
            return
        if start and self.global_step == first:
            self.wg.execute_all("start_profile", first)
            self._profiling = True
        elif not start and self._profiling and (self.global_step == end or last):
            self.wg.execute_all("stop_profile", True)
            self._profiling = False

    def balanced(self, batch: Batch) -> Batch:
        """``trainer.balance_batch`` (verl 0.9's ``sft_trainer_ray``): the rows reordered so that each rank's
        contiguous share of the global batch holds a similar number of tokens
        (:func:`~rlhf_core.trainer.driver_utils.balance_batch`); off, or with one rank, ``batch`` as it is."""
        if not self.config.trainer.balance_batch or self.world_size <= 1:
            return batch
        return balance_batch(batch, self.world_size)[0]

    def validate(self) -> dict[str, float]:
        """``val/loss``: token-mean over the validation set (mean of per-batch token-means, like verl)."""
        losses = [mean_rank_metrics(self.wg.execute_dp("eval_step", b))["val/loss"] for b in self.val_loader]
        return {"val/loss": sum(losses) / len(losses)} if losses else {}

    def save_checkpoint(self) -> str:
        fns = {"actor": lambda p: self.wg.execute_all("save_checkpoint", p)}
        return self.checkpoints.save(self.global_step, fns, self.train_loader.state_dict())

    def _resume(self, path: str | None) -> str | None:
        """Load the complete checkpoint ``path`` chosen before the workers started (None: a fresh run)."""
        if path is None:
            return None
        self.global_step = parse_global_step(path)
        self.wg.execute_all("load_checkpoint", os.path.join(path, "actor"))
        state = self.checkpoints.load_dataloader_state(path)
        if state is not None:
            self.train_loader.load_state_dict(state)
        logger.info("SFT resumed from %s (step %d)", path, self.global_step)
        return path

    def shutdown(self) -> None:
        """Stop the workers and the tracker; the lock of ``default_local_dir`` is released even when that raises
        (a retry in this same process, e.g. a reused Ray worker, must be able to take it)."""
        try:
            self._stop()
        finally:
            self.checkpoints.lock.release()

    def _stop(self) -> None:
        if self.wg is not None:
            self.wg.shutdown()
        if self.tracker is not None and hasattr(self.tracker, "finish"):
            self.tracker.finish()


def _freq(value: Any, steps_per_epoch: int) -> int:
    """A ``trainer.save_freq``/``test_freq`` value as steps: verl 0.9's ``after_each_epoch`` is ``steps_per_epoch``
    (the value was checked at load: an int or that word)."""
    return steps_per_epoch if value == "after_each_epoch" else int(value)


def _cluster_has_gpu() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0


def run_sft(config: DictConfig) -> dict[str, Any]:
    """Validate ``config`` (``sft_trainer``), build the tokenizer and datasets, train; returns
    :meth:`SFTTrainer.fit`'s dict (``hf_model_dir`` is the final Hugging Face model).

    Raises:
        ConfigError: before any model is loaded, a ``trainer.default_local_dir`` where nothing can be written, a
            broken batch-size rule, a ``model.partial_pretrain`` folder with missing or truncated weights, a hub id
            that cannot be loaded here (offline and not cached, or the hub unreachable), or a tokenizer without a
            chat template.
        FileNotFoundError: a ``model.partial_pretrain`` folder that does not exist (naming the key).
        FileNotFoundError / ValueError: before any model is loaded, a ``model.lora_adapter_path`` that holds no
            adapter or contradicts ``model.lora_rank`` / ``lora_alpha`` / ``target_modules``.
        DataError: before any model is loaded, a bad data file or fewer training rows than one batch.
    """
    validate_sft_config(config)  # before any model is loaded
    unwritable = unwritable_output("trainer.default_local_dir", str(config.trainer.default_local_dir))
    if unwritable:  # checkpoints and hf_model go there: a read-only place is refused now, not at the first save
        raise ConfigError(unwritable)
    model = config.model
    try:
        check_local_path(str(model.partial_pretrain))
    except FileNotFoundError as exc:  # a missing folder: name the key, as rlhf ppo does for its model paths
        raise FileNotFoundError(f"model.partial_pretrain={str(model.partial_pretrain)!r}: {exc}") from None
    check_model_files("model.partial_pretrain", str(model.partial_pretrain))
    check_hub_model("model.partial_pretrain", str(model.partial_pretrain))  # offline hub id: one line, in seconds
    if model.lora_adapter_path is not None and "://" not in str(model.lora_adapter_path):
        check_lora_adapter(model)  # a missing or contradicting adapter, before the data is read
    tokenizer = load_tokenizer(sft_tokenizer_path(model), bool(model.trust_remote_code))
    tok_key = ("model.partial_pretrain" if model.tokenizer_path is None else "model.tokenizer_path")
    data = config.data
    if not data.custom_cls.path:  # the built-in SFTDataset renders every prompt (and message list) with it
        require_chat_template(tokenizer, f"{tok_key}={sft_tokenizer_path(model)!r}",
                              "SFT renders the prompts with it; add one to that folder or set data.chat_template",
                              data.chat_template)
    train = create_sft_dataset(_as_list(data.train_files), tokenizer, data, int(data.train_max_samples))
    if len(train) < int(data.train_batch_size):  # drop_last: not one step
        raise DataError(f"data.train_batch_size={int(data.train_batch_size)} is larger than the {len(train)} training "
                        f"rows of data.train_files={_as_list(data.train_files)}: not one full batch (the partial "
                        "batch is dropped)")
    val = (create_sft_dataset(_as_list(data.val_files), tokenizer, data, int(data.val_max_samples))
           if data.val_files else None)
    if val is not None:
        check_val_rows(val, _as_list(data.val_files), int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node))
    trainer = SFTTrainer(config, train, val)
    try:
        return trainer.fit()
    finally:
        trainer.shutdown()


def check_val_rows(val: Any, files: list[str], world_size: int) -> None:
    """Precheck of the validation rows before any model loads, as the training rows' count is checked: the
    validation set holds at least one batch for ``world_size`` ranks (fewer rows: validation would silently never
    run, :class:`SFTTrainer` drops the partial batch), and every row renders to a sample (``val[i]``: within
    ``data.max_length`` when ``data.truncation=error``, a response token left to score). Without it a bad
    validation row failed at the first validation, after training (a new user's trial, issue 35).

    Raises:
        DataError: naming ``data.val_files`` and the file/row of the first bad sample.
    """
    if len(val) < world_size:
        raise DataError(f"data.val_files={files} has {len(val)} rows, fewer than the {world_size} ranks "
                        "(trainer.nnodes x trainer.n_gpus_per_node): not one validation batch; add rows or set "
                        "data.val_files=null")
    for i in range(len(val)):
        try:
            val[i]
        except DataError as exc:
            raise DataError(f"data.val_files: {exc}") from None


main = sft_main  # `rlhf sft`: parsed (rlhf_core.trainer.commands) before this module is imported


def _as_list(value: Any) -> list:
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]
