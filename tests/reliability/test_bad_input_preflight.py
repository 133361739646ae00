"""Issue 32, bad input that used to be accepted and then failed later (or trained wrongly): refused in one line naming
the file, key or value, before Ray starts or any model loads (``ppo_error`` / ``sft_error`` check that Ray is not
running and no checkpoint folder exists). Each defect is made for real on a copy of the tiny model or a real file."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlhf_core.config import ConfigError
from rlhf_core.data import DataError

from bad_input_fixtures import good_rows, ppo_error, ppo_overrides, verl_row, write_jsonl, write_parquet

WEIGHT_NAMES = "model.safetensors, model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json"


def _copy(tiny_model_dir: str, out: Path) -> Path:
    shutil.copytree(tiny_model_dir, out)
    return out


def _sft_overrides(model: str, train: str, *extra: str) -> list[str]:
    """Two ranks (so training would start Ray), 4-sample batches; checkpoints to ``ckpt/`` next to the data."""
    return [f"model.partial_pretrain={model}", f"data.train_files={train}", "data.val_files=null",
            "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2", "data.max_length=96",
            "data.truncation=right", "trainer.n_gpus_per_node=2", "trainer.device=cpu", "trainer.logger=[console]",
            f"trainer.default_local_dir={Path(train).parent / 'ckpt'}", "trainer.total_epochs=1", *extra]


def _sft_error(overrides: list[str], expected: type[BaseException]) -> str:
    """``run_sft``'s error; asserts it came before Ray started and before any checkpoint folder was made."""
    import ray

    from rlhf_core.config import load_config
    from rlhf_core.trainer.sft_trainer import run_sft

    with pytest.raises(expected) as info:
        run_sft(load_config("sft_trainer", overrides))
    assert not ray.is_initialized(), "the error came after Ray had started"
    ckpt = [o.partition("=")[2] for o in overrides if o.startswith("trainer.default_local_dir=")][-1]
    assert not Path(ckpt).exists(), "a checkpoint folder was created"
    return str(info.value)


def _sft_rows(tmp_path: Path, n: int) -> str:
    return write_jsonl(tmp_path / "sft.jsonl", [json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)})
                                                for i in range(n)])


# --- 1. model folders with missing or truncated weights --------------------------------------------------------------

def test_model_folder_without_weights_is_refused_before_ray(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path / "model")
    (model / "model.safetensors").unlink()  # config.json and tokenizer kept: a download that stopped half-way
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(str(model), data), ConfigError)
    assert msg == (f"actor_rollout_ref.model.path={str(model)!r}: no model weights in {model} (looked for "
                   f"{WEIGHT_NAMES}); the copy may be incomplete")


def test_truncated_safetensors_is_refused_before_ray(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path / "model")
    weights = model / "model.safetensors"
    whole = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: whole // 2])  # a copy cut short: the header is whole, the data not
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(str(model), data), ConfigError)
    # the header's declared length (8 + header + the last tensor's end offset) is the whole file's size
    assert msg == (f"actor_rollout_ref.model.path={str(model)!r}: {weights} is {whole // 2} bytes, but its header "
                   f"declares {whole} (truncated or damaged copy)")


def test_missing_shard_of_a_sharded_model_is_named(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = _copy(tiny_model_dir, tmp_path / "model")
    (model / "model.safetensors").unlink()
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(model, max_shard_size="200KB")
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2  # 555 KB of fp32 weights in shards of at most 200 KB
    (model / shards[-1]).unlink()
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(str(model), data, "algorithm.adv_estimator=gae",
                                  f"actor_rollout_ref.model.path={tiny_model_dir}"), ConfigError)
    assert msg == (f"critic.model.path={str(model)!r}: 1 of the {len(shards)} weight shards its index lists are "
                   f"missing in {model}: {shards[-1]}")


def test_truncated_bin_is_named_and_whole_files_pass(tiny_model_dir, tmp_path):
    import torch

    from rlhf_core.models.preflight import bin_problem, check_model_files, safetensors_problem

    check_model_files("k", tiny_model_dir)  # the control: the whole tiny model passes
    assert safetensors_problem(Path(tiny_model_dir) / "model.safetensors") is None
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(1000)}, path)
    assert bin_problem(path) is None
    data = path.read_bytes()
    path.write_bytes(data[:-100])  # the zip's end of central directory (the last 22+ bytes) is gone
    assert bin_problem(path) == f"{path} is {len(data) - 100} bytes and its zip archive has no end (truncated copy)"


