"""Run a batch of rows as agent-loop trajectories over one engine and pack them (``rollout.mode: async``).

Every row runs its own loop (the row's ``agent_name``, else ``agent.default_agent_loop``) as an asyncio task;
all of a rank's trajectories share the engine, which schedules their turns (see :mod:`rlhf_core.agent.engine`).
Request ids are ``<call>/<row>/turn<k>``, so a seeded run samples the same tokens whatever the scheduling.
"""
from __future__ import annotations

import asyncio
from typing import Any

from rlhf_core.agent.base import AgentLoopBase, MultiTurnSettings
from rlhf_core.agent.layout import pack_trajectories
from rlhf_core.agent.registry import check_rows
from rlhf_core.protocol import Batch


class AgentLoopManager:
    """``generate_sequences(batch) -> Batch`` for agent loops.

    Args:
        policy: the engine (:class:`~rlhf_core.agent.engine.StepEngine` or any ``Policy``).
        tokenizer: HF tokenizer with the chat template. settings: the multi-turn limits.
        tools: name → tool. specs: name → (loop class, extra kwargs) from ``load_agent_loop_specs``.
        default_agent_loop: ``rollout.agent.default_agent_loop``. pad_token_id: padding of the packed batch.
        interactions: name → interaction (:func:`rlhf_core.agent.interactions.load_interactions`).
    """

    def __init__(self, policy, tokenizer, settings: MultiTurnSettings, tools: dict, specs: dict,
                 default_agent_loop: str, pad_token_id: int, interactions: dict | None = None) -> None:
        self.policy, self.tokenizer, self.settings, self.tools = policy, tokenizer, settings, tools
        self.interactions = dict(interactions or {})
        self.specs, self.default_agent_loop, self.pad_token_id = specs, default_agent_loop, int(pad_token_id)
        self.calls = 0
        self._loops: dict[str, AgentLoopBase] = {}
        check_rows([], [], specs, default_agent_loop, tools, self.interactions)

    def _loop(self, name: str) -> AgentLoopBase:
        if name not in self._loops:
            cls, kwargs = self.specs[name]
            self._loops[name] = cls(self.policy, self.tokenizer, self.settings, self.tools, **kwargs)
            self._loops[name].interactions = self.interactions
        return self._loops[name]

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

        async def run_all():
            return await asyncio.gather(*(
                self._loop(row.get("agent_name") or self.default_agent_loop).run(row, f"{call}/{i}")
                for i, row in enumerate(rows)))

        outputs = asyncio.run(run_all())
        return pack_trajectories(outputs, batch, self.settings.response_length, self.pad_token_id)
