"""Checks of an experiment before any stage runs (``rlhf pipeline --dry-run``, and the flow's own start).

Every stage config loads; every row of every RL data file is read through fsspec (nothing is copied; only the
schema's columns) and checked against verl's schema with pyarrow compute (``rlhf_core.data.rl_schema``: column types,
required fields, non-empty prompts, and, with the default reward, every data_source known to the scorer; the first
failing row is named). The chat template and tokenising are not run here: the data stage renders every prompt when
it filters the overlong ones. SFT files: their first rows are read. The model resolves (a local folder with
``config.json``, or a URL that can be reached); the reward function file imports and has the named function; every
evaluation suite has rows. Nothing is trained and no Ray is started. A failed check raises one line naming the
experiment file and the dotted field.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import warnings
from typing import Any, Callable, Iterator

from flows.experiment import ExperimentError
from flows.settings import PipelineSettings, ppo_config, validate_overrides

HEAD_ROWS = 5  # rows read from each SFT data file (RL data files: every row)


def _unexpanded(path: str) -> str:
    """`` (it holds $NAME, ...)`` when ``path`` holds a shell variable nothing expanded (a verl script's ``$HOME``
    kept by ``rlhf experiment from-verl``), else ``""``: the path was read with the variable in it."""
    var = re.search(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", path)
    return (f" (it holds ${var.group(1)}, a shell variable nothing expands here: write the path, or convert the script "
            f"again with --set {var.group(1)}=VALUE)") if var else ""


def _read(url: str, read: Callable[[Any], Any]) -> Any:
    """``read(pyarrow.parquet.ParquetFile)`` of the parquet file ``url`` (any fsspec URL or path): a pyarrow Table.

    Raises:
        FileNotFoundError: no such file. DataError: jsonl (with the conversion), not parquet, or no rows; what
        ``read`` raises.
    """
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlhf_core.data import DataError
    from rlhf_core.data.prepare import refuse_jsonl

    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        raise FileNotFoundError(f"{url} does not exist{_unexpanded(url)}")
    refuse_jsonl(url)
    try:
        with fs.open(path, "rb") as fh:
            reader = pq.ParquetFile(fh)
            if reader.metadata.num_rows == 0:  # before ``read``: an empty file has no column types to check
                raise DataError(f"{url}: the file has no rows")
            return read(reader)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{url}: not a readable parquet file ({exc})") from exc


def _head(url: str, rows: int = HEAD_ROWS) -> Any:
    """The first ``rows`` rows of the parquet file ``url``, as a pyarrow Table (errors: :func:`_read`)."""
    import pyarrow as pa

    def read(reader: Any) -> Any:
        batch = next(reader.iter_batches(batch_size=rows), None)
        return pa.Table.from_batches([batch]) if batch is not None else reader.schema_arrow.empty_table()
    return _read(url, read)


def _columns(url: str, names: Callable[[Any], list[str]]) -> Any:
    """Every row of the columns ``names(schema)`` of the parquet file ``url`` (errors: :func:`_read`)."""
    return _read(url, lambda reader: reader.read(columns=names(reader.schema_arrow)))


def _rl_file(url: str, prompt_key: str) -> str:
    from rlhf_core.data.rl_schema import check_rl_schema, check_rl_table, rl_columns

    def columns(schema: Any) -> list[str]:
        check_rl_schema(schema, url, prompt_key)  # before reading: a missing column names the file's columns
        return rl_columns(prompt_key)

    table = _columns(url, columns)
    check_rl_table(table, url, prompt_key)
    return (f"{url}: all {table.num_rows} rows in verl's RL schema (chat template and tokenising not run here: the "
            "data stage runs them)")


def _sft_file(url: str) -> str:
    table = _head(url)
    return f"{url}: first {table.num_rows} rows read (columns {', '.join(table.column_names)})"


def _model(path: str | None, sizes: dict[str, Any]) -> str:
    import fsspec

    from rlhf_core.data.fs import copy_to_local, is_local

    if path is None:
        return f"built by build_model from the training text ({sizes or 'default sizes'})"
    if is_local(path):
        from pathlib import Path

        folder = Path(copy_to_local(path))
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{path}: no Hugging Face model folder here (no config.json){_unexpanded(path)}")
        return f"{path}: a local Hugging Face folder"
    try:
        fs, inner = fsspec.core.url_to_fs(path)
        found = fs.exists(inner.rstrip("/") + "/config.json") or fs.exists(inner)
    except Exception as exc:  # noqa: BLE001 - any client error means: cannot be reached
        raise FileNotFoundError(f"{path} cannot be reached: {type(exc).__name__}: {exc}") from None
    if not found:
        raise FileNotFoundError(f"{path} cannot be reached (no such file or folder)")
    return f"{path}: reachable"


def _reward(path: str, name: str) -> str:
    from rlhf_core.data.fs import copy_to_local

    local = copy_to_local(path)
    spec = importlib.util.spec_from_file_location("rlhf_reward_preflight", local)
    if spec is None or spec.loader is None:
        raise ExperimentError(f"{path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's file: any error on import is reported in one line
        raise ExperimentError(f"{path} does not import: {type(exc).__name__}: {exc}") from None
    if not callable(getattr(module, name, None)):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ExperimentError(f"{path} has no function {name!r} (reward.name); it defines {found}")
    return f"{path}: {name} found"


def checks(s: PipelineSettings) -> list[tuple[str, Callable[[], str]]]:
    """``[(dotted field, check)]`` of an experiment's settings; each check returns its line or raises."""
    from rlhf_core.data.generators import GENERATORS

    out: list[tuple[str, Callable[[], str]]] = [("stage configs", lambda: (validate_overrides(s), "sft, ppo and "
                                                 "evaluation overrides load")[1])]
    if s.generator is not None:
        def generator() -> str:
            wrong = GENERATORS[str(s.generator)].missing_source(s.generator_args)
            if wrong:
                raise FileNotFoundError(wrong)
            return f"{s.generator} {s.generator_args}"
        out.append(("data.generator", generator))
    for key, files in (("data.train_files", s.train_files), ("data.val_files", s.val_files)):
        out += [(f"{key}[{i}]", lambda f=f: _rl_file(f, s.prompt_key)) for i, f in enumerate(files)]
    for key, files in (("sft.train_files", s.sft_train_files), ("sft.val_files", s.sft_val_files)):
        out += [(f"{key}[{i}]", lambda f=f: _sft_file(f)) for i, f in enumerate(files)]
    for j, suite in enumerate(s.suites):
        out += [(f"evaluation.suites[{j}].files[{i}]", lambda f=f: _rl_file(f, s.prompt_key))
                for i, f in enumerate(suite["files"])]
    out.append(("model.path", lambda: _model(s.model_path, s.model_sizes)))
    if s.reward_path is not None:
        out.append(("reward.path", lambda: _reward(str(s.reward_path), s.reward_name)))
    elif s.train_files or s.val_files:
        out.append(("reward", lambda: _default_reward(s)))
    out.append(("ppo rollout engine", lambda: _engine(s)))
    if _py_executable_of(s) is not None:
        out.append(("ppo ray_kwargs.ray_init.runtime_env.py_executable", lambda: _py_executable(s)))
    return out


