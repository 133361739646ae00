"""``rlhf generate``: responses from any model to a parquet of prompts (verl ``verl/trainer/main_generation.py``).

Reads ``data.path`` (verl's RL schema; ``data.prompt_key`` holds a chat message list per row), renders each prompt
with the tokenizer's chat template (``add_generation_prompt``, ``data.apply_chat_template_kwargs``), generates
``data.n_samples`` responses per prompt with the rollout engine ``rollout.name`` picks — ``hf``
(:class:`~rlhf_core.workers.rollout.hf_rollout.HFRollout`) or ``vllm``
(:class:`~rlhf_core.workers.rollout.vllm_rollout.VLLMRollout`, the engines PPO rolls out with: ``rollout.temperature``,
``top_k``, ``top_p``, ``do_sample``, ``ignore_eos``, ``response_length``; vLLM also gets the ``rollout`` engine keys,
:func:`engine_config`) — and writes ``data.output_path``: the input table unchanged plus a ``responses`` column, a
list of ``n_samples`` strings per row (special tokens skipped), as verl's ``main_generation`` writes it — what
``rlhf eval data.path=<output>`` scores. With ``rollout.calculate_log_probs`` a ``rollout_log_probs`` column is added:
per row ``n_samples`` lists of float32, the engine's log-prob of each response token (verl computes them and drops
them; they are ours).

Differences from verl, each one deliberate:

* the hf engine runs on ``trainer.nnodes × trainer.n_gpus_per_node`` Ray rollout ranks, each batch split between
  them as verl does (:mod:`rlhf_core.trainer.generation_ray`: ``ray_init.num_cpus``, ``timeline_json_file``), except
  that one rank without a timeline runs in this process (no Ray start); vLLM runs one engine in this process on the
  device its build targets, over ``tensor_model_parallel_size`` devices. A 16-bit ``rollout.dtype`` runs as float32
  on CPU, as in PPO. The ``actor`` section is accepted and changes nothing, nor do the vLLM keys under
  ``rollout.name=hf``. Our default engine is ``hf`` (verl's is vllm, an optional install here).
* a prompt longer than ``rollout.prompt_length`` tokens is refused, naming its row, before the model loads (verl
  cuts it silently at the right, which drops the generation prompt).
* each prompt is repeated ``n_samples`` times in one engine call (as PPO's ``rollout.n``: one prefill per
  distinct prompt) instead of ``n_samples`` calls; hf seeds engine call ``i`` of rank ``r`` with ``rollout.seed +
  7919·r + i`` (one random stream per call and rank, not per row: sampled responses depend on the rank count, as in
  verl), vLLM each request (:meth:`VLLMRollout.generate_sequences`), so a run is reproducible for a given rank
  count; with ``do_sample=False`` the ``n_samples`` responses of a prompt are identical, for any rank count.
* the output is written atomically (a crash or a full disk leaves no partial file, and an existing output stays
  whole until the new one is complete); ``data.output_path`` is a local path.

Input errors (missing or empty file, no ``data.prompt_key`` column, a prompt that is not chat messages, a model
folder without weights, a tokenizer without a chat template, an overlong prompt, ``rollout.name=vllm`` without vLLM
installed) are one line naming the file, row and key, raised before the model loads.
"""
from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from omegaconf import DictConfig, OmegaConf

from rlhf_core.atomic import atomic_write
from rlhf_core.config.errors import ConfigError
from rlhf_core.config.notices import engine_errors
from rlhf_core.data import DataError
from rlhf_core.data.fs import copy_to_local
from rlhf_core.data.prompts import encode, pad_ids, pad_token_id, positions_from_mask, render_prompt
from rlhf_core.data.readers import read_rows
from rlhf_core.data.rl_dataset import validate_messages
from rlhf_core.models.hub import check_hub_model
from rlhf_core.models.loading import check_local_path, load_causal_lm, load_tokenizer
from rlhf_core.models.preflight import check_model_files, require_chat_template
from rlhf_core.progress import progress
from rlhf_core.trainer.generation_ray import RayGeneration, use_ray
from rlhf_core.protocol import Batch
from rlhf_core.storage import unwritable_output
from rlhf_core.workers.rollout.hf_rollout import HFRollout

