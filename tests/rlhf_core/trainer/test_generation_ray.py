"""``rlhf generate`` on a Ray worker group of ``trainer.nnodes × trainer.n_gpus_per_node`` rollout ranks (verl's
``main_generation``): the batch is split over the ranks and the output is the one-rank output, row for row."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from tests.rlhf_core.trainer.test_generation import QUESTIONS, generation_overrides, prompts_parquet

from rlhf_core.config import ConfigError, load_config
from rlhf_core.protocol import Batch
from rlhf_core.trainer import generation_ray
from rlhf_core.trainer.main_generation import run_generation

pytestmark = pytest.mark.ray  # starts Ray through run_generation


def _run(model_dir, data, out, *extra: str) -> tuple[list[list[str]], list]:
    """(responses, rollout_log_probs) of one rlhf generate run."""
    table = pq.read_table(run_generation(load_config("generation", generation_overrides(model_dir, data, out, *extra))))
    return table.column("responses").to_pylist(), table.column("rollout_log_probs").to_pylist()


def _no_ray(*args, **kwargs):
    raise AssertionError("a one-rank run started Ray")


GREEDY = ("rollout.do_sample=False", "data.n_samples=1", "rollout.calculate_log_probs=True")


def test_two_ranks_give_the_one_rank_output_in_order_with_a_timeline(tiny_model_dir, tmp_path, monkeypatch,
                                                                     caplog):
    """Greedy: 1 rank (in this process) and 2 Ray ranks write the same rows, in the same order, with the same texts
    and log-probs. 3 prompts with data.batch_size=2: a batch of 2 rows (split 1 | 1) and one of 1 row, padded to 2
    with a copy of itself (verl's pad_dataproto_to_divisor) whose response is dropped.

    The tiny model's greedy texts are alike (newlines), so the log-probs of each row's tokens, which depend on its
    prompt, show the order: a swap of two rows would move their distinct values. The one-rank run starts no Ray
    (what rlhf generate did before: Ray's start and a worker process cost seconds and change no output).

    The 2 ranks share ray_init.num_cpus=1 CPU: more ranks than CPUs (as verl's n_gpus_per_node=8 on a 2-core
    machine) run, one thread each, with a warning naming trainer.n_gpus_per_node. (8 ranks on 2 CPUs, run by hand
    as a test: the one-rank output too, 89 s at load 15, too long for CI.)"""
    data = prompts_parquet(tmp_path / "test.parquet")
    with monkeypatch.context() as m:
        m.setattr("rlhf_core.trainer.main_generation.RayGeneration", _no_ray)
        texts1, lps1 = _run(tiny_model_dir, data, tmp_path / "one.parquet", "trainer.n_gpus_per_node=1", *GREEDY)
    timeline = tmp_path / "trace" / "timeline.json"
    texts2, lps2 = _run(tiny_model_dir, data, tmp_path / "two.parquet", "trainer.n_gpus_per_node=2",
                        "ray_init.num_cpus=1", f"ray_kwargs.timeline_json_file={timeline}", *GREEDY)
    assert "trainer.n_gpus_per_node=2: 2 generation ranks per node share 1 CPUs" in caplog.text
    assert [len(r) for r in texts1] == [1, 1, 1] and texts2 == texts1
    firsts = [lp[0][0] for lp in lps1]
    assert len({round(x, 4) for x in firsts}) == 3  # the rows' log-probs differ: a reordering would show
    # the same tokens and log-probs up to float summation order (two threads in this process, one in each rank)
    assert [len(lp[0]) for lp in lps2] == [len(lp[0]) for lp in lps1]
    for a, b in zip(lps2, lps1):
        assert a[0] == pytest.approx(b[0], abs=1e-4)
    # the Ray timeline (ray_kwargs.timeline_json_file, the alias of ray_init.timeline_json_file): both ranks'
    # generate calls, 2 batches x 2 ranks, in two worker processes
    events = json.loads(timeline.read_text())
    calls = [e for e in events if e.get("cat") == "task::_WorkerHost.call"]
    assert len(calls) == 4 and len({e["tid"] for e in calls}) == 2


def test_rank_resources_on_cpu_and_too_many_ranks():
    """Reservations and threads as rlhf ppo's one worker group; more ranks than CPUs run with a warning."""
    # 2 CPUs, 2 ranks: each reserves 1 CPU, 1 thread; 4 CPUs, 2 ranks: 1 CPU reserved (at most 1), 2 threads
    assert generation_ray.rank_resources(2, 1, 2, cuda=False) == (1.0, 1, None)
    assert generation_ray.rank_resources(4, 1, 2, cuda=False) == (1.0, 2, None)
    # verl's default n_gpus_per_node=8 on 2 CPUs: 2/8 = 0.25 CPU reserved each, 1 thread, the key named
    reserve, threads, warning = generation_ray.rank_resources(2, 1, 8, cuda=False)
    assert (reserve, threads) == (0.25, 1)
    assert warning.startswith("trainer.n_gpus_per_node=8: 8 generation ranks per node share 2 CPUs")
    assert "set trainer.n_gpus_per_node=2" in warning
    # 2 nodes of 3 CPUs each (6 in the cluster), 4 ranks per node: 6/8 -> 0.75 reserved, 1 thread, warned (4 > 3)
    reserve, threads, warning = generation_ray.rank_resources(6, 2, 4, cuda=False)
    assert (reserve, threads) == (0.75, 1) and "set trainer.n_gpus_per_node=3" in warning


def test_ranks_are_checked_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    import rlhf_core.trainer.main_generation as gen

    monkeypatch.setattr(gen, "load_causal_lm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    data = prompts_parquet(tmp_path / "test.parquet", QUESTIONS[:1])
    with pytest.raises(ConfigError, match=r"trainer.n_gpus_per_node=0: rlhf generate needs at least one rollout rank"):
        gen.run_generation(load_config("generation", generation_overrides(
            tiny_model_dir, data, tmp_path / "o.parquet", "trainer.n_gpus_per_node=0")))


def test_pad_and_split_keep_rows_in_order():
    """RayGeneration.generate_sequences pads 5 rows to 6 for 3 ranks with a copy of row 0, shards 2 | 2 | 2, and
    drops the copy: the rows come back as given (a fake group that records its shards, no Ray)."""
    import torch

    shards: list[list[int]] = []

    class Group:
        def execute_dp(self, method, batch):
            assert method == "generate_sequences"
            parts = batch.chunk(3)
            shards.extend(p["input_ids"][:, 0].tolist() for p in parts)
            return Batch.concat(parts)

    facade = object.__new__(generation_ray.RayGeneration)
    facade.world, facade.group, facade.calls = 3, Group(), 0
    rows = Batch({"input_ids": torch.arange(5).unsqueeze(1)})
    out = facade.generate_sequences(rows)
    assert shards == [[0, 1], [2, 3], [4, 0]]  # verl's pad_dataproto_to_divisor: the padding repeats the first rows
    assert out["input_ids"][:, 0].tolist() == [0, 1, 2, 3, 4]
