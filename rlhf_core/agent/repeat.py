"""``collabllm_agent``: the agent loop that reads ``multi_turn.num_repeat_rollouts`` (verl 0.6 reads that key only
in ``recipe/collabllm/collabllm_agent_loop.py::CollabLLMAgentLoop``; verl's ``tool_agent`` and sglang rollout
ignore it, and so does our ``tool_agent``).

Per row (verl's order): one assistant turn is generated from the prompt; that turn alone is the trajectory that
is trained (``response_ids`` = its tokens, ``response_mask`` all ones, ``num_turns`` 2). Then, unless that turn
already ended the trajectory (``response_length`` or ``max_assistant_turns`` reached), ``num_repeat_rollouts``
independent continuations of the conversation are rolled out with the interaction (a simulated user): the
interaction answers, the policy answers again (running its tool calls, if any), and so on until the interaction
ends the sequence or a limit is reached (``response_length`` over the continuation's whole response, the turn
limits). The continuations are not trained; their conversations go to the batch's ``messages`` column as
verl's ``{"messages": [conversation_1, ..., conversation_k]}`` (each a list of ``{"role", "content"}``), for a
reward manager that scores the futures of a turn (verl's ``collabllm`` reward manager averages its metrics over
them). Repeats stop early at an empty assistant turn (verl's ``is_valid_messages``; its ``<think>``-pairing rules
are CollabLLM's own and are not applied here).

Each continuation has its own interaction instance (``<request_id>/repeat<r>``; verl deep-copies the state) and
its own request ids (``<request_id>/repeat<r>/turn<k>``), so the repeats sample different futures,
reproducibly. ``recipe.collabllm.collabllm_agent_loop.CollabLLMAgentLoop`` in ``agent.agent_loop_config_path``
resolves to this class.
"""
from __future__ import annotations

from typing import Any

from rlhf_core.agent.base import AGENT_LOOPS, AgentLoopOutput
from rlhf_core.agent.interactions import finalize
from rlhf_core.agent.loops import ToolAgentLoop, _render_prompt, render_turn
from rlhf_core.tools.parser import TOOL_PARSERS
from rlhf_core.tools.runner import ToolCallStats, run_tool_calls


@AGENT_LOOPS.register("collabllm_agent")
class RepeatInteractionAgentLoop(ToolAgentLoop):
    """See the module docstring.

    Raises:
        ValueError: (at construction, before the loop generates anything) ``multi_turn.num_repeat_rollouts`` is
            null (verl fails on it too) or no ``multi_turn.interaction_config_path`` is set (checked at ``run``:
            interactions are attached after construction).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.settings.num_repeat_rollouts is None:
            raise ValueError("agent loop collabllm_agent needs actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts "
                             "(an int >= 0), got null")

    async def run(self, row: dict[str, Any], request_id: str) -> AgentLoopOutput:
        if not self.interactions:
            raise ValueError("agent loop collabllm_agent needs actor_rollout_ref.rollout.multi_turn."
                             "interaction_config_path (the simulated user of its repeated rollouts)")
        s = self.settings
        schemas = [t.get_openai_tool_schema().model_dump(exclude_none=True) for t in self.tools.values()] or None
        prompt_ids = _render_prompt(self.tokenizer, row, schemas)
        out = await self.policy.generate(prompt_ids, s.response_length, f"{request_id}/turn0")
        turn = list(out.token_ids[: s.response_length])
        logprobs = None if out.log_probs is None else list(out.log_probs[: len(turn)])
        messages = [dict(m) for m in (row.get("raw_prompt") if row.get("raw_prompt") is not None else [])]
        messages.append({"role": "assistant", "content": self.tokenizer.decode(turn, skip_special_tokens=True)})
        ended = len(turn) >= s.response_length or (s.max_assistant_turns and s.max_assistant_turns <= 1)
        conversations: list[list[dict[str, Any]]] = []
        stats = ToolCallStats()
        for r in range(0 if ended else s.num_repeat_rollouts):
            if not str(messages[-1]["content"]).strip():
                break
            conversations.append(await self._continue(row, prompt_ids, turn, list(messages), stats,
                                                      f"{request_id}/repeat{r}"))
        return AgentLoopOutput(prompt_ids, turn, [1] * len(turn), logprobs, num_turns=2, tool_stats=stats,
                               extra={"messages": {"messages": conversations}})

    async def _continue(self, row: dict[str, Any], prompt_ids: list[int], first_turn: list[int],
                        messages: list[dict[str, Any]], stats: ToolCallStats, rid: str) -> list[dict[str, Any]]:
        """One continuation from the state after the first assistant turn (verl: state INTERACTING)."""
        s = self.settings
        extra_info = row.get("extra_info") or {}
        kwargs = dict(extra_info.get("interaction_kwargs") or {})
        tools_kwargs = {k: v for k, v in (extra_info.get("tools_kwargs") or {}).items() if v is not None}
        interaction = self.interactions[kwargs["name"]]  # names checked by check_rows
        instance_id = await interaction.start_interaction(rid, **kwargs)
        ids, assistant_turns, user_turns = list(first_turn), 1, 0
        try:
            while True:
                stop, text, _, _ = await interaction.generate_response(instance_id, messages, **kwargs)
                messages.append({"role": "user", "content": text})
                ids += render_turn(self.tokenizer, messages[-1:])
                user_turns += 1
                if stop or len(ids) >= s.response_length:
                    return messages
                while True:  # assistant turns, with the tool turns between them
                    out = await self.policy.generate(prompt_ids + ids, s.response_length - len(ids),
                                                     f"{rid}/turn{assistant_turns}")
                    turn = list(out.token_ids[: s.response_length - len(ids)])
                    ids += turn
                    assistant_turns += 1
                    messages.append({"role": "assistant",
                                     "content": self.tokenizer.decode(turn, skip_special_tokens=True)})
                    if (len(ids) >= s.response_length or (s.max_assistant_turns and assistant_turns >= s.max_assistant_turns)
                            or (s.max_user_turns and user_turns >= s.max_user_turns)):
                        return messages
                    _, calls = TOOL_PARSERS.get(s.format)(self.tokenizer.decode(turn, skip_special_tokens=False))
                    if not calls:
                        break
                    results = await run_tool_calls(calls, self.tools, tools_kwargs, s.max_parallel_calls,
                                                   s.max_tool_response_length, s.tool_response_truncate_side, stats)
                    messages += [{"role": "tool", "content": r.text} for r in results]
                    ids += render_turn(self.tokenizer, messages[-len(results):])
                    user_turns += 1
                    if len(ids) >= s.response_length:
                        return messages
        finally:
            await finalize(interaction, instance_id)