logger = logging.getLogger(__name__)

RESPONSES = "responses"
"""The column verl's ``main_generation`` adds (``evaluation.yaml``'s ``data.response_key`` default)."""
LOG_PROBS = "rollout_log_probs"
"""The column ``rollout.calculate_log_probs`` adds (the rollout batch's name for the engine's log-probs)."""

_VLLM_ONLY = ("enable_prefix_caching", "skip_tokenizer_init", "logprobs_mode", "scheduling_policy",
              "cudagraph_capture_sizes", "multi_stage_wake_up", "engine_kwargs",
              "checkpoint_engine.update_weights_bucket_megabytes")
"""``actor_rollout_ref.rollout`` keys the vLLM engine reads that generation.yaml does not have: they take
ppo_trainer.yaml's defaults (:func:`engine_config`)."""


def run_generation(config: DictConfig) -> str:
    """Generate ``data.n_samples`` responses per prompt of ``data.path`` and write ``data.output_path`` (module
    docstring). ``config`` is ``load_config("generation", overrides)``.

    Returns:
        the absolute path of the parquet written.
    Raises:
        ConfigError, DataError, FileNotFoundError: bad input, one line naming the key, file and row, before the
            model loads (a ``data.output_path`` where nothing can be written included). ``OSError`` (ENOSPC, EROFS)
            when the output cannot be written during the write; nothing partial is left.
    """
    data, rollout = config.data, config.rollout
    if engine_errors(config):  # rollout.name=vllm without vLLM installed: one line, before anything loads
        raise ConfigError(engine_errors(config)[0])
    output = _output_path(str(data.output_path))
    unwritable = unwritable_output("data.output_path", output)
    if unwritable:  # a read-only place: refused before the model loads, not after the generation
        raise ConfigError(unwritable)
    device = _device(str(config.trainer.device))
    on_ray = use_ray(config)  # trainer.nnodes x n_gpus_per_node checked here, before anything loads
    _check_model(str(config.model.path))
    rows = _prompts(str(data.path), str(data.prompt_key))
    tokenizer = load_tokenizer(str(config.model.path), bool(data.trust_remote_code))
    require_chat_template(tokenizer, f"model.path={config.model.path!r}",
                          f"the prompts (data.prompt_key={data.prompt_key!r}) are chat messages rendered with it")
    template_kwargs = OmegaConf.to_container(data.apply_chat_template_kwargs, resolve=True)
    prompt_ids = [_prompt_ids(tokenizer, messages, template_kwargs, where, int(rollout.prompt_length))
                  for messages, where in rows]
    n, size = int(data.n_samples), int(data.batch_size)
    calc_lp = bool(rollout.calculate_log_probs)
    responses: list[list[str]] = []
    log_probs: list[list[list[float]]] = []
    starts = range(0, len(prompt_ids), size)
    # trainer.nnodes x n_gpus_per_node ranks on Ray (generation_ray.py); one rank without a timeline: this process
    ray_or_here = RayGeneration(config, device, _engine) if on_ray else nullcontext(_engine(config, tokenizer, device))
    with ray_or_here as engine:
        for start in progress(starts, "generate", unit="batch", total=len(starts)):
            batch = prompt_batch(prompt_ids[start:start + size], pad_token_id(tokenizer)).repeat_interleave(n)
            out = engine.generate_sequences(batch)
            texts = decode_responses(out, tokenizer)
            responses.extend(texts[i:i + n] for i in range(0, len(texts), n))
            if calc_lp:
                lps = response_log_probs(out)
                log_probs.extend(lps[i:i + n] for i in range(0, len(lps), n))
    write_responses(str(data.path), responses, output, log_probs if calc_lp else None)
    logger.info("generate: %d prompts x %d responses -> %s", len(responses), n, output)
    return output


