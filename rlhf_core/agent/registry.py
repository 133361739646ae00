"""Choosing and building agent loops from the config (verl ``agent_loop.py`` registry semantics).

* ``rollout.agent.default_agent_loop``: the loop of rows without an ``agent_name`` column
  (``single_turn_agent``, ``tool_agent`` and ``collabllm_agent`` built in);
* ``rollout.agent.agent_loop_config_path``: a YAML list of ``{name: ..., _target_: pkg.module.Class, ...}``;
  each registers (or replaces) ``name``; the other keys go to the class as keyword arguments;
* a row's ``agent_name`` picks its loop.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Iterable

import yaml

from rlhf_core.agent import loops, repeat  # noqa: F401 - registers single_turn_agent, tool_agent, collabllm_agent
from rlhf_core.agent.base import AGENT_LOOPS, AgentLoopBase, MultiTurnSettings
from rlhf_core.agent.interactions import load_interactions
from rlhf_core.agent.sanity import SANITY_CHECK_MODES
from rlhf_core.tools.function_tool import load_all_tools
from rlhf_core.tools.parser import TOOL_PARSERS
from rlhf_core.tools.runner import TRUNCATE_SIDES


class AgentConfigError(ValueError):
    """An agent loop config or a row that names a loop or tool that does not exist."""


def settings_from_config(rollout_cfg: Any) -> MultiTurnSettings:
    """Unpack ``actor_rollout_ref.rollout`` (``response_length`` and ``multi_turn.*``) once.

    Raises:
        ValueError: ``multi_turn.format`` without a parser, ``tool_response_truncate_side`` not
            ``left | middle | right`` or ``tokenization_sanity_check_mode`` not ``strict | ignore_strippable |
            disable`` or ``num_repeat_rollouts`` negative (at worker start, not at the first tool call).
    """
    mt = rollout_cfg.multi_turn
    if str(mt.format) not in TOOL_PARSERS:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={mt.format!r}: supported {TOOL_PARSERS.names()}")
    if str(mt.tool_response_truncate_side) not in TRUNCATE_SIDES:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side="
                         f"{mt.tool_response_truncate_side!r}: use one of {TRUNCATE_SIDES}")
    if str(mt.tokenization_sanity_check_mode) not in SANITY_CHECK_MODES:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode="
                         f"{mt.tokenization_sanity_check_mode!r}: use one of {SANITY_CHECK_MODES}")
    if mt.num_repeat_rollouts is not None and int(mt.num_repeat_rollouts) < 0:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts={mt.num_repeat_rollouts}: "
                         "use null or an int >= 0")
    return MultiTurnSettings(
        response_length=int(rollout_cfg.response_length),
        max_assistant_turns=None if mt.max_assistant_turns is None else int(mt.max_assistant_turns),
        max_user_turns=None if mt.max_user_turns is None else int(mt.max_user_turns),
        max_parallel_calls=int(mt.max_parallel_calls),
        max_tool_response_length=int(mt.max_tool_response_length),
        tool_response_truncate_side=str(mt.tool_response_truncate_side),
        format=str(mt.format),
        use_inference_chat_template=bool(mt.use_inference_chat_template),
        tokenization_sanity_check_mode=str(mt.tokenization_sanity_check_mode),
        num_repeat_rollouts=None if mt.num_repeat_rollouts is None else int(mt.num_repeat_rollouts))


# verl loop classes named by path in an agent loop config, and ours that behave the same
VERL_LOOP_ALIASES = {"recipe.collabllm.collabllm_agent_loop.CollabLLMAgentLoop":
                     "rlhf_core.agent.repeat.RepeatInteractionAgentLoop"}


def _import(target: str) -> type:
    module_name, _, attr = VERL_LOOP_ALIASES.get(target, target).rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def load_agent_loop_specs(path: str | Path | None) -> dict[str, tuple[type[AgentLoopBase], dict[str, Any]]]:
    """name → (class, extra keyword arguments): the built-in loops plus those of ``path``.

    Raises:
        AgentConfigError: naming the file and entry for an unreadable file, an entry without ``name`` or
            ``_target_``, or a target that cannot be imported or is not an :class:`AgentLoopBase` subclass.
    """
    specs = {name: (AGENT_LOOPS.get(name), {}) for name in AGENT_LOOPS.names()}
    if not path:
        return specs
    try:
        entries = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AgentConfigError(f"agent.agent_loop_config_path {path}: cannot be read: {exc}") from exc
    if not isinstance(entries, list):
        raise AgentConfigError(f"agent.agent_loop_config_path {path}: must be a list of {{name, _target_}} entries")
    for i, entry in enumerate(entries):
        where = f"agent.agent_loop_config_path {path}, entry #{i}"
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise AgentConfigError(f"{where}: needs 'name' and '_target_', got {entry!r}")
        try:
            cls = _import(str(entry["_target_"]))
        except (ImportError, AttributeError, ValueError) as exc:
            raise AgentConfigError(f"{where} ({entry['name']!r}): _target_ {entry['_target_']!r} cannot be imported: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise AgentConfigError(f"{where} ({entry['name']!r}): {entry['_target_']!r} is not an AgentLoopBase subclass")
        specs[str(entry["name"])] = (cls, {k: v for k, v in entry.items() if k not in ("name", "_target_")})
    return specs


def check_rows(rows: Iterable[dict[str, Any]], where: Iterable[str], agent_names: Iterable[str],
               default_agent_loop: str, tool_names: Iterable[str], interaction_names: Iterable[str] = ()) -> None:
    """Fail before any generation on a row whose ``agent_name`` is unknown, whose ``extra_info.tools_kwargs``
    names a tool the tool config does not declare, or (with interactions configured) whose
    ``extra_info.interaction_kwargs`` has no ``name`` of a configured interaction (verl requires it too).

    Args:
        where: one label per row (file and row number) used in the message.
        interaction_names: the interactions of ``multi_turn.interaction_config_path``; empty = none configured.

    Raises:
        AgentConfigError: naming the row, the bad name and the known names.
    """
    agent_names, tool_names, interaction_names = set(agent_names), set(tool_names), set(interaction_names)
    if default_agent_loop not in agent_names:
        raise AgentConfigError(f"rollout.agent.default_agent_loop={default_agent_loop!r} is not an agent loop; "
                               f"known: {sorted(agent_names)}")
    for row, label in zip(rows, where):
        name = row.get("agent_name") or default_agent_loop
        if name not in agent_names:
            raise AgentConfigError(f"{label}: agent_name {name!r} is not an agent loop; known: {sorted(agent_names)}")
        tools_kwargs = (row.get("extra_info") or {}).get("tools_kwargs") or {}
        # parquet stores a struct column as the union of every row's keys, null where a row lacks one
        unknown = sorted({name for name, value in tools_kwargs.items() if value is not None} - tool_names)
        if unknown:
            raise AgentConfigError(f"{label}: extra_info.tools_kwargs names unknown tools {unknown}; "
                                   f"multi_turn.tool_config_path declares {sorted(tool_names)}")
        if interaction_names:
            kwargs = (row.get("extra_info") or {}).get("interaction_kwargs") or {}
            if kwargs.get("name") not in interaction_names:
                raise AgentConfigError(f"{label}: extra_info.interaction_kwargs.name is {kwargs.get('name')!r}; "
                                       f"multi_turn.interaction_config_path declares {sorted(interaction_names)}")


def uses_agent_loop(rollout_cfg: Any) -> bool:
    """``rollout.mode == "async"`` or ``rollout.multi_turn.enable``: rows become agent-loop trajectories."""
    return str(rollout_cfg.mode) == "async" or bool(rollout_cfg.multi_turn.enable)


def check_datasets(rollout_cfg: Any, datasets: Iterable[Any]) -> None:
    """At dataset build (driver, before any worker starts): with agent loops on, load the tool and loop configs
    (their errors name the file and the tool/entry) and :func:`check_rows` every row of every dataset that
    keeps ``rows`` and ``sources`` (``RLHFDataset``; a custom dataset without them is checked per batch).

    Raises:
        ToolConfigError, InteractionConfigError, AgentConfigError: as above, naming the file and row (also a
            ``collabllm_agent`` row without ``num_repeat_rollouts`` or an interaction config).
        ValueError: ``multi_turn.interaction_config_path`` set while agent loops are off (it would do nothing).
    """
    interaction_path = rollout_cfg.multi_turn.interaction_config_path
    if not uses_agent_loop(rollout_cfg):
        if interaction_path:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interaction_path!r} "
                             "needs agent-loop rollouts: set rollout.mode=async or rollout.multi_turn.enable=True")
        return
    tools = load_all_tools(rollout_cfg.multi_turn.tool_config_path, rollout_cfg.multi_turn.function_tool_path)
    interactions = load_interactions(interaction_path) if interaction_path else {}
    specs = load_agent_loop_specs(rollout_cfg.agent.agent_loop_config_path)
    for ds in datasets:
        if ds is not None and hasattr(ds, "rows") and hasattr(ds, "sources"):
            check_rows(ds.rows, [str(s) for s in ds.sources], specs, str(rollout_cfg.agent.default_agent_loop), tools,
                       interactions)
            _check_repeat_loop_rows(rollout_cfg, ds.rows, ds.sources, specs, interactions)


def _check_repeat_loop_rows(rollout_cfg: Any, rows: Iterable[dict[str, Any]], where: Iterable[Any], specs: dict,
                            interactions: dict) -> None:
    """A row whose loop is a ``collabllm_agent`` (:mod:`rlhf_core.agent.repeat`) needs
    ``multi_turn.num_repeat_rollouts`` and an interaction config; fail at dataset build naming the row."""
    repeat_loops = {name for name, (cls, _) in specs.items() if issubclass(cls, repeat.RepeatInteractionAgentLoop)}
    mt = rollout_cfg.multi_turn
    for row, label in zip(rows, where):
        name = row.get("agent_name") or str(rollout_cfg.agent.default_agent_loop)
        if name in repeat_loops and (mt.num_repeat_rollouts is None or not interactions):
            raise AgentConfigError(f"{label}: agent loop {name!r} needs actor_rollout_ref.rollout.multi_turn."
                                   f"num_repeat_rollouts (got {mt.num_repeat_rollouts}) and "
                                   f"multi_turn.interaction_config_path (got {mt.interaction_config_path!r})")
