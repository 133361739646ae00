"""``rlhf generate`` (verl ``main_generation``): a tiny model writes verl's responses parquet, ``rlhf eval`` scores it.

The model is the session's tiny Qwen2 (tests/conftest.py); the prompts a verl-schema parquet with chat-message
prompts, two data sources and a custom reward function whose score the test can derive by hand.
"""
from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlhf_core.config import ConfigError, load_config
from rlhf_core.data import DataError
from tests.rlhf_cli.test_cli import rlhf

QUESTIONS = ["What is 2 plus 3?", "Natalia sold clips to 48 friends.", "How many eggs are left?"]
# score 1 when the ground truth occurs in the response: "" occurs in every string (src_a scores 1 on every
# response); a NUL character never occurs in decoded text of this tokenizer (src_b scores 0)
REWARD = "def compute_score(data_source, solution_str, ground_truth):\n    return float(ground_truth in solution_str)\n"
NEVER = "\x00never"


def prompts_parquet(path, questions=QUESTIONS) -> str:
    """verl RL schema: chat-message prompts, data_source, reward_model.ground_truth, extra_info."""
    pd.DataFrame({
        "data_source": ["src_a", "src_b", "src_a"][: len(questions)],
        "prompt": [[{"role": "user", "content": q}] for q in questions],
        "ability": ["math"] * len(questions),
        "reward_model": [{"style": "rule", "ground_truth": ""}, {"style": "rule", "ground_truth": NEVER},
                         {"style": "rule", "ground_truth": ""}][: len(questions)],
        "extra_info": [{"index": i, "split": "test"} for i in range(len(questions))],
    }).to_parquet(path)
    return str(path)


def generation_overrides(model_dir, data, out, *extra: str) -> list[str]:
    return [f"data.path={data}", f"model.path={model_dir}", f"data.output_path={out}", "trainer.device=cpu",
            "rollout.dtype=float32", "rollout.response_length=12", "rollout.prompt_length=128", "data.batch_size=2",
            *extra]


