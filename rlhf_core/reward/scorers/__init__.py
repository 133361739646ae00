"""Rule-based scorers keyed by ``data_source`` (verl ``verl.utils.reward_score.default_compute_score``).

Import-light on purpose (no torch): reward worker processes import this package.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from rlhf_core.reward.scorers import countdown, gsm8k, math_boxed, sandbox_fusion as sandbox

GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
COUNTDOWN_SOURCES = (countdown.DATA_SOURCE,)
KNOWN_DATA_SOURCES = GSM8K_SOURCES + MATH_SOURCES + COUNTDOWN_SOURCES


class UnknownDataSourceError(ValueError):
    """No default scorer for a ``data_source``: a configuration error (every sample of that source would fail), so
    reward managers let it propagate instead of scoring the sample 0."""


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    gsm8k_method: str = "strict",
    sandbox_fusion: sandbox.SandboxFusion | None = None,
    **scorer_kwargs: Any,
) -> float:
    """Score one response with the scorer registered for its ``data_source``.

    ``openai/gsm8k`` → :func:`gsm8k.compute_score`, a float as verl's (``gsm8k_method`` strict by default);
    MATH sources → :func:`math_boxed.compute_score`, a dict ``{score, acc, pred, decided_by}`` whose keys become
    ``reward_extra_info`` columns (``decided_by``: ``math_verify`` or ``string``, the path that decided);
    ``countdown`` → :func:`countdown.compute_score`, a dict ``{score, acc, pred}`` (``format_score``/``score`` from
    ``scorer_kwargs`` apply to it too); ``codecontests``/``apps``/``codeforces``/``taco`` → run in the
    ``sandbox_fusion`` service (:func:`sandbox.compute_score`, a dict ``{score, passed, cases}``), which
    ``reward_model.sandbox_fusion.url`` names (verl 0.9; without it verl runs the code locally, which this project
    does not: an error). ``scorer_kwargs`` (from ``custom_reward_function.reward_kwargs``)
    go to the GSM8K scorer: ``format_score`` (a number extracted but wrong; verl's default 0.0) and ``score``.

    Raises:
        UnknownDataSourceError: (a ``ValueError``) for an unknown ``data_source``, naming the known ones, or a code
        data source without a sandbox url.
    """
    if data_source in GSM8K_SOURCES:
        return gsm8k.compute_score(solution_str, str(ground_truth), method=gsm8k_method, **scorer_kwargs)
    if data_source in MATH_SOURCES:
        return math_boxed.compute_score(solution_str, str(ground_truth))
    if data_source in COUNTDOWN_SOURCES:
        return countdown.compute_score(solution_str, ground_truth, **scorer_kwargs)
    check_default_data_source(data_source, sandbox_fusion is not None)  # a code source with its sandbox passes
    return sandbox.compute_score(sandbox_fusion, solution_str, ground_truth)


def check_default_data_sources(sources: Iterable[Any], has_sandbox: bool = False,
                               rows: Sequence[int] | None = None) -> list[Any]:
    """:func:`check_default_data_source` for each distinct value of ``sources`` (a column, row by row); returns the
    distinct values in first-seen order. ``rows``: when ``sources`` are a column's distinct values already
    (``rlhf_core.data.rl_schema.distinct_first_rows``), the row of each one's first occurrence, named in the error
    instead of the position in ``sources``.

    Raises:
        UnknownDataSourceError: for the first row the default function cannot score, its message prefixed with
            ``row <index>: ``.
    """
    seen: list[Any] = []
    for i, source in enumerate(sources):
        if source in seen:
            continue
        try:
            check_default_data_source(source, has_sandbox)
        except UnknownDataSourceError as exc:
            raise UnknownDataSourceError(f"row {i if rows is None else rows[i]}: {exc}") from None
        seen.append(source)
    return seen


def check_default_data_source(data_source: Any, has_sandbox: bool = False) -> None:
    """Refuse a ``data_source`` that :func:`default_compute_score` cannot score, with the message it would raise:
    one outside :data:`KNOWN_DATA_SOURCES` and the code sources, or a code source when no Sandbox Fusion service
    is configured (``has_sandbox``). Lets ``rlhf ppo`` and ``rlhf eval`` check every row before any model loads.

    Raises:
        UnknownDataSourceError: naming the data source and the known ones (or the sandbox key to set).
    """
    if data_source in KNOWN_DATA_SOURCES or (has_sandbox and data_source in sandbox.CODE_SOURCES):
        return
    if data_source in sandbox.CODE_SOURCES:
        raise UnknownDataSourceError(
            f"data_source={data_source!r} is scored by running the code in a Sandbox Fusion service: set "
            "reward_model.sandbox_fusion.url (verl 0.9: reward.sandbox_fusion.url) to its run_code endpoint")
    raise UnknownDataSourceError(
        f"no default reward function for data_source={data_source!r}; known data sources: "
        f"{list(KNOWN_DATA_SOURCES)}. Set custom_reward_function.path to score other data."
    )