def _engine(config: DictConfig, tokenizer: Any, device: torch.device, rank: int = 0):
    """The rollout engine ``rollout.name`` names: ``HFRollout`` of rollout rank ``rank`` (its seeds:
    ``rollout.seed + 7919·rank + call``) on ``device`` with ``model.path`` loaded in ``rollout.dtype``, or
    ``VLLMRollout`` (vLLM loads ``model.path`` itself, :func:`engine_config`).

    Raises:
        ConfigError: ``rollout.name=vllm`` and ``import vllm`` fails (naming the key and the install), before any
            weights are read.
    """
    rollout = config.rollout
    if str(rollout.name) == "vllm":
        from rlhf_core.models.loading import import_external_libs
        from rlhf_core.workers.rollout.vllm_rollout import VLLMRollout, _import_vllm

        try:
            _import_vllm()  # installed (engine_errors) but may still fail to import, e.g. CUDA torchvision wheels
        except ImportError as exc:  # a ConfigError: `rlhf generate` prints it as one line
            raise ConfigError(f"rollout.name=vllm: {exc}") from None
        import_external_libs(config.model.external_lib)
        model_cfg, engine_cfg = engine_config(config)
        return VLLMRollout(model_cfg, tokenizer, engine_cfg, seed=int(rollout.seed), weights_from_actor=False)
    module = load_causal_lm(str(config.model.path), dtype=str(rollout.dtype),
                            trust_remote_code=bool(config.model.trust_remote_code),
                            external_lib=config.model.external_lib).to(device).eval()
    module.requires_grad_(False)
    # generation.yaml's rollout section has no logprobs_mode (nor verl's): ppo_trainer's default, from its schema,
    # as the vLLM engine gets it (engine_config)
    from rlhf_core.config.schema import specs

    mode = specs("ppo_trainer")["actor_rollout_ref.rollout.logprobs_mode"].default
    return HFRollout(module, tokenizer, rollout, seed=int(rollout.seed), rank=rank, logprobs_mode=mode)


def engine_config(config: DictConfig) -> tuple[DictConfig, DictConfig]:
    """``(model, rollout)`` sections shaped as ppo_trainer.yaml's ``actor_rollout_ref.model`` / ``.rollout`` for
    :class:`~rlhf_core.workers.rollout.vllm_rollout.VLLMRollout` (whose
    :func:`~rlhf_core.workers.rollout.vllm_rollout.engine_kwargs` turns them into ``vllm.LLM`` arguments).

    ``rollout`` is generation.yaml's ``rollout`` section as given (every vLLM key of it reaches the engine), plus
    the engine keys generation.yaml does not declare (:data:`_VLLM_ONLY`) at ppo_trainer.yaml's defaults, read from
    its schema; ``model`` is ``model.path`` / ``trust_remote_code`` without LoRA, tokenizer or hf-config paths.
    """
    from rlhf_core.config.schema import specs

    prefix = "actor_rollout_ref.rollout."
    defaults = OmegaConf.create({})
    for path, spec in specs("ppo_trainer").items():
        name = path[len(prefix):] if path.startswith(prefix) else ""
        if any(name == k or name.startswith(k + ".") for k in _VLLM_ONLY):
            OmegaConf.update(defaults, name, spec.default, force_add=True)
    rollout = OmegaConf.merge(defaults, OmegaConf.to_container(config.rollout, resolve=True))
    model = OmegaConf.create({"path": str(config.model.path), "trust_remote_code": bool(config.model.trust_remote_code),
                              "tokenizer_path": None, "hf_config_path": None, "lora_rank": 0, "lora_alpha": 16})
    return model, rollout


def _output_path(path: str) -> str:
    """``data.output_path`` as an absolute local path; ConfigError for a remote URL (before any work)."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" in path:
        raise ConfigError(f"data.output_path={path!r}: rlhf generate writes a local file; give a local path and "
                          "copy the parquet to its remote place afterwards")
    return os.path.abspath(os.path.expanduser(path))


def _device(name: str) -> torch.device:
    """``trainer.device``: ``auto`` → cuda when available, else cpu; ConfigError for cuda without a GPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device='cuda' but no CUDA device is available here; set trainer.device=cpu or auto")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def _check_model(path: str) -> None:
    """The cheap checks PPO runs on a model key: the folder exists, holds a config and whole weights; a hub id can
    load here. Raises FileNotFoundError or ConfigError naming ``model.path``."""
    try:
        check_local_path(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"model.path={path!r}: {exc}") from None
    check_model_files("model.path", path)
    check_hub_model("model.path", path)


