"""A generative reward model (LLM judge) served by the hf engine on 127.0.0.1 (rlhf_core/workers/genrm_server.py,
genrm.py): a verl 0.9-style reward function (tests/data/genrm/genrm_reward_fn.py) reaches the judge through
``reward_router_address`` and parses its reply; the engine keys are the request defaults; bad input is refused
before any model loads."""
from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from tests.fixtures.genrm_fixtures import constant_judge
from rlhf_core.config import load_config
from rlhf_core.config.errors import ConfigError
from rlhf_core.reward import load_custom_reward_function
from rlhf_core.reward.genrm import check_judge_model, check_reward_function, engine_settings, genrm_enabled
from rlhf_core.workers.genrm_server import GenRMServer, JudgeDefaults, JudgeEngine, genrm_kwargs, judge_defaults

FN = str(Path(__file__).resolve().parents[2] / "data" / "genrm" / "genrm_reward_fn.py")


@pytest.fixture(scope="module")
def judge(tiny_model_dir):
    """The tiny model as a judge, greedy by default (do_sample=False), 12 new tokens by default, float32."""
    engine = JudgeEngine(tiny_model_dir, JudgeDefaults(do_sample=False, response_length=12, dtype="float32",
                                                       max_model_len=400))
    with GenRMServer(engine) as server:
        yield server


