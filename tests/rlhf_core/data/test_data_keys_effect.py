"""Effect of data.apply_chat_template_kwargs, data.datagen.*, data.sampler.*, data.tokenizer, data.trust_remote_code."""
from __future__ import annotations

import copy
import json
import shutil

import pytest
from omegaconf import OmegaConf

from tests.fixtures.data_fixtures import ppo_data_cfg, sft_data_cfg, verl_row, write_parquet  # noqa: E402

from rlhf_core.data import DataError  # noqa: E402
from rlhf_core.data.datagen import DynamicGenDataset  # noqa: E402
from rlhf_core.data.loader import build_dataloader  # noqa: E402
from rlhf_core.data.factory import create_rl_dataset  # noqa: E402
from rlhf_core.data.rl_dataset import RLHFDataset  # noqa: E402
from rlhf_core.data.sampler import create_rl_sampler  # noqa: E402
from rlhf_core.data.sft_dataset import SFTDataset  # noqa: E402
from rlhf_core.trainer.main_ppo import driver_tokenizer_path, load_driver_tokenizer  # noqa: E402

QUESTIONS = ["How many apples?", "Tom has 3 cats and 2 dogs.", "A train leaves at noon."]
# ChatML plus one switch, as Qwen3's template has: a "/no_think" line when enable_thinking is false
THINK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '/no_think\n' }}{% endif %}{% endif %}")


@pytest.fixture
def small_parquet(tmp_path):
    return write_parquet(tmp_path / "small.parquet", [verl_row(q, str(i), index=i) for i, q in enumerate(QUESTIONS)])


@pytest.fixture
def think_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = THINK_TEMPLATE
    return tok


def test_apply_chat_template_kwargs_reach_the_template_and_the_length_filter(think_tokenizer, small_parquet):
    plain = RLHFDataset(small_parquet, think_tokenizer, ppo_data_cfg(return_full_prompt=True))[0]
    off = RLHFDataset(small_parquet, think_tokenizer, ppo_data_cfg(
        return_full_prompt=True, apply_chat_template_kwargs={"enable_thinking": False}))[0]
    assert not plain["full_prompts"].endswith("/no_think\n")
    assert off["full_prompts"] == plain["full_prompts"] + "/no_think\n"
    extra = len(think_tokenizer("/no_think\n", add_special_tokens=False)["input_ids"])
    assert len(off["raw_prompt_ids"]) == len(plain["raw_prompt_ids"]) + extra
    # the overlong filter measures the same rendering: at exactly the plain length, the kwargs make row 0 too long
    n = len(plain["raw_prompt_ids"])
    keep_plain = RLHFDataset(small_parquet, think_tokenizer, ppo_data_cfg(max_prompt_length=n,
                                                                          filter_overlong_prompts=True))
    keep_off = RLHFDataset(small_parquet, think_tokenizer, ppo_data_cfg(
        max_prompt_length=n, filter_overlong_prompts=True, apply_chat_template_kwargs={"enable_thinking": False}))
    assert 0 in keep_plain.row_numbers and 0 not in keep_off.row_numbers


def test_sft_apply_chat_template_kwargs(think_tokenizer, tmp_path):
    path = write_parquet(tmp_path / "s.parquet", [{"question": "What is 2+3?", "answer": "5"}])
    plain = SFTDataset(path, think_tokenizer, sft_data_cfg(max_length=96))[0]
    off = SFTDataset(path, think_tokenizer, sft_data_cfg(max_length=96,
                                                         apply_chat_template_kwargs={"enable_thinking": False}))[0]
    extra = len(think_tokenizer("/no_think\n", add_special_tokens=False)["input_ids"])
    # the prompt grows by the "/no_think" line; the response tokens (loss_mask) are the same
    assert int(off["attention_mask"].sum()) == int(plain["attention_mask"].sum()) + extra
    assert int(off["loss_mask"].sum()) == int(plain["loss_mask"].sum())


GEN_FILE = '''
from rlhf_core.data.datagen import AbstractDataGenerator

class Echo(AbstractDataGenerator):
    """Appends a copy of the dataset's first row, its question suffixed with the call number."""
    def __init__(self, config):
        super().__init__(config)
        self.calls = 0

    def generate(self, dataset):
        self.calls += 1
        row = dict(dataset.rows[0])
        row["prompt"] = [{"role": "user", "content": row["prompt"][0]["content"] + " v" + str(self.calls)}]
        row["extra_info"] = {"index": 1000 + self.calls}
        return [row]

class Broken(AbstractDataGenerator):
    def generate(self, dataset):
        return [{"prompt": "not a message list"}]

class NotAGenerator:
    pass
'''