def _prompts(path: str, prompt_key: str) -> list[tuple[list[dict[str, Any]], str]]:
    """(chat messages, "<file> row <i>") for every row of ``data.path``.

    Raises:
        DataError: not a parquet file, no rows, no ``prompt_key`` column, or a prompt that is not a non-empty list
            of ``{role, content}`` messages (naming the file, row and key).
        FileNotFoundError: the file does not exist.
    """
    if not path.lower().endswith((".parquet", ".pq")):
        raise DataError(f"data.path={path!r}: rlhf generate reads a parquet file (verl's RL schema)")
    rows, sources = read_rows(path)
    if prompt_key not in rows[0]:
        raise DataError(f"{path}: no column data.prompt_key={prompt_key!r} (columns: {sorted(rows[0])})")
    out = []
    for row, source in zip(rows, sources):
        validate_messages(row[prompt_key], str(source), field=prompt_key)
        out.append((list(row[prompt_key]), str(source)))
    return out


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict, where: str,
                prompt_length: int) -> list[int]:
    """The prompt's token ids, chat template applied; DataError naming ``where`` when longer than
    ``rollout.prompt_length``."""
    ids = encode(tokenizer, render_prompt(tokenizer, messages, template_kwargs=template_kwargs))
    if len(ids) > prompt_length:
        raise DataError(f"{where}: the prompt has {len(ids)} tokens with the chat template, more than "
                        f"rollout.prompt_length={prompt_length}; raise rollout.prompt_length or shorten the prompt")
    return ids


def prompt_batch(prompt_ids: list[list[int]], pad_id: int) -> Batch:
    """Left-padded ``input_ids``, ``attention_mask``, ``position_ids``, each ``(B, P)`` int64 with ``P`` the longest
    prompt of the batch: the engine's input (positions ``clamp(cumsum(mask) - 1, 0)``)."""
    width = max(len(ids) for ids in prompt_ids)
    padded = [pad_ids(ids, width, pad_id, left=True) for ids in prompt_ids]
    input_ids = torch.stack([p[0] for p in padded])
    attention_mask = torch.stack([p[1] for p in padded])
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask,
                  "position_ids": positions_from_mask(attention_mask)})


def decode_responses(out: Batch, tokenizer: Any) -> list[str]:
    """Each row's response text: the ``responses`` ids where ``response_mask`` is 1 (up to and including the first
    EOS), decoded with ``skip_special_tokens=True`` (verl's ``main_generation``)."""
    return [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
            for ids, mask in zip(out["responses"], out["response_mask"])]


def response_log_probs(out: Batch) -> list[list[float]]:
    """Each row's ``rollout_log_probs`` where ``response_mask`` is 1: the engine's log-prob of each response token
    (as :func:`decode_responses` keeps the ids), float32 values as Python floats."""
    return [lp[mask.bool()].tolist() for lp, mask in zip(out["rollout_log_probs"], out["response_mask"])]


def write_responses(data_path: str, responses: list[list[str]], output: str,
                    log_probs: list[list[list[float]]] | None = None) -> None:
    """Write ``data_path``'s table (schema and values unchanged) plus the ``responses`` column (``list<string>``,
    replacing one already there) and, when given, ``rollout_log_probs`` (``list<list<float32>>``, one list per
    response) to ``output``, atomically; creates the output's folder.

    Raises:
        ValueError: ``responses`` (or ``log_probs``) does not have one entry per row. ``OSError`` from the write
            (nothing partial left).
    """
    table = pq.read_table(copy_to_local(data_path))
    columns = {RESPONSES: pa.array(responses, type=pa.list_(pa.string()))}
    if log_probs is not None:
        columns[LOG_PROBS] = pa.array(log_probs, type=pa.list_(pa.list_(pa.float32())))
    for name, column in columns.items():
        if len(column) != table.num_rows:
            raise ValueError(f"{len(column)} {name} lists for {table.num_rows} rows of {data_path}")
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, column)
        else:
            table = table.append_column(name, column)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with atomic_write(output) as fh:
        pq.write_table(table, fh)


def main(argv: list[str] | None = None) -> int:
    """``python -m rlhf_core.trainer.main_generation key=value ...`` (= ``rlhf generate``); returns the exit code."""
    from rlhf_core.trainer.commands import generate_main

    return generate_main(argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
