"""The rollout engine of an ``ActorRolloutRefWorker`` (verl ``fsdp_workers.ActorRolloutRefWorker._build_rollout``):
the hf engine on its own full copy of the policy, or vLLM, wrapped in the agent loop when
``rollout.mode=async`` / ``multi_turn.enable``."""
from __future__ import annotations

import logging
from typing import Any

from rlhf_core.workers.fsdp_utils import rank
from rlhf_core.workers.rollout.engine_copy import build_engine_copy
from rlhf_core.workers.rollout.hf_rollout import HFRollout

logger = logging.getLogger(__name__)


def build_rollout(config: Any, tokenizer: Any, seed: int, weights_from_actor: bool) -> Any:
    """This rank's rollout engine for ``config.actor_rollout_ref.rollout``.

    Args:
        config: the full PPO config (``actor_rollout_ref.*``, ``trainer.*`` for the agent-loop trace).
        tokenizer: the policy's tokenizer.
        seed: the engine's seed (``run_seed``: ``rollout.seed``, else ``data.seed``, else 0).
        weights_from_actor: whether the actor in the same worker pushes its weights (vLLM loads them from the
            model path otherwise).
    Returns:
        ``HFRollout`` (``use_remove_padding`` set from ``model.use_remove_padding``), ``VLLMRollout``, or an
        ``AgentRollout`` around the hf engine.
    Raises:
        ValueError: for a ``rollout.name`` other than ``hf``/``vllm``, or agent loops on an engine other than hf.
    """
    arr = config.actor_rollout_ref
    rcfg = arr.rollout
    name = rcfg.name
    if name == "hf":
        module = build_engine_copy(arr.model, arr.actor.fsdp_config)
        rollout = HFRollout(module, tokenizer, rcfg, seed=seed, rank=rank())
        rollout.use_remove_padding = bool(arr.model.use_remove_padding)  # a packed prefill
    elif name == "vllm":
        # lazy: vllm is an optional dependency (requirements/vllm), needed only with rollout.name=vllm
        from rlhf_core.workers.rollout.vllm_rollout import VLLMRollout

        rollout = VLLMRollout(arr.model, tokenizer, rcfg, seed=seed, rank=rank(), weights_from_actor=weights_from_actor)
    else:
        raise ValueError(f"actor_rollout_ref.rollout.name={name!r}: use 'hf' or 'vllm'")
    from rlhf_core.workers.rollout.agent_rollout import AgentRollout, uses_agent_loop

    if uses_agent_loop(rcfg):  # rollout.mode=async / multi_turn.enable: agent-loop trajectories
        if name != "hf":
            raise ValueError("actor_rollout_ref.rollout.mode=async / multi_turn.enable run on rollout.name=hf; "
                             f"got {name!r}")
        from rlhf_core.workers.rollout.rollout_trace import rollout_tracer

        rollout = AgentRollout(rollout, tokenizer, rcfg, rollout_tracer(rcfg.trace, config.trainer, tokenizer))
    elif rcfg.trace.backend is not None:
        logger.warning("actor_rollout_ref.rollout.trace.backend=%r traces agent-loop trajectories only "
                       "(rollout.mode=async or multi_turn.enable); this rollout writes no traces",
                       rcfg.trace.backend)
    return rollout
