"""The rollout engine of ``rollout.mode: async`` (and of ``multi_turn.enable`` in sync mode): every row is an
agent-loop trajectory (:mod:`rlhf_core.agent`), its turns scheduled over the HF engine's model.

``mode: async`` schedules requests continuously (a finished request frees its slot at once); ``mode: sync`` with
``multi_turn.enable`` runs the same loops with static batches. Both sample each request from its own seeded
generator, so for the same seeds they give the same trajectories.

Partial rollouts (fully async, ``async_training.partial_rollout=True``): :meth:`AgentRollout.sync_weights` loads
between two decoding steps while the trajectories stay open (:mod:`rlhf_core.agent.pause`); the output's
``rollout_min_version`` / ``rollout_max_version (B,)`` int64 (when ``batch.meta["report_weight_versions"]``) are the weight loads (of this engine) under which each
trajectory's first and last tokens were sampled (verl's ``min_global_steps`` / ``max_global_steps``).
"""
from __future__ import annotations

import torch

from rlhf_core.agent.engine import SamplingParams, StepEngine
from rlhf_core.agent.interactions import load_interactions
from rlhf_core.agent.manager import AgentLoopManager
from rlhf_core.agent.pause import WeightGate
from rlhf_core.agent.registry import load_agent_loop_specs, settings_from_config, uses_agent_loop  # noqa: F401
from rlhf_core.protocol import Batch
from rlhf_core.tools.function_tool import load_all_tools
from rlhf_core.workers.rollout.hf_rollout import HFRollout
from rlhf_core.workers.rollout.postprocess import sampling_call_index, sampling_params


class AgentRollout:
    """Wraps an :class:`HFRollout` (``rollout.name: hf``; with ``vllm`` the worker keeps vLLM's own rollout) (its model copy, weight sync, EOS and pad ids) and generates with agent loops.

    Tools (``multi_turn.tool_config_path`` and ``multi_turn.function_tool_path``), interactions
    (``multi_turn.interaction_config_path``) and loop classes (``agent.agent_loop_config_path``) load here, at worker start, so a bad config fails before any step.

    Raises:
        ToolConfigError, InteractionConfigError, AgentConfigError: see
            :func:`~rlhf_core.tools.function_tool.load_all_tools`, :func:`load_interactions`, :func:`load_agent_loop_specs`.
    """

    def __init__(self, hf_rollout: HFRollout, tokenizer, rollout_cfg, tracer=None) -> None:
        self.hf = hf_rollout
        self.tracer = tracer  # rollout.trace.backend: rollout_trace.MlflowRolloutTracer, or None
        self.tokenizer = tokenizer
        self.config = rollout_cfg
        self.schedule = "continuous" if str(rollout_cfg.mode) == "async" else "static"
        self.settings = settings_from_config(rollout_cfg)
        self.tools = load_all_tools(rollout_cfg.multi_turn.tool_config_path, rollout_cfg.multi_turn.function_tool_path)
        interaction_path = rollout_cfg.multi_turn.interaction_config_path
        self.interactions = load_interactions(interaction_path) if interaction_path else {}
        self.specs = load_agent_loop_specs(rollout_cfg.agent.agent_loop_config_path)
        self.default_agent_loop = str(rollout_cfg.agent.default_agent_loop)
        self.max_num_seqs = int(rollout_cfg.max_num_seqs)
        self.num_workers = int(rollout_cfg.agent.num_workers)
        if self.num_workers < 1:
            raise ValueError(f"actor_rollout_ref.rollout.agent.num_workers must be >= 1, got {self.num_workers}")
        self.calls = 0
        self.gate = WeightGate()

    @property
    def module(self):
        return self.hf.module

    def sync_weights(self, state_dict) -> None:
        """Load the actor's weights (:meth:`HFRollout.sync_weights`) between two decoding steps of a generation in
        flight (from another thread; its trajectories go on with them) or at once when none is."""
        self.gate.load(lambda: self.hf.sync_weights(state_dict))

    def interrupt(self) -> None:
        """Start no further decoding step until the next :meth:`sync_weights` (thread-safe)."""
        self.gate.interrupt()

    def release(self) -> None:
        """Undo :meth:`interrupt` without a load (the sync failed; the generation goes on)."""
        self.gate.release()

    def generate_sequences(self, batch: Batch) -> Batch:
        """One trajectory per row; output fields as :func:`rlhf_core.agent.layout.pack_trajectories`."""
        params = sampling_params(self.config, batch.meta)
        call, counted = sampling_call_index(self.calls, batch.meta)
        engine = StepEngine(self.hf.module, self.hf.eos_ids, self.hf.pad_token_id,
                            SamplingParams(params["do_sample"], params["temperature"], params["top_k"], params["top_p"],
                                           str(self.config.logprobs_mode)),
                            seed=self.hf.seed + 7919 * self.hf.rank + call, max_num_seqs=self.max_num_seqs,
                            schedule=self.schedule, gate=self.gate)
        manager = AgentLoopManager(engine, self.tokenizer, self.settings, self.tools, self.specs,
                                   self.default_agent_loop, self.hf.pad_token_id, self.interactions,
                                   num_workers=self.num_workers)
        was_training = self.hf.module.training
        self.hf.module.eval()
        call_id = manager.calls  # request ids are <call>/<row>[/turn<k>]
        try:
            out = manager.generate_sequences(batch)
        finally:
            self.hf.module.train(was_training)
        self.calls += int(counted)
        if batch.meta.get("report_weight_versions"):  # the fully async driver's partial rollouts
            out.tensors["rollout_min_version"], out.tensors["rollout_max_version"] = \
                _row_versions(engine.request_versions, call_id, len(batch))
        out.meta.update({"do_sample": params["do_sample"], "temperature": params["temperature"]})
        if self.tracer is not None:
            self.tracer.log(out)
        return out


def _row_versions(request_versions: dict, call: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row the first and last weight version of its requests (ids ``<call>/<row>`` or ``<call>/<row>/...``);
    a row that sampled nothing gets the version of the engine's earliest token (0 without any)."""
    lo, hi = [], []
    fallback = min((v[0] for v in request_versions.values()), default=0)
    for i in range(rows):
        own = [v for rid, v in request_versions.items() if rid == f"{call}/{i}" or rid.startswith(f"{call}/{i}/")]
        lo.append(min((v[0] for v in own), default=fallback))
        hi.append(max((v[1] for v in own), default=fallback))
    return torch.tensor(lo, dtype=torch.long), torch.tensor(hi, dtype=torch.long)
