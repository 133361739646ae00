"""SFT's torch profiler (verl's ``trainer.profile_interval`` + the ``profiler`` section), through ``run_sft`` on the
tiny model: one trace for the interval, what it records, the finish hook; and the refused values."""
from __future__ import annotations

import json
import os

import pytest

from rlhf_core.config import ConfigError, load_config


def _sft(tiny_model_dir, gsm8k_dir, out, *extra):
    rows = [json.loads(line) for line in open(gsm8k_dir / "train.jsonl")][:8]
    data = out / "train.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"question": r["question"][:80], "answer": r["answer"][-20:]}) + "\n"
                            for r in rows))
    return load_config("sft_trainer", [
        f"model.partial_pretrain={tiny_model_dir}", f"data.train_files={data}", "data.val_files=null",
        "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=4", "data.max_length=64", "data.truncation=right", "trainer.total_epochs=1",
        "trainer.n_gpus_per_node=1", "trainer.logger=[file]", f"trainer.default_local_dir={out / 'ckpt'}",
        "trainer.device=cpu", "trainer.save_freq=-1", *extra])


def test_sft_profile_interval_writes_one_trace_with_shapes_and_runs_the_hook(tiny_model_dir, gsm8k_dir, tmp_path,
                                                                             monkeypatch):
    from rlhf_core.trainer.sft_trainer import run_sft

    monkeypatch.delenv("RLHF_METRICS_FILE", raising=False)
    prof, hook = tmp_path / "prof", tmp_path / "hook.txt"
    cfg = _sft(tiny_model_dir, gsm8k_dir, tmp_path / "run", "trainer.profile_interval=[2,2]",
               "profiler.enable=True", f"profiler.save_path={prof}", "profiler.tool_config.torch.contents=[shapes]",
               f"profiler.finish_hook_cmd='echo $VERL_PROFILE_ROLE $VERL_PROFILE_TRACES > {hook}'")
    assert run_sft(cfg)["global_step"] == 2  # 8 rows / 4 per step, one epoch
    trace = prof / "step_2" / "sft_rank_0.json"
    assert os.listdir(prof) == ["step_2"] and os.listdir(prof / "step_2") == ["sft_rank_0.json"]  # step 1: none
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "train_step" in names  # the stage's range
    # contents [shapes]: the embedding lookup of the step's (4, L) input ids carries its input's shape
    assert any(e.get("name") == "aten::embedding" and e["args"].get("Input Dims", [[], []])[1][0] == 4
               for e in events)
    assert hook.read_text() == f"sft {trace}\n"  # once, when the interval ends


@pytest.mark.parametrize("override, message", [
    ("profiler.tool=nsys", "NVIDIA Nsight Systems (nsys)"),
    ("profiler.tool=precision_debugger", "msprobe precision debugger"),
    ("profiler.tool=torch_memory", "needs CUDA"),
    ("trainer.profile_interval=[3,1]", "trainer.profile_interval=[3, 1] must be [first, last]"),
    ("profiler.tool_config.torch.schedule.wait=-1", "wait must be >= 0"),
])
def test_sft_profiler_values_refused_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_config("sft_trainer", [override])
