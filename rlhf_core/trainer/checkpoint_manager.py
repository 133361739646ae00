"""Driver-side checkpoint layout, discovery, retention and upload (verl's ``global_step_N`` layout).

```
<default_local_dir>/global_step_<N>/actor/    written by the actor workers (sharded model/optim/extra, huggingface/)
<default_local_dir>/global_step_<N>/critic/   written by the critic workers
<default_local_dir>/global_step_<N>/data.pt   dataloader ``state_dict()`` (torch.save)
<default_local_dir>/global_step_<N>/trainer_state.pt   driver state beyond verl's (e.g. the adaptive KL β; ours)
<default_local_dir>/global_step_<N>/checkpoint_manifest.json   every file and its size, once all are written (ours)
<default_local_dir>/latest_checkpointed_iteration.txt   "N", written last, atomically
<default_local_dir>/.rlhf_run.lock   PID and host of the run writing here (:mod:`.checkpoint_lock`; ours)
```

Nothing a resume might need is deleted (issue 32):

* ``resume_mode=auto`` resumes from the step the tracker names only when it is complete
  (:mod:`.checkpoint_integrity`); else from the newest complete step before it, with a warning naming both; with
  none, it stops naming the tracker's step and what is missing. Without a tracker (deleted), it resumes from the
  newest complete step that has a manifest, with a warning naming the missing tracker and the step; with none it
  starts fresh. ``resume_path`` refuses an incomplete step. Both happen on the driver, before any worker starts.
* A save of step N over an existing ``global_step_N`` folder that is not the tracker's complete step removes it
  only when it is partial and was never complete (no manifest: what a killed attempt leaves); a complete one (e.g.
  a newer step of a run this one fell back from), a damaged one (it has a manifest) or the tracker's incomplete one
  is moved aside to ``global_step_N.kept-<time>``, with a warning. New files never mix with old ones.
* Retention counts only complete checkpoints of a component, and leaves partial ones alone.

Retention (``max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep``; ``remove_previous_ckpt_in_save`` means keep 1)
runs only *after* the new checkpoint is complete and the tracker points at it, so the last good checkpoint always
exists. Old checkpoints are found on disk (not remembered in memory), so retention holds after a resume too.
Only steps *below* the one just saved are candidates for deletion: after resuming from an older step, newer
directories of the abandoned run are left alone. A step directory is removed whole once neither its actor nor its
critic remains.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import time
from typing import Any, Callable

import torch

from rlhf_core.atomic import atomic_write, atomic_write_text
from rlhf_core.safe_load import CheckpointError, load_state
from rlhf_core.storage import StorageError, free_bytes, full_disk_cause
from rlhf_core.trainer.checkpoint_integrity import MANIFEST, is_complete, step_problems, write_manifest
from rlhf_core.trainer.checkpoint_lock import CheckpointDirLock

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str, global_step: int) -> str:
    return os.path.join(root, f"global_step_{global_step}")


def parse_global_step(path: str) -> int:
    """``N`` from a path whose last component is ``global_step_<N>``.

    Raises:
        ValueError: when the last component is not ``global_step_<N>`` (e.g. ``.../global_step_5/actor``).
    """
    name = os.path.basename(os.path.normpath(str(path)))
    match = _STEP_DIR.match(name)
    if not match:
        raise ValueError(
            f"trainer.resume_from_path={path!r}: the last path component must be 'global_step_<N>', got {name!r}"
        )
    return int(match.group(1))


def write_tracker(root: str, global_step: int) -> None:
    """Atomically write ``N`` to ``<root>/latest_checkpointed_iteration.txt`` (:func:`rlhf_core.atomic.atomic_write`)."""
    atomic_write_text(os.path.join(root, TRACKER_FILE), str(int(global_step)))


def read_tracker(root: str) -> int | None:
    """The step ``<root>/latest_checkpointed_iteration.txt`` names, or ``None`` without that file.

    Raises:
        CheckpointError: the file does not hold an integer (naming the file and its content).
    """
    tracker = os.path.join(str(root), TRACKER_FILE)
    if not os.path.exists(tracker):
        return None
    with open(tracker) as fh:
        text = fh.read().strip()
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"{tracker}: expected a global step number, found {text[:40]!r}") from None


def find_latest_checkpoint(root: str) -> str | None:
    """The ``global_step_<N>`` directory named by the tracker file, or ``None`` (no tracker or directory gone)."""
    step = read_tracker(root)
    if step is None:
        return None
    path = step_dir(str(root), step)
    return path if os.path.isdir(path) else None


def list_step_dirs(root: str) -> dict[int, str]:
    """``{N: path}`` for every ``global_step_<N>`` directory under ``root``."""
    if not os.path.isdir(root):
        return {}
    out = {}
    for name in os.listdir(root):
        match = _STEP_DIR.match(name)
        if match and os.path.isdir(os.path.join(root, name)):
            out[int(match.group(1))] = os.path.join(root, name)
    return out


def _keep_count(max_to_keep: int | None, remove_previous: bool) -> int | None:
    """How many checkpoints to keep (including the new one); ``None`` = all."""
    if remove_previous:
        return 1
    if max_to_keep is None or int(max_to_keep) <= 0:
        return None
    return int(max_to_keep)


class CheckpointManager:
    """Save / find / prune ``global_step_N`` checkpoints under ``default_local_dir``.

    ``save_fns`` given to :meth:`save` map a component name (``actor``, ``critic``) to a callable that writes it
    into the given directory (the driver calls the worker groups' ``save_checkpoint`` there).
    """

    def __init__(self, default_local_dir: str, default_hdfs_dir: str | None = None,
                 max_actor_ckpt_to_keep: int | None = None, max_critic_ckpt_to_keep: int | None = None,
                 remove_previous_ckpt_in_save: bool = False, del_local_ckpt_after_load: bool = False):
        self.root = str(default_local_dir)
        self.hdfs_dir = default_hdfs_dir
        self.keep = {
            "actor": _keep_count(max_actor_ckpt_to_keep, remove_previous_ckpt_in_save),
            "critic": _keep_count(max_critic_ckpt_to_keep, remove_previous_ckpt_in_save),
        }
        self.del_local_after_load = bool(del_local_ckpt_after_load)
        self._pending: tuple[int, str, list, tuple[str, ...]] | None = None
        self.lock = CheckpointDirLock(self.root)

    @classmethod
    def from_config(cls, trainer_cfg: Any) -> "CheckpointManager":
        t = trainer_cfg
        return cls(t.default_local_dir, t.default_hdfs_dir, t.max_actor_ckpt_to_keep, t.max_critic_ckpt_to_keep,
                   bool(t.remove_previous_ckpt_in_save), bool(t.del_local_ckpt_after_load))

    # ---- resume ----------------------------------------------------------------------------------
    def resolve_resume(self, resume_mode: str, resume_from_path: str | None = None,
                       components: tuple[str, ...] = ("actor",)) -> str | None:
        """The complete ``global_step_N`` directory to resume from, or ``None`` to start fresh (module docstring).

        Args:
            components: the component folders the run will load (``actor``, and ``critic`` with a critic).

        Raises:
            ValueError: unknown ``resume_mode``; ``resume_path`` without a path, with a path whose last component is
                not ``global_step_<N>``, or that does not exist.
            CheckpointError: ``resume_path`` names an incomplete step (naming the missing files); ``auto`` finds
                the tracker's step incomplete and no complete step before it (naming the step and what is missing).
        """
        if resume_mode == "disable":
            return None
        if resume_mode == "auto":
            return self._resolve_auto(tuple(components))
        if resume_mode == "resume_path":
            if not resume_from_path:
                raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
            parse_global_step(resume_from_path)
            if not os.path.isdir(resume_from_path):
                raise ValueError(f"trainer.resume_from_path={resume_from_path!r} does not exist")
            problems = step_problems(str(resume_from_path), components)
            if problems:
                raise CheckpointError(f"trainer.resume_from_path={resume_from_path!r} is not a complete checkpoint: "
                                      f"{_summary(problems)}")
            return str(resume_from_path)
        raise ValueError(f"trainer.resume_mode={resume_mode!r}: expected one of auto, disable, resume_path")

    def _resolve_auto(self, components: tuple[str, ...]) -> str | None:
        tracked = read_tracker(self.root)
        if tracked is None:
            return self._resolve_without_tracker(components)
        path = step_dir(self.root, tracked)
        problems = step_problems(path, components)
        if not problems:
            return path
        older = sorted((s for s in list_step_dirs(self.root) if s < tracked), reverse=True)
        fallback = next((step_dir(self.root, s) for s in older if is_complete(step_dir(self.root, s), components)),
                        None)
        if fallback is None:
            raise CheckpointError(f"{os.path.join(self.root, TRACKER_FILE)} names global step {tracked}, which is not "
                                  f"a complete checkpoint ({_summary(problems)}), and no complete checkpoint before "
                                  f"it exists in {self.root}; nothing was deleted")
        logger.warning("%s names global step %d, which is not a complete checkpoint (%s): resuming from %s, the "
                       "newest complete one before it; %s", TRACKER_FILE, tracked, _summary(problems), fallback,
                       _fate_of_damaged(path, tracked))
        return fallback

    def _resolve_without_tracker(self, components: tuple[str, ...]) -> str | None:
        """No tracker: the newest ``global_step_N`` that has a manifest and is complete (e.g. the tracker was
        deleted), with a warning; None (a fresh start) when there is none (a first save's half-written folder, or
        nothing). Without a tracker a step needs its manifest: the checks of a step written before manifests
        existed would pass a component folder a killed first save left empty."""
        steps = [step_dir(self.root, s) for s in sorted(list_step_dirs(self.root), reverse=True)]
        newest = next((p for p in steps if os.path.exists(os.path.join(p, MANIFEST)) and is_complete(p, components)),
                      None)
        if newest is not None:
            logger.warning("%s is missing, but %s holds global_step_* folders: resuming from %s, the newest complete "
                           "one (to start from scratch instead, set trainer.resume_mode=disable or use another "
                           "trainer.default_local_dir)", os.path.join(self.root, TRACKER_FILE), self.root, newest)
        return newest

    @staticmethod
    def load_dataloader_state(ckpt_dir: str) -> dict | None:
        """``data.pt`` (the dataloader position; :func:`rlhf_core.safe_load.load_state`), or None without one."""
        path = os.path.join(ckpt_dir, "data.pt")
        return load_state(path) if os.path.exists(path) else None

    @staticmethod
    def load_trainer_state(ckpt_dir: str) -> dict | None:
        """``trainer_state.pt`` (driver RNGs, KL β; :func:`rlhf_core.safe_load.load_state`), or None without one."""
        path = os.path.join(ckpt_dir, "trainer_state.pt")
        return load_state(path) if os.path.exists(path) else None

    def after_load(self, ckpt_dir: str) -> None:
        """``del_local_ckpt_after_load``: remove the loaded local directory (it must live elsewhere, e.g. HDFS)."""
        if self.del_local_after_load:
            shutil.rmtree(ckpt_dir, ignore_errors=True)

    # ---- save ------------------------------------------------------------------------------------
    def save(self, global_step: int, save_fns: dict[str, Callable[[str], None]],
             dataloader_state: dict | None, trainer_state: dict | None = None,
             wait_fns: list[Callable[[], Any]] | None = None) -> str:
        """Write ``global_step_N`` (components, data.pt, trainer_state.pt), then the tracker, then upload and prune.

        An existing ``global_step_N`` that the tracker does not name is removed first when it is partial (what a
        killed attempt left half-written), or moved aside to ``global_step_N.kept-<time>`` when it is complete;
        the tracker keeps naming the previous complete checkpoint until this one is complete.

        ``wait_fns`` (``checkpoint.async_save``): the components are still being written when ``save_fns`` return;
        the tracker, upload and pruning then wait for :meth:`finish_pending` (called before the next save and at
        the end of training), which first calls every ``wait_fn`` (they block until the files are complete).

        Returns:
            the local ``global_step_N`` directory.

        Raises:
            StorageError: a component failed to write because the disk is full or read-only (``ENOSPC``, also as
                DCP's ``unexpected pos``; ``EDQUOT``; ``EROFS``), same ``errno``, naming the step folder, the
                component, the bytes free and the last complete checkpoint; the partial step folder is removed first
                and the tracker is untouched (:meth:`finish_pending` likewise for ``async_save``). Other errors
                propagate unchanged.
        """
        self.finish_pending()
        path = step_dir(self.root, global_step)
        tracked = find_latest_checkpoint(self.root) == path
        if os.path.isdir(path) and (not tracked or not is_complete(path, tuple(save_fns))):
            self._clear_untracked(path, tuple(save_fns), tracked)
        os.makedirs(path, exist_ok=True)
        part = "?"
        try:
            for part, save in save_fns.items():
                save(os.path.join(path, part))
            for part, state in (("data.pt", dataloader_state), ("trainer_state.pt", trainer_state)):
                if state is not None:
                    with atomic_write(os.path.join(path, part)) as fh:
                        torch.save(state, fh)
        except Exception as exc:  # noqa: BLE001 - a full disk here or in a worker: one line (else re-raised)
            failed = self._write_failed(path, part, exc)
            if failed is None:
                raise
            raise failed from exc
        self._pending = (global_step, path, list(wait_fns or []), tuple(save_fns))
        if wait_fns is None:
            self.finish_pending()
        return path

    @staticmethod
    def _clear_untracked(path: str, components: tuple[str, ...], tracked: bool) -> None:
        """Make room for a new ``path``: a folder that is complete, was complete once (it has a manifest: a user's
        checkpoint damaged since) or that the tracker names is moved aside to ``<path>.kept-<time>``; any other
        (a killed attempt's half-written leftovers, which must not mix with the new files) is removed."""
        complete = is_complete(path, components)
        manifest = os.path.exists(os.path.join(path, MANIFEST))
        if complete or tracked or manifest:
            kept = f"{path}.kept-{time.strftime('%Y%m%d-%H%M%S')}"
            os.rename(path, kept)
            # without a manifest only the component folders were checked: a save killed after them (before data.pt
            # and the manifest) looks the same as a checkpoint verl or an older version of this project wrote
            what = ("a complete checkpoint" if complete and manifest else
                    f"complete {', '.join(components)} folder(s) without a manifest (a save killed before it "
                    "finished, or a checkpoint verl wrote)" if complete else "a damaged checkpoint")
            logger.warning("%s holds %s; a run resumed from an earlier step is writing this step again: moved it "
                           "to %s", path, what, kept)
        else:
            logger.info("removing %s before writing it again (partial, and the tracker does not name it)", path)
            shutil.rmtree(path)

    def _write_failed(self, path: str, part: str, exc: Exception) -> StorageError | None:
        """The error to raise instead of ``exc``, raised while writing ``part`` of the step folder ``path``.

        A storage failure (:func:`rlhf_core.storage.full_disk_cause`: ``ENOSPC``/``EDQUOT``/``EROFS`` here or in a
        worker, or DCP's ``unexpected pos`` with the disk full) removes ``path`` unless the tracker names it (a
        re-save of that step) and becomes one :class:`StorageError` line naming the folder, the cause (with the
        bytes free, from the worker) and the last complete checkpoint; None for any other error (re-raise it)."""
        cause = full_disk_cause(exc, path)
        if cause is None:
            return None
        reason = cause.strerror or os.strerror(cause.errno)
        if "bytes free" not in reason:
            reason = f"{reason}: {free_bytes(path)} bytes free on its disk"
        last = find_latest_checkpoint(self.root)
        if last == path:
            return StorageError(cause.errno, f"checkpoint {path}: writing {part!r} failed ({reason}); the tracker "
                                             f"names this step, so its folder was left as it is")
        shutil.rmtree(path, ignore_errors=True)
        kept = f"the last complete one is still {last}" if last else f"no complete checkpoint exists in {self.root}"
        return StorageError(cause.errno, f"checkpoint {path}: writing {part!r} failed ({reason}); the partial "
                                         f"checkpoint was removed, {kept}")

    def finish_pending(self) -> str | None:
        """Complete the last save: wait for its components, then the manifest, tracker, upload, prune; returns its
        directory."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        global_step, path, wait_fns, components = pending
        try:
            for wait in wait_fns:
                wait()
        except Exception as exc:  # noqa: BLE001 - a full disk while a worker wrote in the background: one line
            failed = self._write_failed(path, "/".join(components), exc)
            if failed is None:
                raise
            raise failed from exc
        write_manifest(path, global_step, components)
        write_tracker(self.root, global_step)
        if self.hdfs_dir:
            self.upload(path)
        self.prune(global_step)
        return path

    def upload(self, local_dir: str) -> str:
        """Copy ``local_dir`` (a ``global_step_N``) and the tracker to ``default_hdfs_dir`` with fsspec."""
        import fsspec

        fs, remote_root = fsspec.core.url_to_fs(str(self.hdfs_dir))
        remote = remote_root.rstrip("/") + "/" + os.path.basename(local_dir)
        fs.makedirs(remote, exist_ok=True)
        fs.put(local_dir.rstrip("/") + "/", remote, recursive=True)
        fs.put(os.path.join(self.root, TRACKER_FILE), remote_root.rstrip("/") + "/" + TRACKER_FILE)
        return remote

    def prune(self, current_step: int) -> list[str]:
        """Apply retention to steps below ``current_step``; returns the paths removed."""
        steps = list_step_dirs(self.root)
        removed: list[str] = []
        for component, keep in self.keep.items():
            if keep is None:
                continue
            older = sorted((s for s in steps if s < current_step and os.path.isdir(os.path.join(steps[s], component))
                            and is_complete(steps[s], (component,))), reverse=True)
            for s in older[keep - 1:]:
                target = os.path.join(steps[s], component)
                shutil.rmtree(target, ignore_errors=True)
                removed.append(target)
        for s, path in steps.items():
            if s < current_step and not any(os.path.isdir(os.path.join(path, c)) for c in ("actor", "critic")):
                if any(os.path.join(path, c) in removed for c in ("actor", "critic")):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
        return removed


def _fate_of_damaged(path: str, step: int) -> str:
    """What happens to the tracker's incomplete step folder ``path`` after a fallback (for the warning)."""
    if not os.path.isdir(path):
        return "nothing is deleted"
    if os.path.exists(os.path.join(path, MANIFEST)):
        return f"{path} stays as it is until this run saves step {step}, which first moves it to {path}.kept-<time>"
    return (f"{path} stays as it is until this run saves step {step}, which first moves it to {path}.kept-<time> "
            f"while the tracker names it, else removes it (it has no manifest: it may never have been written whole)")


def _summary(problems: list[str], limit: int = 3) -> str:
    """The first ``limit`` problems of :func:`step_problems`, and how many more."""
    more = f", and {len(problems) - limit} more" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more
