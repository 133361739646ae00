"""Rollout engines: ``hf`` (transformers ``generate``, everywhere) and ``vllm`` (optional GPU/CPU extra)."""
