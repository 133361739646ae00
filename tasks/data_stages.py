"""The data and model stages: ``prepare_data`` (copy, check, cut and digest the experiment's files),
``filter_prompts`` (drop overlong prompts with the model's tokenizer) and ``build_model`` (the tiny model on Ray).
Each output is a pure function of its inputs: a cache key over their digests names its folder (``tasks.stages``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import filelock
from prefect import task

from infra import lineage
from infra.home import remember
from tasks import plan, remote
from tasks.common import stage
from tasks.deadline import StageDeadline
from tasks.retry import retry_unless_bad_input
from tasks.runlog import build_model_run_name, filter_prompts_run_name, log_line, prepare_data_run_name

HOUR = 3600


def _local_inputs(data: dict[str, Any]) -> list[str] | None:
    """The local copies of every input file of ``prepare_data`` (remote ones copied once into the cache), or the
    generator's inputs; None when the inputs cannot be digested (a hub download, an unreadable URL)."""
    from rlhf_core.data.fs import copy_to_local
    from rlhf_core.data.generators import GENERATORS

    if data["generator"]:
        return GENERATORS[data["generator"]].input_files(data["generator_args"])
    names = [*data["train_files"], *data["val_files"], *data["sft_train_files"], *data["sft_val_files"],
             *(f for suite in data["suites"] for f in suite["files"])]
    try:
        return [copy_to_local(str(n)) for n in names]
    except (OSError, ValueError, ImportError):  # the task itself reports the missing file, naming it
        return None


def _prepare_key(_ctx: Any, p: dict[str, Any]) -> str | None:
    """Cache key: the digests of the input files' bytes and the data settings (Prefect ``cache_key_fn``)."""
    files = _local_inputs(p["data"])
    if files is None:
        return None
    return plan.inputs_key("prepare_data", files, data=p["data"], home=p["ctx"]["home"])