def greedy_reference(model_dir, question: str, max_new_tokens: int) -> str:
    """The response HF ``generate`` gives, greedy, for one prompt rendered with the chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                   tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.slow  # two fresh interpreters (torch, transformers): 31 s at load average 11, 98 s at 21, on 2 cores
def test_rlhf_generate_writes_verl_responses_and_rlhf_eval_scores_them(tiny_model_dir, tmp_path):
    data = prompts_parquet(tmp_path / "test.parquet")
    out = tmp_path / "gen" / "responses.parquet"
    done = rlhf("generate", *generation_overrides(tiny_model_dir, data, out, "data.n_samples=3",
                                                  "rollout.do_sample=False"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"responses written: {out}" in done.stdout

    written = pq.read_table(out)
    source = pq.read_table(data)
    assert written.column_names == source.column_names + ["responses"]  # the input rows, unchanged, plus responses
    assert written.drop_columns(["responses"]).equals(source)
    assert written.schema.field("responses").type.value_type == pa.string()  # list<string>, as pandas writes it
    responses = written.column("responses").to_pylist()
    assert [len(r) for r in responses] == [3, 3, 3]  # data.n_samples per prompt
    assert all(len(set(r)) == 1 for r in responses)  # greedy: the three samples of a prompt are identical
    # and each is what HF generate gives greedily for that prompt (chat template, 12 tokens, special tokens skipped)
    assert [r[0] for r in responses] == [greedy_reference(tiny_model_dir, q, 12) for q in QUESTIONS]

    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    scored = rlhf("eval", f"data.path={out}", f"custom_reward_function.path={reward}", "ray_init.num_cpus=1")
    assert scored.returncode == 0, scored.stderr[-2000:]
    metrics = json.loads(scored.stdout)
    # src_a: rows 0 and 2, every response contains "" -> 1.0; src_b: row 1, no response contains a NUL -> 0.0
    assert metrics["test_score/src_a"] == 1.0 and metrics["test_score/src_b"] == 0.0
    assert metrics["pass@3/num_prompts/src_a"] == 2 and metrics["pass@3/num_prompts/src_b"] == 1
    assert metrics["pass@3/src_a"] == 1.0 and metrics["pass@1/src_b"] == 0.0


def test_sampling_is_seeded_and_repeats_each_prompt(tiny_model_dir, tmp_path):
    from rlhf_core.trainer.main_generation import run_generation

    data = prompts_parquet(tmp_path / "test.parquet", QUESTIONS[:2])
    runs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        path = run_generation(load_config("generation", generation_overrides(
            tiny_model_dir, data, tmp_path / f"{name}.parquet", "data.n_samples=4", "rollout.temperature=1.0",
            "rollout.top_k=0", "rollout.top_p=1.0", f"rollout.seed={seed}")))
        runs.append(pq.read_table(path).column("responses").to_pylist())
    assert [len(r) for r in runs[0]] == [4, 4]
    assert runs[0] == runs[1]  # same rollout.seed: the same responses
    assert runs[0] != runs[2]  # another seed: other responses (12 tokens sampled from ~1000 at temperature 1)
    assert len(set(runs[0][0])) > 1  # the 4 samples of a prompt are drawn independently


def test_bad_input_is_named_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    import rlhf_core.trainer.main_generation as gen

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(gen, "load_causal_lm", no_load)
    out = tmp_path / "out.parquet"
    strings = tmp_path / "strings.parquet"
    pd.DataFrame({"prompt": ["What is 2 plus 3?"], "data_source": ["a"]}).to_parquet(strings)
    with pytest.raises(DataError, match=r"strings.parquet row 0: field 'prompt' must be a non-empty list of chat"):
        gen.run_generation(load_config("generation", generation_overrides(tiny_model_dir, strings, out)))
    with pytest.raises(DataError, match=r"no column data.prompt_key='question'"):
        gen.run_generation(load_config("generation", generation_overrides(
            tiny_model_dir, prompts_parquet(tmp_path / "p.parquet"), out, "data.prompt_key=question")))
    with pytest.raises(DataError, match=r"p.parquet row 0: the prompt has \d+ tokens .* rollout.prompt_length=4"):
        gen.run_generation(load_config("generation", generation_overrides(
            tiny_model_dir, tmp_path / "p.parquet", out, "rollout.prompt_length=4")))
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        gen.run_generation(load_config("generation", generation_overrides(
            tiny_model_dir, tmp_path / "missing.parquet", out)))
    with pytest.raises(ConfigError, match=r"model.path='.*empty'.*no config.json"):
        (tmp_path / "empty").mkdir()
        gen.run_generation(load_config("generation", generation_overrides(
            tmp_path / "empty", tmp_path / "p.parquet", out)))
    assert not out.exists()


def test_bad_keys_are_one_line_on_the_command_line(tmp_path):
    done = rlhf("generate", "rollout.temperature=0", "data.n_samples=2", f"data.path={tmp_path / 'x.parquet'}")
    assert done.returncode == 1
    assert "rollout.temperature=0 needs data.n_samples=1 (got 2)" in done.stderr
    assert "Traceback" not in done.stderr
    done = rlhf("generate", "data.n_smaples=2")
    assert done.returncode == 1 and "Did you mean 'data.n_samples'?" in done.stderr


def test_calculate_log_probs_writes_each_response_tokens_log_prob(tiny_model_dir, tmp_path, monkeypatch):
    """rollout.calculate_log_probs: a rollout_log_probs column, per row n_samples lists with one float per response
    token; at temperature 1 without top-k/top-p cuts each is log softmax(logits)[token] of a plain HF forward over the
    prompt and the response so far (teacher forcing on the engine's own ids, recorded from its output batch)."""
    import rlhf_core.trainer.main_generation as gen
    from transformers import AutoModelForCausalLM

    batches = []
    decode = gen.decode_responses
    monkeypatch.setattr(gen, "decode_responses", lambda out, tok: batches.append(out) or decode(out, tok))
    data = prompts_parquet(tmp_path / "test.parquet", QUESTIONS[:2])
    path = gen.run_generation(load_config("generation", generation_overrides(
        tiny_model_dir, data, tmp_path / "lp.parquet", "data.n_samples=2", "rollout.calculate_log_probs=True",
        "rollout.temperature=1.0", "rollout.top_k=0", "rollout.top_p=1.0")))
    table = pq.read_table(path)
    assert table.schema.field("rollout_log_probs").type == pa.list_(pa.list_(pa.float32()))
    column = table.column("rollout_log_probs").to_pylist()
    (out,) = batches  # 2 prompts x 2 samples, batch_size=2: one engine call of 4 rows, prompt-major
    P = out["prompts"].shape[1]
    T = out["responses"].shape[1]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                       position_ids=out["position_ids"]).logits[:, P - 1:P + T - 1]
    expected = torch.log_softmax(logits, -1).gather(-1, out["responses"][..., None]).squeeze(-1)
    for row in range(2):
        for sample in range(2):
            i, mask = 2 * row + sample, out["response_mask"][2 * row + sample].bool()
            got = column[row][sample]
            assert len(got) == int(mask.sum()) > 0
            torch.testing.assert_close(torch.tensor(got), expected[i][mask], atol=1e-4, rtol=1e-4)
    assert "rollout_log_probs" not in pq.read_table(gen.run_generation(load_config("generation", generation_overrides(
        tiny_model_dir, data, tmp_path / "text.parquet")))).column_names  # default: text only, as verl's


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_is_named_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    import rlhf_core.trainer.main_generation as gen

    monkeypatch.setattr(gen, "load_causal_lm", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "out.parquet"
    with pytest.raises(ConfigError, match=r"^rollout.name='vllm' needs the 'vllm' package.*vllm_cpu_env.sh.* or "
                                          r"set rollout.name=hf"):
        gen.run_generation(load_config("generation", generation_overrides(
            tiny_model_dir, prompts_parquet(tmp_path / "p.parquet"), out, "rollout.name=vllm")))
    assert not out.exists()


def test_vllm_keys_reach_the_engine_arguments(tmp_path):
    """generation.yaml's rollout keys, as engine_kwargs hands them to vllm.LLM (the engine itself reads them back in
    tests/rlhf_core/workers/test_generation_vllm_cpu.py, in the vLLM venv); keys generation.yaml lacks take
    ppo_trainer.yaml's defaults."""
    from rlhf_core.trainer.main_generation import engine_config
    from rlhf_core.workers.rollout.vllm_rollout import engine_kwargs

    cfg = load_config("generation", [f"model.path={tmp_path}", "rollout.name=vllm", "rollout.prompt_length=40",
                                     "rollout.response_length=24", "rollout.max_model_len=100",
                                     "rollout.max_num_seqs=7", "rollout.max_num_batched_tokens=300",
                                     "rollout.disable_log_stats=False", "rollout.enforce_eager=False",
                                     "rollout.load_format=dummy_dtensor", "rollout.gpu_memory_utilization=0.3",
                                     "rollout.tensor_model_parallel_size=1"])
    model, rollout = engine_config(cfg)
    kw = engine_kwargs(model, rollout, seed=0, weights_from_actor=False)
    assert kw["max_model_len"] == 100 and kw["max_num_seqs"] == 7 and kw["max_num_batched_tokens"] == 300
    assert kw["disable_log_stats"] is False and kw["enforce_eager"] is False
    assert kw["gpu_memory_utilization"] == 0.3 and kw["tensor_parallel_size"] == 1
    assert kw["load_format"] == "auto"  # dummy_*: random weights nothing would replace; model.path's instead
    assert kw["model"] == str(tmp_path) and kw["trust_remote_code"] is False
    # not in generation.yaml: ppo_trainer.yaml's defaults
    assert kw["enable_prefix_caching"] is True and kw["skip_tokenizer_init"] is True
    assert kw["logprobs_mode"] == "processed_logprobs"
    kw = engine_kwargs(*engine_config(load_config("generation", [f"model.path={tmp_path}", "rollout.name=vllm",
                                                                 "rollout.load_format=safetensors"])), seed=0,
                       weights_from_actor=False)
    assert kw["load_format"] == "safetensors" and kw["max_model_len"] == 1536 + 512  # null: prompt + response
