"""FSDP2 workers (see ``docs/ARCHITECTURE.md`` → Workers).

* ``fsdp_workers``: ``ActorRolloutRefWorker(config, role)`` and ``CriticWorker(config)`` — the Ray-hosted entry
  points (one instance per rank, every method takes this rank's shard).
* ``actor`` / ``critic``: ``DataParallelPPOActor`` / ``DataParallelPPOCritic`` — forward and update loops.
* ``batching``: mini/micro-batches, dynamic batch size by token budget, global token counts.
* ``fsdp_utils`` / ``model_setup`` / ``optim``: FSDP2 wrapping, model + optimizer + LR schedule construction.
* ``rollout/``: ``hf_rollout.HFRollout`` and ``vllm_rollout.VLLMRollout`` (hybrid engine weight sync).
* ``checkpoint``: sharded DCP checkpoints; ``merger``: checkpoint → plain Hugging Face directory.
"""