def test_sft_model_without_weights_is_refused_before_ray(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path / "model")
    (model / "model.safetensors").unlink()
    msg = _sft_error(_sft_overrides(str(model), _sft_rows(tmp_path, 8)), ConfigError)
    assert msg.startswith(f"model.partial_pretrain={str(model)!r}: no model weights in {model}")
    # a folder that is not there names its key too (it was "model path '...' does not exist" alone)
    missing = tmp_path / "nope"
    msg = _sft_error(_sft_overrides(str(missing), _sft_rows(tmp_path, 8)), FileNotFoundError)
    assert msg == f"model.partial_pretrain={str(missing)!r}: model path {str(missing)!r} does not exist"


# --- 2. a tokenizer without a chat template -------------------------------------------------------------------------

def _without_chat_template(tiny_model_dir: str, out: Path) -> Path:
    model = _copy(tiny_model_dir, out)
    (model / "chat_template.jinja").unlink()
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    assert "chat_template" not in cfg  # transformers 5 keeps it in chat_template.jinja only
    return model


def test_tokenizer_without_chat_template_is_refused_before_ray(tiny_model_dir, tmp_path):
    model = _without_chat_template(tiny_model_dir, tmp_path / "model")
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(str(model), data), ConfigError)
    assert msg.startswith(f"actor_rollout_ref.model.path={str(model)!r}: the tokenizer has no chat template")
    assert "the prompts (data.prompt_key='prompt') are chat messages rendered with it" in msg


def test_separate_data_tokenizer_without_chat_template_is_named(tiny_model_dir, tmp_path):
    tok = _without_chat_template(tiny_model_dir, tmp_path / "tok")
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, f"data.tokenizer={tok}"), ConfigError)
    assert msg.startswith(f"data.tokenizer={str(tok)!r}: the tokenizer has no chat template")


def test_sft_tokenizer_without_chat_template_and_the_data_chat_template_key(tiny_model_dir, tmp_path):
    model = _without_chat_template(tiny_model_dir, tmp_path / "model")
    train = _sft_rows(tmp_path, 8)
    msg = _sft_error(_sft_overrides(str(model), train), ConfigError)
    assert msg.startswith(f"model.partial_pretrain={str(model)!r}: the tokenizer has no chat template")
    assert msg.endswith("set data.chat_template")
    # the control: with data.chat_template the run gets past this check, to the next one (3 rows < one batch)
    template = (Path(tiny_model_dir) / "chat_template.jinja").read_text()
    train3 = _sft_rows(tmp_path, 3)
    msg = _sft_error(_sft_overrides(str(model), train3, f"data.chat_template={json.dumps(template)}"), DataError)
    assert msg.startswith("data.train_batch_size=4 is larger than the 3 training rows")


# --- 3. learning rates, loss coefficients and temperatures that are negative or not finite -----------------------

@pytest.mark.parametrize("key, value, shown, extra", [
    ("actor_rollout_ref.actor.optim.lr", "-0.001", "-0.001", []),
    ("actor_rollout_ref.actor.optim.lr", "nan", "nan", []),
    ("actor_rollout_ref.actor.optim.lr", "inf", "inf", []),
    ("critic.optim.lr", "-inf", "-inf", ["algorithm.adv_estimator=gae"]),
])
def test_bad_ppo_learning_rate_names_the_key(tiny_model_dir, tmp_path, key, value, shown, extra):
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, *extra, f"{key}={value}"), ConfigError)
    assert f"{key}={shown} must be a finite number >= 0 (the optimizer's learning rate)." in msg


def test_bad_sft_learning_rate_and_zero_is_allowed(tiny_model_dir, tmp_path):
    from rlhf_core.config import load_config

    train = _sft_rows(tmp_path, 8)
    with pytest.raises(ConfigError, match=r"optim\.lr=-1e-05 must be a finite number >= 0"):
        load_config("sft_trainer", _sft_overrides(tiny_model_dir, train, "optim.lr=-1e-5"))
    assert load_config("sft_trainer", _sft_overrides(tiny_model_dir, train, "optim.lr=0")).optim.lr == 0


