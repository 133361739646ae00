"""Run a batch of rows as agent-loop trajectories over one engine and pack them (``rollout.mode: async``).

Every row runs its own loop (the row's ``agent_name``, else ``agent.default_agent_loop``) as an asyncio task;
all of a rank's trajectories share the engine, which schedules their turns (see :mod:`rlhf_core.agent.engine`).
Request ids are ``<call>/<row>/turn<k>``, so a seeded run samples the same tokens whatever the scheduling.

``rollout.agent.num_workers`` (verl ``AgentLoopManager``: that many ``AgentLoopWorker`` actors, the batch cut
into as many contiguous chunks): the rows are cut into ``num_workers`` contiguous chunks (sizes differ by one at
most; verl asserts the batch divides evenly, here any size works and a worker without rows is not started); each
chunk is one agent-loop worker with its own loop instances (verl's workers build their own), whose trajectories
are one group of asyncio tasks; the workers run concurrently over the shared engine and their outputs are
concatenated in row order. Requests enter the engine in row order whatever ``num_workers`` is and each samples
from its own request-id seed, so the packed batch is the same for every ``num_workers``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np

from rlhf_core.agent.base import AgentLoopBase, MultiTurnSettings
from rlhf_core.agent.layout import pack_trajectories
from rlhf_core.agent.registry import check_rows
from rlhf_core.protocol import Batch

logger = logging.getLogger(__name__)


class AgentLoopManager:
    """``generate_sequences(batch) -> Batch`` for agent loops.

    Args:
        policy: the engine (:class:`~rlhf_core.agent.engine.StepEngine` or any ``Policy``).
        tokenizer: HF tokenizer with the chat template. settings: the multi-turn limits.
        tools: name → tool. specs: name → (loop class, extra kwargs) from ``load_agent_loop_specs``.
        default_agent_loop: ``rollout.agent.default_agent_loop``. pad_token_id: padding of the packed batch.
        interactions: name → interaction (:func:`rlhf_core.agent.interactions.load_interactions`).
        num_workers: ``rollout.agent.num_workers`` (see the module docstring).

    Raises:
        ValueError: ``num_workers < 1``. AgentConfigError: an unknown ``default_agent_loop``.
    """

    def __init__(self, policy, tokenizer, settings: MultiTurnSettings, tools: dict, specs: dict,
                 default_agent_loop: str, pad_token_id: int, interactions: dict | None = None,
                 num_workers: int = 1) -> None:
        if int(num_workers) < 1:
            raise ValueError(f"actor_rollout_ref.rollout.agent.num_workers must be >= 1, got {num_workers}")
        self.policy, self.tokenizer, self.settings, self.tools = policy, tokenizer, settings, tools
        self.interactions = dict(interactions or {})
        self.specs, self.default_agent_loop, self.pad_token_id = specs, default_agent_loop, int(pad_token_id)
        self.num_workers = int(num_workers)
        self.calls = 0
        self._loops: dict[tuple[int, str], AgentLoopBase] = {}
        check_rows([], [], specs, default_agent_loop, tools, self.interactions)

    def _loop(self, worker: int, name: str) -> AgentLoopBase:
        if (worker, name) not in self._loops:
            cls, kwargs = self.specs[name]
            loop = cls(self.policy, self.tokenizer, self.settings, self.tools, **kwargs)
            loop.interactions = self.interactions
            self._loops[worker, name] = loop
        return self._loops[worker, name]

    def worker_chunks(self, n_rows: int) -> list[range]:
        """The contiguous row ranges of the agent-loop workers (``np.array_split`` sizes; empty ones dropped):
        10 rows, 3 workers → ``range(0, 4), range(4, 7), range(7, 10)``."""
        bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n_rows), self.num_workers)])
        return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    @staticmethod
    def rows_of(batch: Batch) -> list[dict[str, Any]]:
        """The non-tensor columns of each row as a dict (``raw_prompt``, ``raw_prompt_ids``, ``extra_info``...)."""
        return [{k: v[i] for k, v in batch.non_tensors.items()} for i in range(len(batch))]

    def generate_sequences(self, batch: Batch) -> Batch:
        """One trajectory per row of ``batch`` (its ``input_ids`` width is the minimum prompt width).

        Raises:
            AgentConfigError: a row naming an unknown agent loop, tool or interaction (before any generation).
        """
        rows = self.rows_of(batch)
        check_rows(rows, [f"batch row {i}" for i in range(len(rows))], self.specs, self.default_agent_loop,
                   self.tools, self.interactions)
        call = self.calls
        self.calls += 1

        async def worker(w: int, chunk: range):
            return await asyncio.gather(*(
                self._loop(w, rows[i].get("agent_name") or self.default_agent_loop).run(rows[i], f"{call}/{i}")
                for i in chunk))

        async def run_all():
            chunks = await asyncio.gather(*(worker(w, c) for w, c in enumerate(self.worker_chunks(len(rows)))))
            return [out for chunk in chunks for out in chunk]

        outputs = asyncio.run(run_all())
        mismatches = [o.extra["tokenization_mismatch"] for o in outputs if o.extra.get("tokenization_mismatch")]
        if mismatches:  # one warning per batch, not per trajectory (verl warns per trajectory)
            logger.warning("%d of %d trajectories: %s", len(mismatches), len(outputs), mismatches[0])
        return pack_trajectories(outputs, batch, self.settings.response_length, self.pad_token_id)
