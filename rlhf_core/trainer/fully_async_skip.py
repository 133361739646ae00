"""``skip.async_rollout`` (verl 0.9's ``AsyncRolloutSkip``): the fully asynchronous rollouter's dump/replay.

verl's rollouter feeds prompts one by one, each with a *feed index* (``sample_{epoch}_{index}``, 1 for the run's
first prompt, +1 per prompt; not the trainer's step), and its ``generate_sequences_single`` is wrapped per prompt:
a prompt whose index is in ``skip.async_rollout.steps`` (here ``[]`` means every prompt; verl 0.9.1 skips none)
replays the dump of that index (``cache``) or of the nearest dumped index (``repeat``: the latest earlier one, else
the earliest later one, as :class:`~rlhf_core.trainer.rollout_control.RolloutDump`), else it is generated and its
``rollout.n`` responses dumped under its index. Here the rollouter generates sub-batches of ``k`` prompts
(:mod:`rlhf_core.trainer.fully_async_stream`); :func:`generate_with_dumps` sends only the prompts without a dump to the
engine and puts the replayed groups back in their place, so the queue receives the same groups in the same order.

Feed index of prompt ``j`` (from 0) of the ``i``-th loader batch the run draws (from 0): ``(s + i) ×
data.train_batch_size + j + 1``, ``s`` = the trainer steps already done (a resumed run goes on counting; verl's
resume formula also multiplies by ``trigger_parameter_sync_step``). Layout: ``<dump_dir>/<experiment>_<project>
_GBS1__N<rollout.n>/step_<feed index>.pt``, one prompt's group each (verl's fully async caches are GBS 1 too).

A dump holds the group's responses and everything the engine returned, not the prompt's own data columns (uid,
ground truth, ...): a replayed group gets the current prompt's, as verl sets the current ``uid`` on the replayed
output; its response versions (``min_global_steps`` / ``max_global_steps``) are the version the rollout group holds
when it is replayed.
"""
from __future__ import annotations

from typing import Any, Callable

from rlhf_core.protocol import Batch
from rlhf_core.trainer.response_versions import MAX_KEY, MIN_KEY, tag_versions
from rlhf_core.trainer.rollout_control import RolloutDump


class AsyncRolloutDump(RolloutDump):
    """Per-prompt dumps of the fully async rollouter (module docstring); ``steps`` are feed indices."""

    KEY = "skip.async_rollout"

    @classmethod
    def from_config(cls, config: Any) -> "AsyncRolloutDump | None":
        """None unless ``skip.async_rollout.enable``."""
        skip, trainer = config.skip.async_rollout, config.trainer
        if not skip.enable:
            return None
        return cls(skip.dump_dir, trainer.experiment_name, trainer.project_name, 1,
                   config.actor_rollout_ref.rollout.n, skip.steps, skip.action)

    def dump_group(self, feed: int, group: Batch, prompt_columns: set[str]) -> str | None:
        """Dump a generated ``group`` under feed index ``feed``, without its version tags and the prompt's own
        non-tensor columns ``prompt_columns``; None when ``feed`` is not in ``skip.async_rollout.steps``."""
        tensors = {k: v for k, v in group.tensors.items() if k not in (MIN_KEY, MAX_KEY)}
        non_tensors = {k: v for k, v in group.non_tensors.items() if k not in prompt_columns}
        return self.dump(feed, Batch(tensors, non_tensors, dict(group.meta)))

    def replay_group(self, feed: int, rows: Batch, version: int) -> Batch | None:
        """The group replaying feed index ``feed`` for the prompt ``rows`` (its ``rollout.n`` repeated rows): the
        dump over the prompt's columns, tagged with parameter ``version``; None when there is no dump for it."""
        out = self.load(feed, len(rows))
        if out is None:
            return None
        return tag_versions(rows.merge(out, f"{self.KEY} dump of feed index {feed}"), version)


def generate_with_dumps(dumps: AsyncRolloutDump, prompts: Batch, feeds: list[int], n: int, step: int,
                        version: Callable[[], int], generate: Callable[[Batch], list[Batch]]) -> list[Batch]:
    """The groups of the sub-batch ``prompts`` (``rollout.n`` = ``n`` responses each), in prompt order: replayed
    from ``dumps`` where a prompt's feed index (``feeds``, one per prompt) has a dump, the others generated together
    by ``generate`` (prompts → their groups, in order) and dumped. ``step``: the loader batch's trainer step (a
    replayed group's ``meta["global_steps"]``, as :meth:`RayPPOTrainer.generate` sets). ``version()``: the rollout group's parameter
    version, read after the generation (a replayed group's versions).

    Raises:
        ValueError: ``feeds`` is not one index per prompt, or a dump holds another number of rows than ``n``.
    """
    if len(feeds) != len(prompts):
        raise ValueError(f"{len(feeds)} feed indices for {len(prompts)} prompts")
    sources = [dumps.source_step(f) for f in feeds]
    todo = [j for j, s in enumerate(sources) if s is None]
    generated = dict(zip(todo, generate(prompts.index(todo)) if todo else []))
    columns = set(prompts.non_tensors)
    groups = []
    for j, feed in enumerate(feeds):
        if j in generated:
            dumps.dump_group(feed, generated[j], columns)
            groups.append(generated[j])
            continue
        rows = prompts.index([j]).repeat_interleave(n)
        group = dumps.replay_group(feed, rows, version())
        group.meta.update({"global_steps": step, "validate": False})
        groups.append(group)
    return groups