@pytest.mark.parametrize("key, value, shown, rule", [
    ("actor_rollout_ref.actor.clip_ratio", "nan", "nan", " >= 0 (the PPO clip range)"),
    ("actor_rollout_ref.actor.clip_ratio_low", "inf", "inf", " >= 0 (the lower PPO clip range)"),
    ("actor_rollout_ref.actor.clip_ratio_high", "-0.2", "-0.2", " >= 0 (the upper PPO clip range)"),
    ("actor_rollout_ref.actor.clip_ratio_c", "inf", "inf", " > 1 (the dual-clip bound)"),
    ("actor_rollout_ref.actor.clip_ratio_c", "1.0", "1.0", " > 1 (the dual-clip bound)"),
    ("algorithm.kl_ctrl.kl_coef", "nan", "nan", " (the in-reward KL coefficient)"),
    ("actor_rollout_ref.actor.kl_loss_coef", "inf", "inf", " (the KL loss coefficient)"),
    ("actor_rollout_ref.actor.entropy_coeff", "-inf", "-inf", " (the entropy bonus coefficient)"),
    ("actor_rollout_ref.rollout.temperature", "nan", "nan", " >= 0 (the sampling temperature; 0 = greedy)"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", "inf", "inf",
     " >= 0 (the sampling temperature; 0 = greedy)"),
])
def test_non_finite_loss_and_sampling_values_name_the_key(tiny_model_dir, tmp_path, key, value, shown, rule):
    # nan or inf in a clip range, a KL or entropy coefficient or a temperature makes every loss or log-prob NaN at
    # the first step; the one rule over a table of keys names each at config load, as the learning rate is named
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, f"{key}={value}"), ConfigError)
    assert msg == f"Invalid config:\n  - {key}={shown} must be a finite number{rule}."


def test_zero_temperatures_and_coefficients_are_allowed(tiny_model_dir, tmp_path):
    # the control: greedy sampling (temperature 0, as verl's val_kwargs default), no KL and no entropy bonus, a
    # negative entropy coefficient and a dual-clip bound just above 1 all load
    from rlhf_core.config import load_config

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    cfg = load_config("ppo_trainer", ppo_overrides(
        tiny_model_dir, data, "actor_rollout_ref.rollout.temperature=0",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0", "algorithm.kl_ctrl.kl_coef=0",
        "actor_rollout_ref.actor.kl_loss_coef=0", "actor_rollout_ref.actor.entropy_coeff=-0.01",
        "actor_rollout_ref.actor.clip_ratio_c=1.01"))
    assert (cfg.actor_rollout_ref.rollout.temperature, cfg.actor_rollout_ref.actor.clip_ratio_c) == (0, 1.01)
    assert cfg.actor_rollout_ref.actor.entropy_coeff == -0.01


# --- 4. a rollout KV cache that cannot fit --------------------------------------------------------------------------

def test_kv_cache_bytes_hand_derived():
    from rlhf_core.models.kv_cache import Geometry, geometry, kv_cache_bytes

    # Qwen2.5-7B: 28 layers, 28 heads of 128 (hidden 3584), 4 kv heads; bf16: 2 x 28 x 4 x 128 x 2 = 57,344 B/token
    qwen7b = geometry({"num_hidden_layers": 28, "num_attention_heads": 28, "hidden_size": 3584,
                       "num_key_value_heads": 4})
    assert qwen7b == Geometry(28, 0, None, 4, 128)
    assert kv_cache_bytes(qwen7b, 2, seq_len=1, sequences=1) == 57_344
    # 1024 + 1024 tokens x 512 sequences: 57,344 x 2048 x 512 B = 56 GiB exactly; tp 2 halves the kv heads
    assert kv_cache_bytes(qwen7b, 2, 2048, 512) == 56 * 1024 ** 3
    assert kv_cache_bytes(qwen7b, 2, 2048, 512, tp=2) == 28 * 1024 ** 3
    # sliding layers keep at most the window: 2 full layers x 100 tokens + 2 sliding x 10 = 220 token-layers, x 2 x 1
    # kv head x 8 x 4 bytes = 14,080 B
    sliding = geometry({"num_hidden_layers": 4, "num_attention_heads": 2, "head_dim": 8, "num_key_value_heads": 1,
                        "sliding_window": 10, "layer_types": ["full_attention", "sliding_attention"] * 2})
    assert kv_cache_bytes(sliding, 4, 100, 1) == 14_080
    assert geometry({"num_hidden_layers": 2}) is None  # not enough to estimate: the check is skipped


def test_hf_rollout_kv_cache_too_big_is_refused_before_ray(tiny_model_dir, tmp_path):
    # tiny model: 2 layers x 2 kv heads x head_dim 16 (64 / 4 heads) x 4 bytes (fp32) x 2 (k, v) = 512 B per token;
    # (64 + 32,768) tokens x 4 prompts x 16,384 samples = 65,536 sequences: 512 x 32,832 x 65,536 B = 1026.0 GiB
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, "data.max_response_length=32768", "trainer.device=cpu",
                                  "actor_rollout_ref.rollout.n=16384"), ConfigError)
    assert msg.startswith("the rollout's KV cache at full length needs 1026.0 GiB, more than this machine's available "
                          "memory (")
    assert ("2 (k, v) x 2 layers x 2 kv heads x head_dim 16 x 4 bytes (float32) x (data.max_prompt_length=64 + "
            "data.max_response_length=32768 tokens) x 65536 sequences in flight (data.train_batch_size=4 x "
            "actor_rollout_ref.rollout.n=16384 = 65536 / 1 nodes); lower data.train_batch_size or "
            "actor_rollout_ref.rollout.n or the lengths") in msg