@task(name="prepare_data", task_run_name=prepare_data_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_prepare_key, persist_result=True)
def prepare_data(data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """Copy the experiment's data once (fsspec), check verl's RL schema, cut the first N rows, digest.

    Args:
        data: ``PipelineSettings.data_spec()``: ``generator`` (a ``rlhf_core.data.generators`` name, whose output
            is used as the files) and ``generator_args``, or ``train_files``/``val_files`` (paths or fsspec URLs);
            ``train_prompts``/``val_prompts`` (first N rows; <= 0 all); ``sft_train_files``/``sft_val_files``
            (verl SFT parquet, copied as they are; [] = the RL files); ``suites`` (``[{"name", "files"}]``,
            checked like the RL files); ``prompt_key`` (the PPO config's ``data.prompt_key``).

    Returns:
        ``{"train", "val": prepared parquet, "train_sha256", "val_sha256", "sft_train", "sft_val",
        "suites": {name: parquet}, "inputs": [{"split", "file", "sha256", "rows"}], "rows": {split: n},
        "run_id"}`` (``run_id``: this stage's MLflow run — on a cache hit, the run that produced it). Overlong
        prompts are filtered later, with the model's tokenizer (``filter_prompts``).

    Raises:
        DataError: a missing ``prompt``/``data_source``/``reward_model.ground_truth`` column, a prompt that is a
            string, an empty file (one line naming file, row and column). FileNotFoundError: a missing file.
    """
    from rlhf_core.data.generators import GENERATORS, data_label
    from rlhf_core.data.prepare import gather

    deadline = StageDeadline.of("prepare_data", ctx)  # runs here, not on Ray: checked once the data is written
    key = (_prepare_key(None, {"data": data, "ctx": ctx}) or plan.inputs_key("prepare_data", [], data=data))[:16]
    out = Path(ctx["home"]) / "data" / "prepared" / key
    label = data_label(data["generator"])
    with stage("prepare_data", data, ctx) as run_id:
        train_files, val_files = data["train_files"], data["val_files"]
        n_train, n_val = int(data["train_prompts"]), int(data["val_prompts"])
        if data["generator"]:
            made = GENERATORS[data["generator"]].generate(
                str(Path(ctx["home"]) / "data" / data["generator"]), n_train, n_val, **data["generator_args"])
            train_files, val_files = [made["train"]], [made["val"]]
        pk = data["prompt_key"]
        parts = {"train": gather(train_files, str(out / "train.parquet"), n_train, pk),
                 "val": gather(val_files, str(out / "val.parquet"), n_val, pk)}
        for split, files in (("sft_train", data["sft_train_files"]), ("sft_val", data["sft_val_files"])):
            if files:  # verl's SFT schema (prompt/response or messages): copied and digested, not RL-checked
                parts[split] = gather(files, str(out / f"{split}.parquet"), -1, check=False)
        for suite in data["suites"]:
            parts[f"suite:{suite['name']}"] = gather(suite["files"], str(out / f"suite_{suite['name']}.parquet"), -1, pk)
        deadline.left()  # StageTimeoutError past tasks.prepare_data.timeout_seconds
        result: dict[str, Any] = {
            "train": parts["train"]["path"], "val": parts["val"]["path"],
            "sft_train": parts.get("sft_train", parts["train"])["path"],
            "sft_val": parts.get("sft_val", parts["val"])["path"],
            "suites": {k.split(":", 1)[1]: v["path"] for k, v in parts.items() if k.startswith("suite:")},
            "inputs": [{"split": split, **i} for split, p in parts.items() for i in p["inputs"]],
            "rows": {split: p["rows"] for split, p in parts.items()}, "run_id": run_id}
        lineage.log_params(run_id, {f"prepared.{split}.rows": p["rows"] for split, p in parts.items()})
        lineage.log_params(run_id, {f"input.{i['split']}.{n}.sha256": i["sha256"]
                                    for n, i in enumerate(result["inputs"])})
        result["train_sha256"] = lineage.log_dataset(run_id, result["train"], f"{label}_train", "training")
        result["val_sha256"] = lineage.log_dataset(run_id, result["val"], f"{label}_val", "validation")
        for name, path in result["suites"].items():
            lineage.log_dataset(run_id, path, f"suite_{name}", "evaluation")
    source_dir = data["generator_args"].get("source_dir")
    if source_dir and "://" not in str(source_dir):  # the next `rlhf pipeline` in this home finds the data
        remember("gsm8k_dir", str(Path(source_dir).resolve()), Path(ctx["home"]))
    return result


def _tokenizer_files(model_path: str) -> list[str]:
    """The files of a local model folder that define its tokenizer and chat template (weights left out)."""
    skip = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".lock")
    folder = Path(model_path)
    return [str(f) for f in sorted(folder.iterdir()) if f.is_file() and not f.name.endswith(skip)] \
        if folder.is_dir() else []


def _filter_key(_ctx: Any, p: dict[str, Any]) -> str | None:
    from rlhf_core.data.fs import copy_to_local, is_local

    model = p["model_path"]
    if not is_local(model):
        try:
            model = copy_to_local(model)
        except (OSError, ValueError, ImportError):
            return None
    data = p["prepared"]
    return plan.inputs_key("filter_prompts", [data["train"], data["val"], *_tokenizer_files(model)],
                           cfg=p["cfg"], home=p["ctx"]["home"])