def _py_executable_of(s: PipelineSettings) -> str | None:
    from rlhf_core.config import ConfigError

    try:
        return ppo_config(s).ray_kwargs.ray_init.runtime_env.py_executable
    except ConfigError:  # the "stage configs" check names the bad key
        return None


def _py_executable(s: PipelineSettings) -> str:
    """The PPO stages' ``py_executable`` (``tasks.train_stages.ppo_runtime_env``) names a program on ``PATH`` here,
    for an embedded Ray (on a cluster, its nodes' business), as ``rlhf ppo`` checks before Ray starts."""
    from rlhf_core.distributed.ray_init import check_py_executable

    value = _py_executable_of(s)
    if s.ray_address not in (None, "", "local") or os.environ.get("RAY_ADDRESS"):
        return f"{value} (not checked: the workers run on the Ray cluster)"
    check_py_executable(value)
    return f"{value} (found on PATH; the ppo stages' Ray workers start with it)"


def _default_reward(s: PipelineSettings) -> str:
    """Without ``reward`` (nor a custom function or reward model in the PPO overrides), the default rule scorer
    must know the ``data.reward_fn_key`` of every row of every train/val file (its distinct values, by pyarrow), as
    ``rlhf ppo`` checks at its start (which in the flow comes after the data, model and SFT stages).

    Raises:
        DataError: naming the file, the row and the data source (with the known ones).
    """
    from rlhf_core.data import DataError
    from rlhf_core.data.rl_schema import distinct_first_rows
    from rlhf_core.reward.scorers import UnknownDataSourceError, check_default_data_sources
    from rlhf_core.reward.scorers.sandbox_fusion import sandbox_from_config

    cfg = ppo_config(s)
    if cfg.reward_model.enable or cfg.custom_reward_function.path:
        return "scored by the reward model or custom function of the ppo overrides"
    has_sandbox, key, seen = sandbox_from_config(cfg) is not None, str(cfg.data.reward_fn_key), set()
    for url in [*s.train_files, *s.val_files]:
        table = _columns(url, lambda schema: [key] if key in schema.names else [])
        values, rows = distinct_first_rows(table.column(key)) if key in table.column_names else ([], [])
        try:
            seen.update(check_default_data_sources(values, has_sandbox, rows))
        except UnknownDataSourceError as exc:
            raise DataError(f"{url} {exc} (or set the experiment's reward: {{path, name}})") from None
    return f"the default reward function scores {sorted(seen)}"


