"""verl 0.9.1's engine-shaped SFT config (``sft_trainer_engine.yaml``, ``verl.trainer.sft_trainer``) through ours:
every leaf accepted with verl's default (or a difference listed in rlhf_core/config/views.py), aliases onto the 0.6
keys, Hydra group choices, and multi-turn SFT with tools through the chat template (exact loss mask)."""
from __future__ import annotations

import math
import warnings

import pytest
import yaml
from omegaconf import OmegaConf

from tests.fixtures.config_fixtures import typed_config  # noqa: E402
from tests.fixtures.data_fixtures import sft_data_cfg, write_parquet  # noqa: E402

from rlhf_core.config import ConfigError, load_config  # noqa: E402
from rlhf_core.config.schema import renamed_path  # noqa: E402
from rlhf_core.config.views import DIFFERENCES  # noqa: E402
from rlhf_core.data import DataError  # noqa: E402
from rlhf_core.data.sft_dataset import SFTDataset  # noqa: E402
from tests.paths import TEST_DATA  # noqa: E402

VERL = TEST_DATA / "verl091" / "sft_trainer_engine.yaml"


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else k
        out.update(_leaves(v, path) if isinstance(v, dict) and v else {path: v})
    return out


def _value(cfg, path: str):
    value = OmegaConf.select(cfg, renamed_path(path, "sft_trainer") or path, default="<absent>")
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _load(name, overrides=()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(name, list(overrides))


@pytest.fixture(scope="module")
def verl_leaves() -> dict:
    return _leaves(yaml.safe_load(VERL.read_text()))


def test_engine_view_holds_every_verl_default(verl_leaves):
    assert len(verl_leaves) == 180  # 193 leaves of the composed config less its 13 _target_ entries
    cfg = _load("sft_trainer_engine")
    differ = {p for p, v in verl_leaves.items() if _value(cfg, p) != v}
    # every difference is documented, and every documented difference is real
    assert differ == set(DIFFERENCES["sft_trainer_engine"])
    # spot checks of aliased keys: verl 0.9 spelling -> our 0.6 key, verl's value
    assert cfg.model.partial_pretrain == "~/models/deepseek-llm-7b-chat"  # model.path
    assert cfg.optim.lr_scheduler == "constant" and cfg.optim.lr == 1e-3  # optim.lr_scheduler_type
    assert cfg.data.multiturn.messages_key == "messages" and cfg.data.use_dynamic_bsz is True
    assert list(cfg.trainer.checkpoint.load_contents) == ["model", "optimizer", "extra"]  # checkpoint.load_contents


def test_verl_file_with_every_leaf_loads(verl_leaves, tmp_path):
    # the vendored file as a user config: every leaf (verl spellings, verl values) is a key here
    cfg = _load(str(VERL))
    assert {p for p, v in verl_leaves.items() if _value(cfg, p) != v} == set()  # each one read as written
    assert cfg.trainer.device == "cuda" and cfg.model.partial_pretrain == "~/models/deepseek-llm-7b-chat"
    # a user file named sft_trainer_engine.yaml extends the engine view: keys it leaves out keep verl 0.9.1's values
    short = tmp_path / "sft_trainer_engine.yaml"
    short.write_text("model:\n  path: /m/x\n")
    cfg = _load(str(short))
    assert (cfg.model.partial_pretrain, cfg.optim.lr, cfg.data.pad_mode) == ("/m/x", 1e-3, "no_padding")


def test_plain_sft_trainer_keeps_06_defaults():
    cfg = _load("sft_trainer")
    assert (cfg.optim.lr, cfg.optim.lr_scheduler, cfg.data.use_dynamic_bsz, cfg.data.pad_mode) == \
        (1e-05, "cosine", False, "right")
    assert cfg.data.multiturn.enable is False and cfg.model.partial_pretrain == "~/models/gemma-1.1-7b-it"


def test_alias_and_06_key_set_differently_is_one_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        _load("sft_trainer_engine", ["model.path=/m/a", "model.partial_pretrain=/m/b"])
    assert "model.path" in str(err.value) and "model.partial_pretrain" in str(err.value)
    assert str(err.value).count("\n") == 0  # one line
    cfg = _load("sft_trainer_engine", ["model.path=/m/a", "model.partial_pretrain=/m/a"])  # same value: fine
    assert cfg.model.partial_pretrain == "/m/a"

    both = tmp_path / "both.yaml"  # the same in a user file
    both.write_text("model:\n  path: /m/a\n  partial_pretrain: /m/b\n")
    with pytest.raises(ConfigError, match=r"model.path='/m/a' and model.partial_pretrain='/m/b' are two spellings"):
        _load(str(both))


def test_verl09_launch_keys():
    # the keys of verl's tests/special_e2e/sft/run_sft_engine.sh (fsdp backend), model path swapped
    cfg = _load("sft_trainer_engine", [
        "engine=fsdp", "optim=fsdp", "optim.lr=1e-5", "optim.lr_warmup_steps_ratio=0.2", "optim.weight_decay=0.1",
        "optim.betas=[0.9,0.95]", "optim.clip_grad=1.0", "optim.min_lr_ratio=0.1", "optim.lr_scheduler_type=cosine",
        "engine.ulysses_sequence_parallel_size=1", "engine.strategy=fsdp2", "engine.fsdp_size=1",
        "data.train_batch_size=128", "data.pad_mode=no_padding", "data.use_dynamic_bsz=True",
        "data.max_token_len_per_gpu=2048", "data.messages_key=messages", "model.path=/m/tiny",
        "model.use_remove_padding=True", "trainer.test_freq=after_each_epoch", "trainer.resume_mode=disable",
        "trainer.logger=['console','file']", "trainer.total_training_steps=2"])
    assert (cfg.optim.warmup_steps_ratio, cfg.optim.lr_scheduler, cfg.model.strategy) == (0.2, "cosine", "fsdp2")
    assert (cfg.engine.fsdp_size, cfg.trainer.test_freq, cfg.data.max_token_len_per_gpu) == \
        (1, "after_each_epoch", 2048)


@pytest.mark.parametrize("override, needle", [
    ("engine=megatron", "engine=megatron: only engine=fsdp is supported"),
    ("model.lora.rank=8", "model.lora.rank"),
    ("engine.strategy=fsdp_turbo", "model.strategy"),
    ("trainer.test_freq=each_epoch", "trainer.test_freq='each_epoch'"),
    ("data.pad_mode=left_right", "data.pad_mode"),
])
def test_refused_by_name(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("'", "'")):
        _load("sft_trainer_engine", [override])


def test_max_samples_keeps_the_first_rows(tiny_tokenizer, tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(3)]
    path = write_parquet(tmp_path / "r.parquet", rows)
    ds = SFTDataset(path, tiny_tokenizer, sft_data_cfg(max_length=32), max_samples=2)
    assert len(ds) == 2 and ds.samples == [("q0", "a0"), ("q1", "a1")]
    assert len(SFTDataset(path, tiny_tokenizer, sft_data_cfg(max_length=32), max_samples=-1)) == 3

# A ChatML template that renders the tools (as JSON in a system turn) and a /no_think line first when
# enable_thinking is false: the tiny tokenizer's own template renders neither.
TOOLS_TEMPLATE = (
    "{% if enable_thinking is defined and not enable_thinking %}{{ '/no_think\\n' }}{% endif %}"
    "{% if tools %}{{ '<|im_start|>system\\ntools:' + (tools | tojson) + '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"a": "int", "b": "int"}}}
CHAT = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "call add(2, 3)"},
        {"role": "tool", "content": "5"}, {"role": "assistant", "content": "It is 5."}]


