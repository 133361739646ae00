"""Agent loops: one trajectory per row, generated turn by turn (verl ``experimental/agent_loop/agent_loop.py``).

An agent loop gets a row (its chat ``raw_prompt``, ``raw_prompt_ids``, ``extra_info.tools_kwargs``, ...) and a
:class:`Policy` (the rollout engine seen as "one request → tokens"), and returns an :class:`AgentLoopOutput`:
the prompt ids and one flat list of response ids holding every assistant turn and every tool/user turn between
them, with ``response_mask`` 1 on the tokens the policy sampled and 0 on the rest.

Loops are registered by ``agent_name`` (``single_turn_agent``, ``tool_agent``); a user loop is a class path
(``pkg.module.Class``) in the ``agent.agent_loop_config_path`` file (see :mod:`rlhf_core.agent.registry`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rlhf_core.registry import Registry
from rlhf_core.tools.runner import ToolCallStats


@dataclass
class TokenOutput:
    """One generation request's result: the sampled ``token_ids`` (ending with EOS when it stopped there) and
    their ``log_probs`` (float; what ``rollout.logprobs_mode`` asks for, by default the log-softmax of the logits
    the token was drawn from) when the engine computes them."""

    token_ids: list[int]
    log_probs: list[float] | None = None


class Policy(Protocol):
    """The rollout engine as an agent loop sees it: one request at a time, concurrency is the engine's job."""

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, request_id: str) -> TokenOutput:
        """Sample at most ``max_new_tokens`` tokens continuing ``prompt_ids``; ``request_id`` seeds the request."""
        ...


@dataclass
class AgentLoopOutput:
    """One trajectory.

    Attributes:
        prompt_ids: the rendered prompt (with the tool schemas when the loop has tools), unpadded.
        response_ids: every token after the prompt, at most ``response_length``.
        response_mask: same length; 1 on policy-sampled (assistant) tokens, 0 on tool/user tokens.
        response_logprobs: same length when the engine gives log-probs (0.0 on tool/user tokens), else ``None``.
        num_turns: verl's count: 1 (the prompt) + assistant turns + tool/user turns.
        tool_stats: the trajectory's tool calls and failures.
        tool_rewards: the step rewards the tools returned, in call order.
        turn_scores: the turn scores the interaction returned, one per user turn it generated.
        extra: anything else the loop wants in the batch's non-tensor columns.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 2
    tool_stats: ToolCallStats = field(default_factory=ToolCallStats)
    tool_rewards: list[float] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MultiTurnSettings:
    """The scalars an agent loop needs, unpacked once from ``actor_rollout_ref.rollout`` (see
    :func:`rlhf_core.agent.registry.settings_from_config`; the defaults there come from
    ``rlhf_core/configs/ppo_trainer.yaml``, these are for direct construction in tests). ``None`` turn limits mean no
    limit.
    ``use_inference_chat_template``: see :class:`rlhf_core.agent.loops.ToolAgentLoop`;
    ``tokenization_sanity_check_mode``: see :mod:`rlhf_core.agent.sanity`; ``num_repeat_rollouts``: see
    :mod:`rlhf_core.agent.repeat` (read by the ``collabllm_agent`` loop only, as in verl)."""

    response_length: int
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    use_inference_chat_template: bool = False
    tokenization_sanity_check_mode: str = "strict"
    num_repeat_rollouts: int | None = None


class AgentLoopBase:
    """Base class: ``await loop.run(row)`` → :class:`AgentLoopOutput`.

    Args:
        policy: the engine. tokenizer: a HF tokenizer with a chat template. settings: the limits.
        tools: name → tool (empty without ``multi_turn.tool_config_path``).

    Attributes:
        interactions: name → interaction (``multi_turn.interaction_config_path``; empty without it), set by the
            manager after construction so that user loops keep the constructor above.
    """

    interactions: dict[str, Any] = {}

    def __init__(self, policy: Policy, tokenizer: Any, settings: MultiTurnSettings, tools: dict | None = None) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.settings = settings
        self.tools = dict(tools or {})

    async def run(self, row: dict[str, Any], request_id: str) -> AgentLoopOutput:
        raise TypeError(f"{type(self).__name__} does not define run()")


AGENT_LOOPS: Registry[type[AgentLoopBase]] = Registry("agent_name")
