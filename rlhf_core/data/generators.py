"""Built-in data generators: an experiment's ``data.generator`` names one (instead of ``train_files``/``val_files``).

Every entry has the same signature, ``generate(out_dir, n_train, n_val, **args) -> {"train": parquet, "val":
parquet}`` (verl's RL schema, the first ``n_train``/``n_val`` rows; ``<= 0`` = the generator's whole split or
default size), plus ``check_args(args)`` (refuses an unknown or ill-typed argument before any stage runs) and
``input_files(args)`` (the files the output is a pure function of, for the cache key; None when it is not
cacheable, e.g. a hub download).
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlhf_core.data.countdown import check_ranges, generate_countdown


def _take(src: str, dest: str, n: int) -> str:
    """The first ``n`` rows of parquet ``src`` in ``dest`` (all when ``n <= 0``), written atomically."""
    import pyarrow.parquet as pq

    from rlhf_core.atomic import atomic_write

    table = pq.read_table(src)
    if n > 0:
        table = table.slice(0, min(n, table.num_rows))
    with atomic_write(dest) as fh:
        pq.write_table(table, fh)
    return dest


def gsm8k_source(source_dir: str | None) -> str | None:
    """The GSM8K folder read: ``source_dir``, else ``$GSM8K_DIR``, else None (the Hugging Face hub)."""
    return source_dir or os.environ.get("GSM8K_DIR") or None


def _gsm8k(out_dir: str, n_train: int, n_val: int, source_dir: str | None = None,
           multiturn: bool = False) -> dict[str, str]:
    from rlhf_core.data.gsm8k import preprocess_gsm8k
    from rlhf_core.data.gsm8k_multiturn import add_tool_traces

    splits = preprocess_gsm8k(gsm8k_source(source_dir), os.path.join(out_dir, "full"), multiturn=multiturn)
    train = _take(splits["train"], os.path.join(out_dir, f"train_{n_train}.parquet"), n_train)
    val = _take(splits["test"], os.path.join(out_dir, f"test_{n_val}.parquet"), n_val)
    if multiturn:  # the SFT stage reads the traces (a messages column); PPO ignores the extra column
        train, val = add_tool_traces(train, train), add_tool_traces(val, val)
    return {"train": train, "val": val}


def gsm8k(out_dir: str, n_train: int, n_val: int, source_dir: str | None = None) -> dict[str, str]:
    """GSM8K in verl's schema (``rlhf_core.data.gsm8k``) from ``source_dir``'s ``train.jsonl``/``test.jsonl``
    (null: ``$GSM8K_DIR``, else the hub), cut to the first ``n_train``/``n_val`` rows."""
    return _gsm8k(out_dir, n_train, n_val, source_dir)


def gsm8k_tools(out_dir: str, n_train: int, n_val: int, source_dir: str | None = None) -> dict[str, str]:
    """GSM8K in verl's multi-turn tool schema plus a ``messages`` column of synthetic tool-use traces for SFT
    (``rlhf_core.data.gsm8k_multiturn``)."""
    return _gsm8k(out_dir, n_train, n_val, source_dir, multiturn=True)


def countdown(out_dir: str, n_train: int, n_val: int, min_numbers: int = 3, max_numbers: int = 3,
              max_number: int = 9) -> dict[str, str]:
    """Countdown problems (``rlhf_core.data.countdown``, seed 0): ``n_train``/``n_val`` rows (``<= 0``: 20000 and
    500)."""
    n_train, n_val = (n_train if n_train > 0 else 20000), (n_val if n_val > 0 else 500)
    args = {"min_numbers": min_numbers, "max_numbers": max_numbers, "max_number": max_number}
    folder = os.path.join(out_dir, f"full_{n_train}_{n_val}" + "".join(f"_{k}{v}" for k, v in sorted(args.items())))
    splits = generate_countdown(folder, n_train, n_val, seed=0, **args)
    return {"train": splits["train"], "val": splits["test"]}


def _local_folder(folder: str | None) -> Path | None:
    """``folder`` as a local ``Path`` (a plain path or a ``file://`` URL, ``~`` expanded); None for the hub or a
    remote URL."""
    from rlhf_core.data.fs import copy_to_local, is_local

    return Path(copy_to_local(folder)) if folder and is_local(folder) else None  # local: nothing is copied


def _gsm8k_inputs(args: dict[str, Any]) -> list[str] | None:
    folder = _local_folder(gsm8k_source(args.get("source_dir")))
    if folder is None:
        return None
    return [str(p) for p in sorted(folder.glob("*")) if p.suffix in (".jsonl", ".parquet")]


def _hub_unreachable() -> str | None:
    """Why GSM8K's hub files cannot be read now (None when both exist): offline, the stage would fail later."""
    import fsspec

    from rlhf_core.data import gsm8k as hub

    for split in ("train", "test"):
        url = hub.HUB_URL.format(split=split)
        try:
            fs, path = fsspec.core.url_to_fs(url)
            found = fs.exists(path)
        except Exception as exc:  # noqa: BLE001 - offline, proxy, missing huggingface_hub...: cannot be read
            found, why = False, f"cannot be reached ({type(exc).__name__}: {exc})"
        else:
            why = "does not exist"
        if not found:
            return (f"GSM8K is read from the Hugging Face hub (source_dir null, GSM8K_DIR unset), and {url} {why}; "
                    "set data.generator_args.source_dir or GSM8K_DIR to a folder with train.jsonl and test.jsonl")
    return None


def _gsm8k_missing(args: dict[str, Any]) -> str | None:
    given = gsm8k_source(args.get("source_dir"))
    if given is None:  # the hub: checked now, as the stage would fail on it
        return _hub_unreachable()
    folder = _local_folder(given)
    if folder is None:  # a remote URL: read when the stage runs
        return None
    if not folder.exists():
        return f"{given} does not exist"
    missing = [f for f in ("train.jsonl", "test.jsonl") if not (folder / f).is_file()]
    if missing:
        return f"{given} has no {' or '.join(missing)} (GSM8K's original question/answer jsonl files)"
    return None


@dataclass(frozen=True)
class Generator:
    """A registered generator: ``generate(out_dir, n_train, n_val, **args)`` and its argument checks."""

    generate: Callable[..., dict[str, str]]
    input_files: Callable[[dict[str, Any]], list[str] | None]
    check_ranges: Callable[..., None] | None = None
    missing_source: Callable[[dict[str, Any]], str | None] = lambda args: None  # what is wrong with the inputs

    def check_args(self, args: dict[str, Any]) -> None:
        """Refuse an argument ``generate`` does not take, or a value of another type than its default's.

        Raises:
            ValueError: naming the argument, the value and what is expected.
        """
        params = {k: p for k, p in inspect.signature(self.generate).parameters.items()
                  if k not in ("out_dir", "n_train", "n_val")}
        for key, value in args.items():
            if key not in params:
                raise ValueError(f"unknown argument {key!r}; known: {list(params)}")
            default = params[key].default
            if default is not None and value is not None and (
                    type(value) is not type(default)):
                raise ValueError(f"{key} must be {type(default).__name__}, got {value!r}")
        if self.check_ranges is not None:
            self.check_ranges(**{k: args.get(k, p.default) for k, p in params.items()})


GENERATORS: dict[str, Generator] = {}


def data_label(generator: str | None) -> str:
    """The name an experiment's data carry in MLflow (``<label>_train``/``<label>_val`` datasets and registered-model
    tags): the generator's name, or ``data`` for the experiment's own files."""
    return generator or "data"


def register(name: str, generator: Generator) -> None:
    """Add a generator under ``name``.

    Raises:
        ValueError: ``name`` is taken.
    """
    if name in GENERATORS:
        raise ValueError(f"data generator {name!r} is already registered")
    GENERATORS[name] = generator


register("gsm8k", Generator(gsm8k, _gsm8k_inputs, missing_source=_gsm8k_missing))
register("gsm8k_tools", Generator(gsm8k_tools, _gsm8k_inputs, missing_source=_gsm8k_missing))
register("countdown", Generator(countdown, lambda args: [], check_ranges))
