"""Interactions: a simulated user that answers the policy between turns (verl ``verl/interactions``).

``actor_rollout_ref.rollout.multi_turn.interaction_config_path`` names a YAML file in verl's format::

    interaction:
      - name: gsm8k                                    # optional: default = class name, lower-cased,
        class_name: rlhf_core.agent.interactions.Gsm8kInteraction   # without an "Interaction" suffix
        config: {}                                     # passed to the class as ``config`` (``name`` added)

With it, the ``tool_agent`` loop asks the interaction named by the row's ``extra_info.interaction_kwargs.name``
for a user turn after every assistant turn that calls no tool: ``generate_response`` returns
``(should_terminate_sequence, text, turn_score, metrics)``; the text becomes a user turn (``response_mask`` 0)
and the policy answers again, until the interaction ends the sequence or a turn limit is reached. The turn
scores are kept per trajectory (the batch's ``turn_scores`` column). Call order per trajectory:
``start_interaction(request_id, **interaction_kwargs)`` → ``generate_response`` (per user turn) →
``finalize_interaction(instance_id)`` (verl 0.6's loop never calls it; here it always runs, to free the state).
verl's ``verl.interactions.gsm8k_interaction.Gsm8kInteraction`` resolves to ours.
"""
from __future__ import annotations

import importlib
import inspect
import uuid
from pathlib import Path
from typing import Any


from rlhf_core.tools.builtin import score_gsm8k_state
from rlhf_core.tools.config import read_entry_list

VERL_CLASS_ALIASES = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "rlhf_core.agent.interactions.Gsm8kInteraction",
}


class InteractionConfigError(ValueError):
    """An interaction config file that cannot be used; the message names the file and the entry."""


class BaseInteraction:
    """Base class of every interaction (verl's method names and arguments).

    Args:
        config: the entry's ``config`` mapping, with ``name`` set to the interaction's name.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.name: str = str(self.config["name"]) if "name" in self.config else "interaction_agent"

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Start the state of one trajectory; returns its instance id."""
        return instance_id or str(uuid.uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        """The user turn after the policy's last message: ``(should_terminate_sequence, text, turn score,
        metrics)``. Subclasses must override it."""
        raise TypeError(f"interaction {self.name!r} ({type(self).__name__}) does not define generate_response()")

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """A score of the trajectory so far (0.0 unless overridden)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        """Drop the state of one trajectory."""
        return None


class Gsm8kInteraction(BaseInteraction):
    """verl's ``gsm8k`` interaction: scores the last assistant message against the row's ``ground_truth``
    (``start_interaction(id, ground_truth=...)``) with the GSM8K ``strict`` extraction (``#### <number>``;
    1.0 correct, else 0.0). Correct: ``"Your response is correct!"`` and the sequence ends; otherwise
    ``"Your response is incorrect! You need to reflect on your answer and try again."`` and the policy answers
    again. The turn score is that 0/1 score.
    """

    CORRECT = "Your response is correct!"
    INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None,
                                **kwargs: Any) -> str:
        instance_id = await super().start_interaction(instance_id)
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any):
        last = next((m["content"] for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._instances[instance_id]["response"] = last or ""
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, self.CORRECT, score, {}
        return False, self.INCORRECT, score, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return score_gsm8k_state(self._instances[instance_id], "strict", "the gsm8k interaction has no "
                                 "ground_truth: give extra_info.interaction_kwargs.ground_truth")

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)


def _default_name(class_name: str) -> str:
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def load_interactions(path: str | Path) -> dict[str, BaseInteraction]:
    """Name → interaction for every entry of an interaction config file (see the module docstring).

    Raises:
        InteractionConfigError: naming the file and entry for an unreadable file, no ``interaction:`` list, an
            entry without ``class_name``, a class that cannot be imported or has no async ``generate_response``,
            or two entries with the same name.
    """
    path = Path(path)
    out: dict[str, BaseInteraction] = {}
    for index, entry in enumerate(read_entry_list(path, "interaction", "interaction config", InteractionConfigError)):
        where = f"interaction config {path}, entry #{index}"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise InteractionConfigError(f"{where}: needs class_name (and optional name, config); got {entry!r}")
        class_name = str(entry["class_name"])
        name = str(entry["name"]) if entry.get("name") is not None else _default_name(class_name)
        where += f" ({name!r})"
        module_name, _, attr = VERL_CLASS_ALIASES.get(class_name, class_name).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr) if module_name else None
        except (ImportError, AttributeError, ValueError) as exc:
            raise InteractionConfigError(f"{where}: class_name {class_name!r} cannot be imported: {exc}") from exc
        if not inspect.isclass(cls) or not inspect.iscoroutinefunction(getattr(cls, "generate_response", None)):
            raise InteractionConfigError(f"{where}: {class_name!r} is not an interaction class "
                                         "(needs async generate_response())")
        if name in out:
            raise InteractionConfigError(f"{where}: a second interaction named {name!r}")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise InteractionConfigError(f"{where}: config must be a mapping, got {config!r}")
        out[name] = cls(config={**config, "name": name})
    return out


async def finalize(interaction: Any, instance_id: str) -> None:
    """``finalize_interaction(instance_id)``, or ``finalize_interaction()`` for a class written to verl's base
    signature (which takes no instance id)."""
    params = inspect.signature(interaction.finalize_interaction).parameters.values()
    takes_id = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
    await (interaction.finalize_interaction(instance_id) if takes_id else interaction.finalize_interaction())