def test_vllm_kv_cache_of_one_sequence_over_the_cpu_space(tmp_path, monkeypatch):
    from rlhf_core.config import load_config
    from rlhf_core.models.kv_cache import check_rollout_kv_cache

    # a Qwen2.5-7B config.json (no weights needed: only the config is read). vLLM on CPU runs fp32: 2 x 28 x 4 x 128
    # x 4 = 114,688 B per token; one sequence of 1024 + 16,384 tokens: 114,688 x 17,408 B = 1.86 GiB > 1 GiB
    model = tmp_path / "qwen7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 28, "num_attention_heads": 28,
                                                   "hidden_size": 3584, "num_key_value_heads": 4}))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    base = [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu",
            "data.max_prompt_length=1024", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n=1"]
    cfg = load_config("ppo_trainer", base + ["data.max_response_length=16384"])
    with pytest.raises(ConfigError) as info:
        check_rollout_kv_cache(cfg, None)
    assert str(info.value).startswith("the rollout's KV cache at full length needs 1.9 GiB, more than vLLM's CPU KV "
                                      "cache (VLLM_CPU_KVCACHE_SPACE=1 GiB) (1.0 GiB)")
    assert str(info.value).endswith("x 1 sequence (the least the engine runs); raise VLLM_CPU_KVCACHE_SPACE or "
                                    "lower the lengths")
    # 1024 + 7168 tokens: 114,688 x 8192 B = 0.875 GiB fits
    check_rollout_kv_cache(load_config("ppo_trainer", base + ["data.max_response_length=7168"]), None)


def test_realistic_tiny_run_passes_the_kv_check(tiny_model_dir, tmp_path):
    # the control: the tiny GRPO config of these tests (4 x 2 sequences of 72 tokens: 294,912 B) and its validation
    from rlhf_core.config import load_config
    from rlhf_core.models.kv_cache import check_rollout_kv_cache

    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    check_rollout_kv_cache(load_config("ppo_trainer", ppo_overrides(tiny_model_dir, data, "trainer.device=cpu")), 1319)


# --- 5. config files that are not valid YAML or not a mapping -------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("data:\n  train_batch_size: 4\n   bad: [1, 2\n", "{path} line 3, column 7: not valid YAML: mapping values are "
                                                    "not allowed here"),
    ("data:\n\ttrain_batch_size: 4\n", "{path} line 2, column 1: not valid YAML: found character '\\t' that cannot "
                                       "start any token (while scanning for the next token)"),
    ("- data.train_batch_size=4\n", "{path}: must hold a mapping of 'key: value' lines at the top level, got a list"),
    ("data.train_batch_size=4\n", "{path}: must hold a mapping of 'key: value' lines at the top level, got a str"),
    # a key given twice (PyYAML would keep the last silently; OmegaConf wrote 4 lines): the dotted key and both lines
    ("trainer:\n  total_epochs: 2\nalgorithm:\n  adv_estimator: grpo\ntrainer:\n  total_epochs: 3\n",
     "{path}: duplicate key 'trainer' (lines 1 and 5): keep one of them"),
    ("algorithm:\n  kl_ctrl:\n    kl_coef: 0.1\n    type: fixed\n    kl_coef: 0.2\n",
     "{path}: duplicate key 'algorithm.kl_ctrl.kl_coef' (lines 3 and 5): keep one of them"),
    # a value where the shipped config has a section (merged, it deleted every key of it: 32 lines)
    ("algorithm:\n  adv_estimator: grpo\ntrainer: 5\n",
     "{path}: trainer is a section of ppo_trainer.yaml (keys such as trainer.total_epochs, "
     "trainer.total_training_steps), not a value: got trainer: 5; set its keys on the lines below it, indented, "
     "or remove the line"),
    ("algorithm:\n  kl_ctrl:\n", "{path}: algorithm.kl_ctrl is a section of ppo_trainer.yaml (keys such as "
     "algorithm.kl_ctrl.type, algorithm.kl_ctrl.kl_coef), not a value: got algorithm.kl_ctrl: null; set its keys on "
     "the lines below it, indented, or remove the line"),
], ids=["bad_indent", "tab", "list", "scalar", "duplicate", "nested_duplicate", "value_for_section",
        "empty_section"])