def test_datagen_appends_rows_at_start_and_after_each_step(tiny_tokenizer, small_parquet, tmp_path):
    (tmp_path / "gen.py").write_text(GEN_FILE)
    cfg = ppo_data_cfg(datagen={"path": str(tmp_path / "gen.py"), "name": "Echo"})
    train = create_rl_dataset(small_parquet, tiny_tokenizer, cfg)
    val = create_rl_dataset(small_parquet, tiny_tokenizer, cfg, is_train=False)
    assert isinstance(train, DynamicGenDataset) and type(val) is RLHFDataset and len(val) == 3
    assert len(train) == 4 and train[3]["index"] == 1001  # one call at construction, as verl
    train.on_batch_end(batch=None)
    assert len(train) == 5 and train[4]["index"] == 1002
    assert str(train.sources[4]).startswith(f"data.datagen {tmp_path / 'gen.py'}:Echo call 2")
    # a resumed run rebuilds the dataset smaller than it had grown: the dataloader state still loads
    state = build_dataloader(train, 2, shuffle=True, seed=1).state_dict()
    fresh = create_rl_dataset(small_parquet, tiny_tokenizer, cfg)
    assert state["dataset_len"] == 5 and len(fresh) == 4
    build_dataloader(fresh, 2, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="Broken call 1 row 0"):
        create_rl_dataset(small_parquet, tiny_tokenizer, ppo_data_cfg(datagen={"path": str(tmp_path / "gen.py"),
                                                                              "name": "Broken"}))
    with pytest.raises(TypeError, match="AbstractDataGenerator"):
        create_rl_dataset(small_parquet, tiny_tokenizer, ppo_data_cfg(datagen={"path": str(tmp_path / "gen.py"),
                                                                              "name": "NotAGenerator"}))


SAMPLER_FILE = '''
from rlhf_core.data.sampler import AbstractCurriculumSampler

class Reverse(AbstractCurriculumSampler):
    """Visits the dataset backwards; update() moves the most recently seen first index to the front."""
    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.queue = list(range(self.n - 1, -1, -1))
        self.updates = []

    def __iter__(self):
        queue = list(self.queue)
        self.queue = queue
        while queue:
            yield queue.pop(0)

    def __len__(self):
        return self.n

    def update(self, batch):
        self.updates.append(len(batch))
        if 0 in self.queue:  # promote row 0 to come next
            self.queue.remove(0)
            self.queue.insert(0, 0)

class NotASampler:
    pass
'''


def test_sampler_orders_batches_and_update_reorders_what_comes_next(tmp_path):
    (tmp_path / "s.py").write_text(SAMPLER_FILE)
    data = list(range(8))
    cfg = OmegaConf.create({"sampler": {"class_path": str(tmp_path / "s.py"), "class_name": "Reverse"},
                            "dataloader_num_workers": 0})
    sampler = create_rl_sampler(cfg, data)
    loader = build_dataloader(data, 2, shuffle=True, seed=1, collate_fn=list, sampler=sampler)
    it = iter(loader)
    assert next(it) == [7, 6]  # the sampler's order, not the seeded shuffle
    sampler.update(batch=[7, 6])
    assert next(it) == [0, 5]  # drawn lazily: the update took effect at the next batch
    assert list(it) == [[4, 3], [2, 1]]
    assert loader.epoch == 1 and loader.batches_done == 0
    cfg.dataloader_num_workers = 8
    with pytest.raises(ValueError, match="dataloader_num_workers must be 0"):
        create_rl_sampler(cfg, data)
    cfg.dataloader_num_workers, cfg.sampler.class_name = 0, "NotASampler"
    with pytest.raises(TypeError, match="AbstractSampler"):
        create_rl_sampler(cfg, data)
    cfg.sampler.class_path = None
    assert create_rl_sampler(cfg, data) is None


REMOTE_TOKENIZER = '''
from transformers import PreTrainedTokenizerFast

class RemoteTok(PreTrainedTokenizerFast):
    """A tokenizer class that only exists in this folder (needs trust_remote_code)."""
'''


def test_data_tokenizer_and_trust_remote_code(tiny_model_dir, tmp_path):
    tok_dir = tmp_path / "remote_tok"
    shutil.copytree(tiny_model_dir, tok_dir)
    (tok_dir / "remote_tok.py").write_text(REMOTE_TOKENIZER)
    cfg_path = tok_dir / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["auto_map"] = {"AutoTokenizer": [None, "remote_tok.RemoteTok"]}
    tok_cfg.pop("tokenizer_class", None)
    cfg_path.write_text(json.dumps(tok_cfg))
    cfg = OmegaConf.create({"data": {"tokenizer": None, "trust_remote_code": True},
                            "actor_rollout_ref": {"model": {"path": tiny_model_dir, "tokenizer_path": None,
                                                            "custom_chat_template": None}}})
    assert driver_tokenizer_path(cfg) == tiny_model_dir
    assert type(load_driver_tokenizer(cfg)).__name__ != "RemoteTok"
    cfg.data.tokenizer = str(tok_dir)
    assert type(load_driver_tokenizer(cfg)).__name__ == "RemoteTok"  # data.tokenizer wins over the model path
    cfg.data.trust_remote_code = False  # the folder's own class is not run: transformers falls back to Qwen2's
    assert type(load_driver_tokenizer(cfg)).__name__ != "RemoteTok"