@task(name="filter_prompts", task_run_name=filter_prompts_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_filter_key, persist_result=True)
def filter_prompts(prepared: dict[str, Any], model_path: str, cfg: dict[str, Any],
                   ctx: dict[str, Any]) -> dict[str, Any]:
    """Drop the prepared train/val rows whose prompt is longer than ``cfg["max_prompt_length"]`` tokens with the
    model's tokenizer and chat template (verl's ``data.filter_overlong_prompts``), in
    ``cfg["workers"]`` processes (``data.filter_overlong_prompts_workers``).

    It runs after ``build_model`` (a built model's tokenizer is trained on the prepared data), or right after
    ``prepare_data`` when the experiment names a model; the PPO stage then reads these files with
    ``data.filter_overlong_prompts=False`` and filters nothing again. SFT reads the unfiltered files.

    Args:
        cfg: ``{"max_prompt_length", "workers", "prompt_key", "template_kwargs"}`` of the PPO config's ``data``.

    Returns:
        ``prepared`` with ``train``/``val`` (and their ``*_sha256``) replaced by the filtered files,
        ``filtered: {"train": {"kept", "dropped"}, "val": {...}}`` and ``run_id`` (this stage's MLflow run).
    """
    from rlhf_core.data.fs import copy_to_local
    from rlhf_core.data.prepare import filter_overlong
    from rlhf_core.models.loading import load_tokenizer

    deadline = StageDeadline.of("filter_prompts", ctx)
    key = (_filter_key(None, {"prepared": prepared, "model_path": model_path, "cfg": cfg, "ctx": ctx})
           or plan.inputs_key("filter_prompts", [prepared["train"], prepared["val"]], cfg=cfg))[:16]
    out = Path(ctx["home"]) / "data" / "filtered" / key
    with stage("filter_prompts", {**cfg, "model_path": model_path}, ctx) as run_id:
        tokenizer = load_tokenizer(copy_to_local(model_path))
        counts = {split: filter_overlong(prepared[split], str(out / f"{split}.parquet"), tokenizer,
                                         int(cfg["max_prompt_length"]), int(cfg["workers"]), cfg["prompt_key"],
                                         dict(cfg["template_kwargs"]))
                  for split in ("train", "val")}
        deadline.left()
        lineage.log_params(run_id, {f"{split}.{k}": c[k] for split, c in counts.items() for k in ("kept", "dropped")})
        result = {**prepared, "run_id": run_id,
                  "filtered": {split: {"kept": c["kept"], "dropped": c["dropped"]} for split, c in counts.items()}}
        for split, context in (("train", "training"), ("val", "validation")):
            result[split] = counts[split]["path"]
            result[f"{split}_sha256"] = lineage.log_dataset(run_id, counts[split]["path"], f"filtered_{split}", context)
        log_line("filter_prompts: " + ", ".join(
            f"{split} kept {c['kept']}, dropped {c['dropped']} (> {cfg['max_prompt_length']} tokens)"
            for split, c in counts.items()))
    return result


def _build_key(_ctx: Any, p: dict[str, Any]) -> str:
    return plan.inputs_key("build_model", [p["train_file"]], sizes=p["sizes"], home=p["ctx"]["home"])


@task(name="build_model", task_run_name=build_model_run_name,
      retry_condition_fn=retry_unless_bad_input, cache_key_fn=_build_key, persist_result=True)
def build_model(train_file: str, sizes: dict[str, int], ctx: dict[str, Any]) -> dict[str, str]:
    """Build the tiny Qwen2-style model + BPE tokenizer from the training text (on Ray).

    The folder is a pure function of the inputs (its name is their key). Flow runs started at once
    on one home all miss Prefect's cache: the build runs under a file lock (``<folder>.lock``) and
    a folder that is already there (written atomically, so complete) is used as it is. Rebuilding
    it would swap the folder under a run that is loading it.

    Returns:
        ``{"model_path": HF folder $RLHF_HOME/models/tiny-<key>, "run_id": MLflow run}``.
    """
    deadline = StageDeadline.of("build_model", ctx)
    key = plan.inputs_key("build_model", [train_file], sizes=sizes)[:16]
    out_dir = str(Path(ctx["home"]) / "models" / f"tiny-{key}")
    with stage("build_model", {"sizes": sizes, "train_file": train_file}, ctx) as run_id:
        lineage.log_dataset(run_id, train_file, "tokenizer_text", "training")  # the text its tokenizer learns
        with filelock.FileLock(f"{out_dir}.lock", timeout=HOUR):
            if Path(out_dir, "config.json").is_file():
                path = out_dir  # built by a concurrent flow run with the same inputs
            else:
                path = deadline.run_on_ray(remote.build_model_remote, train_file, out_dir, dict(sizes))
        lineage.log_dir_artifact(run_id, path, "model")
    return {"model_path": path, "run_id": run_id}