def _enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_multiturn_with_tools_loss_mask(tiny_tokenizer, tmp_path):
    path = write_parquet(tmp_path / "t.parquet", [{"messages": CHAT, "tools": [TOOL], "enable_thinking": True}])
    cfg = sft_data_cfg(multiturn={"enable": True, "messages_key": "messages", "tools_key": "tools",
                                  "enable_thinking_key": "enable_thinking"},
                       max_length=160, chat_template=TOOLS_TEMPLATE)
    item = SFTDataset(path, tiny_tokenizer, cfg)[0]
    tok = tiny_tokenizer
    # the rendering, piece by piece: [tools + user + assistant header] [answer 1] [tool turn + header] [answer 2]
    import json
    pre = _enc(tok, "<|im_start|>system\ntools:" + json.dumps([TOOL]) + "<|im_end|>\n"
                    "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n")
    a1 = _enc(tok, "call add(2, 3)<|im_end|>\n")
    mid = _enc(tok, "<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")
    a2 = _enc(tok, "It is 5.<|im_end|>\n")
    n = len(pre) + len(a1) + len(mid) + len(a2)
    assert item["input_ids"].tolist()[:n] == pre + a1 + mid + a2
    assert int(item["attention_mask"].sum()) == n
    # loss_mask[i] = 1 iff token i+1 is an assistant token: shifted one left from the assistant spans
    expected = [0] * (len(pre) - 1) + [1] * len(a1) + [0] * len(mid) + [1] * len(a2) + [0] * (160 - n + 1)
    assert item["loss_mask"].tolist() == expected
    first = len(pre) - 1  # the header's last token predicts the first answer token
    assert item["loss_mask"][first] == 1 and item["input_ids"][first + 1] == a1[0]
    assert item["loss_mask"][first - 1] == 0