def test_rlhf_config_check_names_the_bad_yaml_file(tmp_path, capsys, text, expected):
    from rlhf_core.config.cli import main

    path = tmp_path / "my_ppo.yaml"
    path.write_text(text)
    assert main(["check", "--config-name", str(path)]) == 1
    assert capsys.readouterr().err == f"rlhf config: error: {expected.format(path=path)}\n"


def test_a_broken_shipped_config_in_config_dir_is_named(tmp_path, capsys):
    from rlhf_core.config import config_dir
    from rlhf_core.config.cli import main

    for f in Path(config_dir()).glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "ppo_trainer.yaml").write_text("data: {train_batch_size: 4\n")  # the flow mapping never closes
    assert main(["check", "--config-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"rlhf config: error: {tmp_path / 'ppo_trainer.yaml'} line 2, column 1: not valid YAML: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("text, expected", [
    ("name: mine\nppo:\n  - a=1\n  b: 2\n", "{path} line 4, column 3: not valid YAML: expected <block end>, but found "
                                             "'?' (while parsing a block collection)"),
    ("name: mine\ndata: {generator: countdown}\nppo:\n  total_steps: 5\n  total_steps: 6\n",
     "{path}: duplicate key 'ppo.total_steps' (lines 4 and 5): keep one of them"),
], ids=["not_yaml", "duplicate"])
def test_a_broken_experiment_file_is_named(tmp_path, text, expected):
    from flows.experiment import load_experiment

    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert str(info.value) == expected.format(path=path)


# --- 6. a dataset smaller than one batch ----------------------------------------------------------------------------

def test_rows_left_after_filtering_below_one_batch_are_refused_before_ray(tiny_model_dir, tmp_path):
    # 5 rows, 2 of them longer than data.max_prompt_length=64 tokens: filter_overlong_prompts leaves 3 < 4
    rows = good_rows(3) + [verl_row("How many apples? " * 40, "1", 3), verl_row("And pears? " * 60, "2", 4)]
    data = write_parquet(tmp_path / "train.parquet", rows)
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, "data.filter_overlong_prompts=True"), DataError)
    assert msg.startswith(f"data.train_batch_size=4 is larger than the 3 training rows of data.train_files=['{data}'] "
                          "(after train_max_samples and filter_overlong_prompts)")


def test_sft_dataset_smaller_than_one_batch_is_refused_before_ray(tiny_model_dir, tmp_path):
    train = _sft_rows(tmp_path, 3)
    msg = _sft_error(_sft_overrides(tiny_model_dir, train), DataError)
    assert msg == (f"data.train_batch_size=4 is larger than the 3 training rows of data.train_files=['{train}']: not "
                   "one full batch (the partial batch is dropped)")


def test_a_bad_sft_validation_row_is_refused_before_ray(tiny_model_dir, tmp_path):
    # issue 35's trial: the validation rows were rendered only at the first validation, after training. Row 1's
    # question is ~400 tokens, over data.max_length=96; with truncation=right nothing of its answer is left.
    train = _sft_rows(tmp_path, 8)
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "How many apples? " * 100, "answer": "3"}]
    val = write_jsonl(tmp_path / "val.jsonl", [json.dumps(r) for r in rows])
    msg = _sft_error(_sft_overrides(tiny_model_dir, train, f"data.val_files={val}"), DataError)
    assert msg.startswith(f"data.val_files: {val} line 2: no response token left to train on"), msg
    # one row for two ranks: validation would never run (the partial batch is dropped)
    one = write_jsonl(tmp_path / "one.jsonl", [json.dumps(rows[0])])
    msg = _sft_error(_sft_overrides(tiny_model_dir, train, f"data.val_files={one}"), DataError)
    assert msg.startswith(f"data.val_files=['{one}'] has 1 rows, fewer than the 2 ranks"), msg


# --- 7. a checkpoint callback whose file or class is wrong -----------------------------------------------------------

def test_a_checkpoint_callback_without_its_class_is_refused_before_ray(tiny_model_dir, tmp_path):
    hook = tmp_path / "hooks.py"
    hook.write_text("class Upload:\n    def on_save(self, **kwargs):\n        pass\n")
    data = write_parquet(tmp_path / "train.parquet", good_rows(4))
    msg = ppo_error(ppo_overrides(tiny_model_dir, data, f"trainer.checkpoint_callback_class={hook}:Uplaod"),
                    ConfigError)  # a typo in the class name: found only by loading the file, still before Ray
    assert msg == (f"trainer.checkpoint_callback_class='{hook}:Uplaod': {hook} defines no class 'Uplaod'; "
                   "classes found there: ['Upload']")
