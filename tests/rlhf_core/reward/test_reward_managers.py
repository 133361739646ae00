"""Reward managers: naive scoring on the last valid token, extras, custom functions, the registry."""
from __future__ import annotations

import pickle
import textwrap

import pytest
import torch

from rlhf_core.reward import (
    NaiveRewardManager, get_reward_manager_cls, load_custom_reward_function, load_reward_manager,
)
from rlhf_core.reward.managers import decode_batch

from tests.fixtures.config_fixtures import typed_config
from tests.fixtures.reward_fixtures import CharTokenizer, make_batch

GSM = "openai/gsm8k"


def _config(**over):
    """The typed ppo_trainer config (naive manager, no custom function, reward_fn_key data_source) + ``over``."""
    cfg = typed_config("ppo_trainer")
    cfg.merge_with(over)
    return cfg


def test_naive_scores_on_last_valid_token_with_padding():
    tok = CharTokenizer()
    # Response 0 "#### 7" is 6 chars + EOS = 7 valid tokens → score at index 6; response 1 "#### 12" → 8 tokens,
    # index 7 (and it is wrong: 12 != 13 → 0); response 2 is right: "x #### 5" 8 chars + EOS → index 8.
    batch = make_batch(tok, ["Q1", "Q2", "longer Q3"], ["#### 7", "#### 12", "x #### 5"], ["7", "13", "5"], [GSM] * 3)
    out = load_reward_manager(_config(), tok)(batch, return_dict=True)
    reward = out["reward_tensor"]
    assert reward.dtype == torch.float32 and reward.shape == (3, 40)
    expected = torch.zeros(3, 40)
    expected[0, 6] = 1.0
    expected[2, 8] = 1.0
    assert torch.equal(reward, expected)
    assert out["reward_extra_info"] == {}  # the default scorer returns floats: no extras
    # without return_dict the tensor alone comes back (verl's default)
    assert torch.equal(NaiveRewardManager(tok)(batch), expected)


def test_decode_uses_masks_and_left_padded_prompt():
    tok = CharTokenizer()
    batch = make_batch(tok, ["Q1", "longer Q3"], ["#### 7", "ab"], ["7", "5"], [GSM] * 2)
    samples = decode_batch(batch, tok)
    assert [s.prompt_str for s in samples] == ["Q1", "longer Q3"]
    assert [s.response_str for s in samples] == ["#### 7", "ab"]  # EOS and padding dropped
    assert [s.valid_response_length for s in samples] == [7, 3]
    assert samples[1].ground_truth == "5" and samples[1].extra_info == {"index": 1}


def _write_scorer(tmp_path, body: str, name: str = "scorer.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_dict_scores_become_extra_info_lists(tmp_path):
    path = _write_scorer(tmp_path, """
        def my_score(data_source, solution_str, ground_truth, extra_info=None):
            ok = solution_str.strip() == ground_truth
            out = {"score": 2.0 if ok else -1.0, "pred": solution_str.strip()}
            if extra_info["index"] == 0:
                out["acc"] = ok          # only the first sample reports acc
            return out
    """)
    tok = CharTokenizer()
    batch = make_batch(tok, ["a", "b"], ["yes", "no"], ["yes", "yes"], ["anything"] * 2)
    cfg = _config(custom_reward_function={"path": path, "name": "my_score"})
    out = load_reward_manager(cfg, tok)(batch, return_dict=True)
    # "yes" + EOS = 4 tokens → index 3 gets 2.0; "no" + EOS = 3 tokens → index 2 gets -1.0
    assert out["reward_tensor"][0, 3] == 2.0 and out["reward_tensor"][1, 2] == -1.0
    assert out["reward_tensor"].sum() == 1.0
    info = out["reward_extra_info"]
    assert info["score"] == [2.0, -1.0] and info["pred"] == ["yes", "no"]
    assert info["acc"] == [True, None]  # a key a sample did not report is filled with None


def test_reward_fn_key_and_rm_scores_passthrough():
    tok = CharTokenizer()
    batch = make_batch(tok, ["a"], ["#### 7"], ["7"], ["ignored"])
    batch.non_tensors["source2"] = batch.non_tensors["data_source"].copy()
    batch.non_tensors["source2"][0] = GSM
    cfg = _config(data={"reward_fn_key": "source2"})
    assert load_reward_manager(cfg, tok)(batch).sum() == 1.0  # read the source from "source2"
    rm = torch.full((1, 40), 0.25)
    batch.tensors["rm_scores"] = rm
    assert load_reward_manager(cfg, tok)(batch) is rm  # a reward model already scored: returned unchanged


def test_batch_manager_scores_whole_batch_at_once(tmp_path):
    path = _write_scorer(tmp_path, """
        CALLS = []
        def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
            CALLS.append(len(solution_strs))
            return [float(len(s)) for s in solution_strs]
    """)
    tok = CharTokenizer()
    batch = make_batch(tok, ["a", "b"], ["xyz", "x"], ["", ""], ["d", "d"])
    manager = load_reward_manager(_config(reward_model={"reward_manager": "batch"},
                                          custom_reward_function={"path": path}), tok)
    reward = manager(batch)
    # one call for both rows; "xyz"+EOS → score 3.0 at index 3, "x"+EOS → 1.0 at index 1
    assert manager.compute_score._fn.__globals__["CALLS"] == [2]
    assert reward[0, 3] == 3.0 and reward[1, 1] == 1.0 and reward.sum() == 4.0


def test_registry_and_unknown_manager():
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    assert get_reward_manager_cls("prime").__name__ == "PrimeRewardManager"
    with pytest.raises(ValueError, match="naive"):
        load_reward_manager(_config(reward_model={"reward_manager": "fancy"}), CharTokenizer())


def test_custom_function_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does_not_exist.py"):
        load_custom_reward_function(str(tmp_path / "does_not_exist.py"))
    path = _write_scorer(tmp_path, """
        def other(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
    """)
    with pytest.raises(AttributeError, match=r"no function 'compute_score'.*other"):
        load_custom_reward_function(path)


def test_custom_function_pickles_by_path_and_gets_kwargs(tmp_path):
    path = _write_scorer(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            return float(solution_str == ground_truth) + bonus
    """)
    fn = load_custom_reward_function(path, reward_kwargs={"bonus": 0.5})
    clone = pickle.loads(pickle.dumps(fn))  # travels as (path, name, kwargs) and re-imports the file
    assert clone._fn is None
    assert clone("d", "a", "a") == 1.5 and fn("d", "a", "b") == 0.5


def test_naive_with_real_tiny_tokenizer(tiny_tokenizer):
    # The project's tiny BPE tokenizer round-trips text exactly, so decoding the padded ids gives the answers back.
    tok = tiny_tokenizer
    assert tok.pad_token_id is not None and tok.eos_token_id is not None
    responses = ["She pays 3 + 4 = 7 dollars.\n#### 7", "#### 8"]
    batch = make_batch(tok, ["How much?", "And now?"], responses, ["7", "7"], [GSM, GSM], p_len=16, t_len=32)
    out = NaiveRewardManager(tok)(batch, return_dict=True)
    lengths = batch["response_mask"].sum(-1)
    assert [s.response_str for s in decode_batch(batch, tok)] == responses
    assert out["reward_tensor"][0, lengths[0] - 1] == 1.0  # right answer on its last valid (EOS) token
    assert out["reward_tensor"].sum() == 1.0  # the second answer (8) is wrong