def _engine(s: PipelineSettings) -> str:
    """``actor_rollout_ref.rollout.name``'s package is importable here (vllm, sglang), as ``rlhf config check`` and
    ``main_ppo`` require; skipped on an existing Ray cluster, whose workers may have packages this machine lacks."""
    from rlhf_core.config import ConfigError
    from rlhf_core.config.notices import engine_errors

    cfg = ppo_config(s)
    name = cfg.actor_rollout_ref.rollout.name
    if s.ray_address not in (None, "", "local"):
        return f"{name} (not checked: the workers run on the Ray cluster at {s.ray_address})"
    errors = engine_errors(cfg)
    if errors:
        raise ConfigError(f"ppo.overrides: {errors[0]}")
    return f"{name} (importable here)"


@contextlib.contextmanager
def config_notes(say: Callable[[str], Any]) -> Iterator[None]:
    """Collect the config notices (``ConfigNotice``, alias notices, and the ``DeprecationWarning`` of a verl 0.6 key
    read as its 0.9 one) raised inside, and on leaving (an error too) ``say`` each distinct one once as
    ``"note <message>"``, aligned with :func:`run_checks`' ``"ok   ..."`` lines: each stage config is loaded
    several times by the checks, and Python printed every load's warnings raw. Other warnings pass through."""
    from rlhf_core.config.notices import ConfigNotice

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            seen: set[str] = set()
            for w in caught:
                ours = issubclass(w.category, ConfigNotice) or (
                    issubclass(w.category, DeprecationWarning) and _in_project(w.filename))
                text = " ".join(str(w.message).split())
                if not ours:
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)
                elif text not in seen:
                    seen.add(text)
                    say(f"note {text}")


def _in_project(filename: str) -> bool:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(filename).startswith(root + os.sep)


def run_checks(s: PipelineSettings, say: Callable[[str], Any] | None = None) -> int:
    """Run :func:`checks` in order, calling ``say`` with ``"ok   <field>: <line>"`` for each.

    Returns:
        The number of checks run.

    Raises:
        ExperimentError: the first failed check, one line ``<experiment file>: <field>: <why>`` (a ConfigError
            from ``validate_overrides`` is raised as it is: it names the stage and the file already).
    """
    from rlhf_core.cli import INPUT_ERRORS
    from rlhf_core.config import ConfigError

    items = checks(s)
    for field, check in items:
        try:
            line = check()
        except ConfigError as exc:
            if field == "stage configs":
                raise
            raise ExperimentError(f"{s.experiment_file}: {field}: {exc}") from None
        except (*INPUT_ERRORS, OSError) as exc:
            raise ExperimentError(f"{s.experiment_file}: {field}: {exc}") from None
        if say is not None:
            say(f"ok   {field}: {line}")
    return len(items)