def test_enable_thinking_per_row_and_default(tiny_tokenizer, tmp_path):
    chat = CHAT[:2]
    path = write_parquet(tmp_path / "e.parquet", [{"messages": chat, "enable_thinking": False},
                                                  {"messages": chat, "enable_thinking": True}])
    cfg = sft_data_cfg(multiturn={"enable": True}, max_length=64, chat_template=TOOLS_TEMPLATE)
    ds = SFTDataset(path, tiny_tokenizer, cfg)
    text = [tiny_tokenizer.decode(ds[i]["input_ids"][: int(ds[i]["attention_mask"].sum())]) for i in (0, 1)]
    assert "/no_think" in text[0] and "/no_think" not in text[1]
    no_column = write_parquet(tmp_path / "d.parquet", [{"messages": chat}])
    for default, shown in (("none", False), (False, True), (True, False)):
        ds = SFTDataset(no_column, tiny_tokenizer, sft_data_cfg(multiturn={"enable": True}, max_length=64,
                                                               chat_template=TOOLS_TEMPLATE,
                                                               enable_thinking_default=default))
        assert ("/no_think" in tiny_tokenizer.decode(ds[0]["input_ids"])) is shown


# Drops an earlier assistant turn's <think>...</think> once it is not the last message (as Qwen3's template does).
THINK_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{% else %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_ignore_input_ids_mismatch(tiny_tokenizer, tmp_path):
    chat = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "<think>a</think>2"},
            {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>b</think>4"}]
    path = write_parquet(tmp_path / "i.parquet", [{"messages": chat}])
    cfg = sft_data_cfg(multiturn={"enable": True}, max_length=96, chat_template=THINK_TEMPLATE)
    with pytest.raises(DataError, match="not prefix-consistent at message 2.*ignore_input_ids_mismatch=True"):
        SFTDataset(path, tiny_tokenizer, cfg)[0]
    cfg.ignore_input_ids_mismatch = True
    item = SFTDataset(path, tiny_tokenizer, cfg)[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    trained = tiny_tokenizer.decode([ids[i + 1] for i in range(len(ids) - 1) if mask[i]])
    # each assistant turn as rendered when it was last: both keep their <think> part
    assert trained == "<think>a</think>2<|im_end|>\n<think>b</think>4<|im_end|>\n"


def test_dynamic_bsz_and_no_padding_in_the_worker():
    import torch

    from rlhf_core.protocol import Batch
    from rlhf_core.trainer.sft_worker import SFTWorker

    # 4 rows of 3, 3, 2, 4 valid tokens (of 5): micro_batch_size_per_gpu=1 gives 4 micro-batches; the token budget
    # of 6 packs consecutive rows while their sum stays <= 6: [3, 3], [2, 4]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    batch = Batch(tensors={"attention_mask": mask, "input_ids": torch.zeros_like(mask)})
    fixed = SFTWorker(typed_config("sft_trainer", "data.micro_batch_size_per_gpu=1"), 1)
    assert [len(b) for b in fixed._micro_batches(batch)] == [1, 1, 1, 1] and not fixed._packed()
    dynamic = SFTWorker(typed_config("sft_trainer", "data.micro_batch_size_per_gpu=1", "data.use_dynamic_bsz=True",
                                     "data.max_token_len_per_gpu=6", "data.pad_mode=no_padding"), 1)
    assert [b["attention_mask"].sum().item() for b in dynamic._micro_batches(batch)] == [6, 6]
    assert dynamic._packed()  # pad_mode=no_padding runs the packed forward, as use_remove_padding


@pytest.mark.parametrize("overrides, expected", [
    # constant after W = lr_warmup_steps = 2 (it wins over the ratio): (s + 1)/(W + 1) for s < W, then 1
    (["optim.lr_scheduler_type=constant", "optim.lr_warmup_steps=2", "optim.lr_warmup_steps_ratio=0.5"],
     [1 / 3, 2 / 3, 1.0, 1.0]),
    # the deprecated warmup_style takes the scheduler's place; W = int(0.25 · 4) = 1; cosine with num_cycles 0.25
    # (a quarter period over T - W = 3 updates): s = 1, 2, 3 at cos(2π · 0.25 · p), p = 0, 1/3, 2/3
    (["optim.lr_scheduler_type=constant", "optim.warmup_style=cosine", "optim.lr_warmup_steps_ratio=0.25",
      "optim.num_cycles=0.25"], [0.5, 1.0, 0.5 * (1 + math.cos(math.pi / 6)), 0.75]),  # cos(π/3) = 0.5
])
def test_sft_lr_schedule_verl09_keys(overrides, expected):
    import torch

    from rlhf_core.workers.lr_schedule import build_sft_lr_scheduler

    optim = _load("sft_trainer_engine", ["model.path=/m", *overrides]).optim
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_sft_lr_scheduler(opt, optim, 4)
    got = []
    for _ in range(4):
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert got == pytest.approx(expected)


@pytest.mark.slow
def test_two_steps_with_a_verl09_command_line(tiny_model_dir, tmp_path, monkeypatch):
    from rlhf_core.trainer.commands import sft_main
    from rlhf_core.trainer.tracking import read_metrics_jsonl

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    rows = [{"messages": CHAT, "tools": [TOOL]}, {"messages": CHAT[:2], "tools": [TOOL]}] * 2
    train = write_parquet(tmp_path / "train.parquet", rows)
    out = tmp_path / "ckpt"
    # verl 0.9's spelling (tests/special_e2e/sft/run_sft_engine.sh, fsdp backend), model path and device swapped
    code = sft_main([
        "--config-name", "sft_trainer_engine", "engine=fsdp", "optim=fsdp", f"model.path={tiny_model_dir}",
        f"data.train_files={train}", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2",
        "data.pad_mode=no_padding", "data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=128",
        "data.messages_key=messages", "data.tools_key=tools", "data.max_length=64", "model.use_remove_padding=True",
        "optim.lr=1e-4", "optim.lr_warmup_steps_ratio=0.5", "optim.lr_scheduler_type=cosine",
        "engine.strategy=fsdp", "trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.max_ckpt_to_keep=1",
        "trainer.test_freq=after_each_epoch", "trainer.logger=[file]", f"trainer.default_local_dir={out}",
        "trainer.resume_mode=disable", "trainer.device=cpu", "checkpoint.save_contents=[model,optimizer,extra]"])
    assert code == 0
    m = read_metrics_jsonl(str(out / "metrics.jsonl"))
    assert sorted(m) == [1, 2]
    # T = 2 updates, W = int(0.5 · 2) = 1: update 0 at 1/(W + 1) = 0.5 of the lr, update 1 at the cosine's start, 1.0
    assert [m[1]["train/lr"], m[2]["train/lr"]] == pytest.approx([5e-5, 1e-4])
    assert all(0 < m[s]["train/loss"] < 20 for s in (1, 2))
    assert sorted(p.name for p in out.glob("global_step_*")) == ["global_step_2"]  # max_ckpt_to_keep=1


def test_the_engine_view_gives_no_alias_notice_for_its_own_09_spellings():
    # issue 35's trial: --config-name sft_trainer_engine printed "model.path (override) is read as
    # model.partial_pretrain ..." for keys that are that config's own; under sft_trainer they stay notices
    from rlhf_core.config.notices import AliasNotice

    ovs = ["model.path=/m", "engine.strategy=fsdp2", "optim.lr_scheduler_type=cosine", "data.messages_key=msgs"]

    def aliases(name):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = load_config(name, ovs)
        return cfg, sorted(str(w.message).split(" (")[0] for w in caught if issubclass(w.category, AliasNotice))

    cfg, engine = aliases("sft_trainer_engine")
    assert engine == [] and cfg.model.partial_pretrain == "/m" and cfg.data.multiturn.messages_key == "msgs"
    assert aliases("sft_trainer")[1] == ["data.messages_key", "engine.strategy", "model.path", "optim.lr_scheduler_type"]