def _post(server, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{server.address}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _greedy_reply(engine: JudgeEngine, content: str, max_new_tokens: int) -> str:
    """The judge's greedy reply through transformers' own ``generate`` (not the server's decode loop)."""
    tok, model = engine.tokenizer, engine.model
    text = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=engine.eos_ids, pad_token_id=tok.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    cut = next((i for i, t in enumerate(new) if t in engine.eos_ids), len(new))
    return tok.decode(new[:cut], skip_special_tokens=True)


def test_a_verl_style_reward_function_scores_with_the_judges_greedy_reply(judge):
    fn = load_custom_reward_function(FN, "compute_score_genrm", genrm_kwargs(judge))
    question = "Natalia sold clips to 48 of her friends in April. How many clips did she sell?"
    result = fn(data_source="openai/gsm8k", solution_str="She sold 48 + 24 = 72 clips. #### 72", ground_truth="72",
                extra_info={"question": question})  # an async def function, run to completion by the wrapper
    # the same prompt the function builds, answered greedily by model.generate: the server's reply must be its reply
    ns = runpy.run_path(FN)
    parse_score = ns["parse_score"]
    expected = _greedy_reply(judge.engine, ns["GRM_PROMPT_TEMPLATE"].format(
        problem=question, solution="She sold 48 + 24 = 72 clips. #### 72"), 12)
    assert result["genrm_response"] == expected and result["score"] == parse_score(expected)
    assert result["judge_vocab"] == len(judge.engine.tokenizer)  # reward_model_tokenizer is the judge's tokenizer


def test_a_judge_that_answers_7_scores_12(tiny_model_dir, tmp_path):
    # the rewired judge's greedy reply is "7" twelve times (the function asks max_tokens=12): 12 digits, score 12
    folder = constant_judge(tiny_model_dir, tmp_path / "judge")
    engine = JudgeEngine(folder, JudgeDefaults(dtype="float32"))
    # max_model_len null: the judge's max_position_embeddings (1024 for the tiny model), not NO_CONTEXT_LIMIT
    assert engine.max_model_len == json.loads((Path(folder) / "config.json").read_text())["max_position_embeddings"]
    with GenRMServer(engine) as server:
        fn = load_custom_reward_function(FN, "compute_score_genrm", genrm_kwargs(server))
        result = fn(data_source="x", solution_str="42", ground_truth="42", extra_info={"question": "6 * 7?"})
    assert result["genrm_response"] == "7" * 12
    assert result["score"] == 12


def test_engine_defaults_seed_and_limits(judge):
    msg = [{"role": "user", "content": "What is 2 + 3?"}]
    status, greedy = _post(judge, {"messages": msg, "temperature": 0, "max_tokens": 5})
    assert status == 200 and greedy["object"] == "chat.completion"
    # no temperature in the request: do_sample=False makes it greedy (the engine default); no max_tokens: 12
    status, default = _post(judge, {"messages": msg, "max_tokens": 5})
    assert default["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    _, long = _post(judge, {"messages": msg, "temperature": 0, "ignore_eos": True})
    assert long["usage"]["completion_tokens"] == 12 and long["choices"][0]["finish_reason"] == "length"
    # a request's seed makes a sampled reply reproducible; n replies in one request
    body = {"messages": msg, "temperature": 1.0, "max_tokens": 8, "seed": 7, "n": 3, "ignore_eos": True}
    (_, a), (_, b) = _post(judge, body), _post(judge, body)
    assert [c["message"]["content"] for c in a["choices"]] == [c["message"]["content"] for c in b["choices"]]
    assert len(a["choices"]) == 3 and a["usage"]["completion_tokens"] == 24
    # max_model_len=400 bounds prompt + completion (vLLM's 400); an unknown model is vLLM's 404
    status, err = _post(judge, {"messages": msg, "max_tokens": 400})
    assert status == 400 and "maximum context length is 400" in err["error"]["message"]
    assert _post(judge, {"messages": msg, "model": "other"})[0] == 404
    assert _post(judge, {"messages": msg, "model": judge.engine.path, "max_tokens": 2})[0] == 200
    assert _post(judge, {"messages": msg, "stream": True})[0] == 400  # not implemented: said, not ignored


SERVE_ONCE = """
import json, os, subprocess, sys, urllib.request
from rlhf_core.workers.genrm_server import GenRMServer, JudgeDefaults, JudgeEngine
with GenRMServer(JudgeEngine(sys.argv[1], JudgeDefaults(dtype="float32", response_length=3))) as server:
    address = server.address
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    mine = [line.split()[3] for line in listening if f"pid={os.getpid()}," in line]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    with urllib.request.urlopen(f"http://{server.address}/v1/chat/completions", data=body, timeout=60) as resp:
        usage = json.loads(resp.read())["usage"]
print(json.dumps({"address": address, "listening": mine, "usage": usage}))
"""


@pytest.mark.slow  # a new interpreter imports torch and transformers: 5-15 s
@pytest.mark.skipif(shutil.which("ss") is None, reason="ss is not installed")
def test_a_fresh_process_serves_on_127_0_0_1_only(tiny_model_dir):
    # a new interpreter (no test fixture has set anything up): the engine registers its kernels itself, and the
    # process's only listening socket is the judge's, on 127.0.0.1 (ss -ltnp, filtered by the process id)
    done = subprocess.run([sys.executable, "-c", SERVE_ONCE, tiny_model_dir], capture_output=True, text=True,
                          timeout=300, cwd=str(Path(__file__).resolve().parents[3]))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["address"].startswith("127.0.0.1:") and out["listening"] == [out["address"]]
    assert out["usage"]["completion_tokens"] <= 3


def test_genrm_mode_and_engine_keys_from_the_config():
    base = ["actor_rollout_ref.rollout.name=hf", "reward.reward_model.enable=True",
            "reward.reward_model.model_path=/x/judge", f"reward.custom_reward_function.path={FN}"]
    engine = "reward.reward_model.rollout."
    cfg = load_config("ppo_trainer", base + [f"{engine}{k}" for k in (
        "name=hf", "temperature=0.5", "top_k=5", "top_p=0.9", "do_sample=False", "ignore_eos=True", "seed=3",
        "max_model_len=300", "dtype=float32", "response_length=32")] + ["reward_model.rollout.response_length=64"])
    assert genrm_enabled(cfg)
    d = judge_defaults(cfg)
    # the legacy reward_model.rollout.response_length (not null) replaces the 0.9 key, as verl's migration does
    assert (d.temperature, d.top_k, d.top_p, d.do_sample, d.ignore_eos, d.seed, d.max_model_len, d.dtype,
            d.response_length) == (0.5, 5, 0.9, False, True, 3, 300, "float32", 64)
    legacy = load_config("ppo_trainer", base + ["reward_model.rollout.name=hf", "reward_model.rollout.dtype=bf16",
                                                "reward_model.rollout.max_model_len=128"])
    assert genrm_enabled(legacy) and engine_settings(legacy)["name"] == "hf"  # the legacy name alone turns it on
    assert (judge_defaults(legacy).dtype, judge_defaults(legacy).max_model_len) == ("bf16", 128)
    # without an engine name the reward model stays the discriminative one (0.6 behaviour)
    assert not genrm_enabled(load_config("ppo_trainer", base))
    with pytest.raises(ConfigError, match="reward.reward_model.rollout.name"):
        load_config("ppo_trainer", base + ["reward.reward_model.rollout.name=vllm"])


def test_bad_input_is_refused_before_any_model_loads(tmp_path):
    wrong = load_custom_reward_function(FN, "compute_score_wrong_signature")
    with pytest.raises(ConfigError, match=r"lacks \['reward_router_address', 'reward_model_tokenizer'\]"):
        check_reward_function(wrong)
    check_reward_function(load_custom_reward_function(FN, "compute_score_genrm"))  # verl's signature passes
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"]}))
    with pytest.raises(ConfigError, match="not a generative one"):
        check_judge_model(str(tmp_path))
    # max_model_len 0 would refuse every request (it used to fall back to max_position_embeddings silently)
    with pytest.raises(ValueError, match=r"max_model_len=0 must be >= 1"):
        JudgeEngine(str(tmp_path), JudgeDefaults(max_model_len=0))  # tmp_path holds no model: nothing loaded


@pytest.mark.parametrize("manager", ["naive", "remote", "rate_limited"])
def test_every_manager_hands_the_judge_to_the_function(judge, manager):
    # the reward managers call the verl-style async function with the judge's address and tokenizer: in this process
    # (naive), in reward.num_workers other processes (remote: the arguments are pickled), in threads (rate_limited)
    from tests.fixtures.reward_fixtures import CharTokenizer, make_batch
    from rlhf_core.reward import load_reward_manager

    cfg = load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=hf", f"custom_reward_function.path={FN}",
                                      "custom_reward_function.name=compute_score_genrm",
                                      f"reward_model.reward_manager={manager}", "reward.num_workers=1",
                                      "reward.max_concurrent=2"])
    tok = CharTokenizer()
    batch = make_batch(tok, ["q1", "q2"], ["12", "x"], ["12", "1"], ["openai/gsm8k"] * 2)
    reward_fn = load_reward_manager(cfg, tok, reward_fn_kwargs=genrm_kwargs(judge))
    try:
        out = reward_fn(batch, return_dict=True)
    finally:
        getattr(reward_fn, "close", lambda: None)()
    replies = out["reward_extra_info"]["genrm_response"]
    # both samples were judged (the tiny judge's greedy replies), and each score is the parse of its own reply
    assert all(isinstance(r, str) for r in replies) and out["reward_extra_info"].get("reward_error", [0, 0]) == [0, 0]
    assert out["reward_extra_info"]["score"] == [sum(c.isdigit() for c in r) for r in replies]
