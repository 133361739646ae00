"""The two built-in agent loops: ``single_turn_agent`` (one generation, as the sync rollout does) and
``tool_agent`` (verl ``ToolAgentLoop``: generate → parse tool calls → run them → append the tool turn → ...)."""
from __future__ import annotations

from typing import Any

from rlhf_core.agent.base import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput
from rlhf_core.agent.interactions import finalize
from rlhf_core.agent.sanity import check_trajectory
from rlhf_core.data.prompts import encode
from rlhf_core.tools.parser import TOOL_PARSERS
from rlhf_core.tools.runner import ToolCallStats, run_tool_calls

# a fixed conversation the tool turn is rendered after, so that only the tool turn's own text is kept
_TEMPLATE_BASE = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def render_turn(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of ``messages`` (tool or user turns) as the chat template renders them *after* an assistant
    turn, followed by the generation prompt of the next assistant turn.

    verl renders the new messages alone and strips the template's default system prompt; here the text of a
    fixed two-message conversation is rendered with and without them and the difference kept, which works for
    templates without a default system prompt too. The assistant turn's closing token is the policy's EOS, so
    whatever the template puts between EOS and the next turn (ChatML's ``\\n``) is absent, as in verl.

    Raises:
        ValueError: when the template renders the base conversation differently once messages follow it.
    """
    base = tokenizer.apply_chat_template(_TEMPLATE_BASE, add_generation_prompt=False, tokenize=False)
    full = tokenizer.apply_chat_template(_TEMPLATE_BASE + list(messages), add_generation_prompt=True, tokenize=False)
    if not full.startswith(base):
        raise ValueError("the chat template renders earlier turns differently when tool/user turns follow; "
                         "cannot render a tool turn incrementally")
    return encode(tokenizer, full[len(base):])


def _render_messages(tokenizer: Any, messages: list[dict[str, Any]], tool_schemas: list[dict] | None) -> list[int]:
    text = tokenizer.apply_chat_template(list(messages), tools=tool_schemas, add_generation_prompt=True, tokenize=False)
    return encode(tokenizer, text)


def _render_prompt(tokenizer: Any, row: dict[str, Any], tool_schemas: list[dict] | None) -> list[int]:
    messages = row.get("raw_prompt")
    if messages is None:
        if tool_schemas:
            raise ValueError("tool_agent needs the chat messages: set data.return_raw_chat=True")
        return list(row["raw_prompt_ids"])
    return _render_messages(tokenizer, messages, tool_schemas)


@AGENT_LOOPS.register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """One assistant turn: ``response_length`` tokens at most, mask all ones. The prompt is the dataset's
    ``raw_prompt_ids`` (already truncated as ``data.truncation`` says) when the row has them."""

    async def run(self, row: dict[str, Any], request_id: str) -> AgentLoopOutput:
        has_ids = row.get("raw_prompt_ids") is not None
        prompt_ids = list(row["raw_prompt_ids"]) if has_ids else _render_prompt(self.tokenizer, row, None)
        out = await self.policy.generate(prompt_ids, self.settings.response_length, request_id)
        ids = out.token_ids[: self.settings.response_length]
        logprobs = None if out.log_probs is None else list(out.log_probs[: len(ids)])
        return AgentLoopOutput(prompt_ids, list(ids), [1] * len(ids), logprobs, num_turns=2)


@AGENT_LOOPS.register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """Assistant turns interleaved with tool turns until the policy calls no tool or a limit is reached.

    Stops after an assistant turn when: the trajectory reached ``response_length``; ``max_assistant_turns``
    or ``max_user_turns`` (tool turns count as user turns, as in verl) is reached; the turn has no tool call
    (and no interaction is configured); or the tool turn would not fit in ``response_length`` (it is then
    dropped, as verl does). Each assistant turn gets ``response_length - len(trajectory so far)`` new tokens at
    most. Row inputs: ``raw_prompt`` (messages; rendered with the tool schemas), ``extra_info.tools_kwargs``
    (per tool ``create_kwargs``, ``execute_kwargs``, ``release_kwargs``).

    With interactions (``multi_turn.interaction_config_path``), an assistant turn without a tool call gets a
    user turn from the interaction named by ``extra_info.interaction_kwargs.name`` (see
    :mod:`rlhf_core.agent.interactions`); its turn score is recorded, and the loop stops when the interaction
    ends the sequence (after its user turn) or the user turn would not fit in ``response_length``: it is then
    dropped, like a tool turn (verl appends it and cuts the trajectory at ``response_length``, keeping its head).

    ``multi_turn.use_inference_chat_template`` (verl ``AsyncRolloutRequest.get_generation_prompt_ids``) chooses
    what the engine is asked to continue at assistant turns 2, 3, ...; the layout (``prompt_ids``,
    ``response_ids``, ``response_mask``: what training sees) is built the same way in both cases:

    * ``False`` (default): the trajectory's own ids, ``prompt_ids + response_ids so far``: the policy is trained
      on exactly the context it generated from; earlier turns keep everything the model emitted (e.g. Qwen3's
      ``<think>`` content);
    * ``True``: the chat template applied to the conversation so far (``raw_prompt`` + each assistant turn's
      decoded text + the tool/user turns, ``tools=`` the schemas, with the generation prompt), as an inference
      server renders it: a template that drops earlier turns' reasoning (Qwen3, QwQ) gives the engine a shorter
      context than the training sequence, and ``rollout_log_probs`` are then those of that context, not of the
      training sequence (the actor's recomputed log-probs are). Rows without ``raw_prompt`` keep the ids.

    ``multi_turn.tokenization_sanity_check_mode``: at the end, :func:`rlhf_core.agent.sanity.check_trajectory`
    compares the ids with the whole conversation re-tokenized; a mismatch's message goes to
    ``extra["tokenization_mismatch"]`` (the manager logs it). Rows without ``raw_prompt`` are not checked.
    """

    async def run(self, row: dict[str, Any], request_id: str) -> AgentLoopOutput:
        extra_info = row.get("extra_info") or {}
        interaction = None
        if self.interactions:
            interaction_kwargs = dict(extra_info.get("interaction_kwargs") or {})
            interaction = self.interactions[interaction_kwargs["name"]]  # names checked by check_rows
            instance_id = await interaction.start_interaction(request_id, **interaction_kwargs)
        try:
            return await self._run(row, request_id, interaction,
                                   (instance_id, interaction_kwargs) if interaction else None)
        finally:
            if interaction is not None:
                await finalize(interaction, instance_id)

    async def _run(self, row: dict[str, Any], request_id: str, interaction: Any,
                   state: tuple[str, dict] | None) -> AgentLoopOutput:
        s = self.settings
        schemas = [t.get_openai_tool_schema().model_dump(exclude_none=True) for t in self.tools.values()] or None
        prompt_ids = _render_prompt(self.tokenizer, row, schemas)
        tools_kwargs = ((row.get("extra_info") or {}).get("tools_kwargs")) or {}
        tools_kwargs = {name: value for name, value in tools_kwargs.items() if value is not None}  # parquet nulls
        parse = TOOL_PARSERS.get(s.format)
        raw = row.get("raw_prompt")  # a list, or an object array when read from parquet
        messages = [] if raw is None else [dict(m) for m in raw]  # the conversation the interaction reads
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] | None = []
        stats, rewards, turn_scores = ToolCallStats(), [], []
        assistant_turns = user_turns = 0
        last_turn_start = 0
        while len(ids) < s.response_length:
            inference_render = s.use_inference_chat_template and raw is not None and assistant_turns > 0
            context = _render_messages(self.tokenizer, messages, schemas) if inference_render else prompt_ids + ids
            out = await self.policy.generate(context, s.response_length - len(ids),
                                             f"{request_id}/turn{assistant_turns}")
            turn = out.token_ids[: s.response_length - len(ids)]
            last_turn_start = len(ids)
            ids += turn
            mask += [1] * len(turn)
            logprobs = None if logprobs is None or out.log_probs is None else logprobs + list(out.log_probs[: len(turn)])
            assistant_turns += 1
            messages.append({"role": "assistant", "content": self.tokenizer.decode(turn, skip_special_tokens=True)})
            if (len(ids) >= s.response_length or (s.max_assistant_turns and assistant_turns >= s.max_assistant_turns)
                    or (s.max_user_turns and user_turns >= s.max_user_turns)):
                break
            _, calls = parse(self.tokenizer.decode(turn, skip_special_tokens=False))
            if calls:
                results = await run_tool_calls(calls, self.tools, tools_kwargs, s.max_parallel_calls,
                                               s.max_tool_response_length, s.tool_response_truncate_side, stats)
                rewards += [r.reward for r in results]
                new_messages, stop = [{"role": "tool", "content": r.text} for r in results], False
            elif interaction is not None:
                instance_id, interaction_kwargs = state
                stop, text, score, _ = await interaction.generate_response(instance_id, messages, **interaction_kwargs)
                if score is not None:
                    turn_scores.append(float(score))
                new_messages = [{"role": "user", "content": text}]
            else:
                break
            new_ids = render_turn(self.tokenizer, new_messages)
            if len(ids) + len(new_ids) >= s.response_length:
                break
            ids += new_ids
            mask += [0] * len(new_ids)
            logprobs = None if logprobs is None else logprobs + [0.0] * len(new_ids)
            messages += new_messages
            user_turns += 1
            if stop:  # the interaction ended the sequence after its (kept) user turn, as verl does
                break
        extra = {}
        if raw is not None and s.tokenization_sanity_check_mode != "disable":
            extra["tokenization_mismatch"] = check_trajectory(
                self.tokenizer, messages, schemas, prompt_ids, ids, last_turn_start, {self.tokenizer.eos_token_id},
                s.tokenization_sanity_check_mode, f"trajectory {request_id} (<call>/<row>)")
        return AgentLoopOutput(prompt_ids, ids, mask, logprobs, num_turns=1 + assistant_turns + user_turns,
                               tool_stats=stats, tool_rewards=rewards, turn_scores=turn_scores, extra=extra)
