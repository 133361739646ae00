"""Built-in tools: the GSM8K answer checker (verl ``verl/tools/gsm8k_tool.py`` behaviour) and an arithmetic
calculator that walks Python's ``ast`` (never ``eval``)."""
from __future__ import annotations

import ast
import operator
from typing import Any

from rlhf_core.reward.scorers import gsm8k
from rlhf_core.tools.base import BaseTool
from rlhf_core.tools.schemas import ToolResponse

# verl's gsm8k tool: a submission that does not raise the reward costs this much (discourages re-submitting)
NON_IMPROVING_SUBMISSION_PENALTY = -0.05



def score_gsm8k_state(state: dict[str, Any], method: str, missing_ground_truth: str) -> float:
    """GSM8K score (1.0 or 0.0, no format credit) of ``state["response"]`` against ``state["ground_truth"]``, as
    verl's gsm8k tool (``method="flexible"``) and gsm8k interaction (``method="strict"``) score a turn.

    Raises:
        ValueError: ``missing_ground_truth`` when the instance was created without a ground truth.
    """
    if state["ground_truth"] is None:
        raise ValueError(missing_ground_truth)
    return gsm8k.compute_score(state["response"], str(state["ground_truth"]), method=method,
                               format_score=0.0, score=1.0)

class Gsm8kTool(BaseTool):
    """``calc_gsm8k_reward``: scores a submitted answer against the row's ground truth.

    ``create(ground_truth=...)`` or ``create(create_kwargs={"ground_truth": ...})`` (verl's two call forms) sets
    the truth. ``execute(id, {"answer": "18"})`` prefixes ``#### `` when missing, scores with the GSM8K
    ``flexible`` extraction (1.0 correct, 0.0 otherwise), and returns ``"Current parsed answer='18'
    reward=1.0"`` with step reward 0.0 when the score rose, else -0.05. ``calc_reward`` is the last score.
    """

    def __init__(self, config: dict, tool_schema) -> None:
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any):
        instance_id, response = await super().create(instance_id)
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        state = self._instances[instance_id]
        answer = str(parameters.get("answer", ""))
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NON_IMPROVING_SUBMISSION_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return score_gsm8k_state(self._instances[instance_id], "flexible",
                                 "calc_gsm8k_reward has no ground_truth: give "
                                 "tools_kwargs.calc_gsm8k_reward.create_kwargs")

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 256
MAX_EXPONENT = 64          # 10**64 is far past any GSM8K number; 9**9**9 would hang the worker
MAX_MAGNITUDE = 1e100


def evaluate_arithmetic(expression: str) -> int | float:
    """Value of an arithmetic expression: numbers, ``+ - * / // % **``, unary ``+``/``-``, parentheses.

    Raises:
        ValueError: anything else (names, calls, attributes, strings...), an expression over
            ``MAX_EXPRESSION_CHARS``, an exponent over ``MAX_EXPONENT`` in size, a result over ``MAX_MAGNITUDE``,
            or division by zero.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from exc

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError as exc:
                raise ValueError("division by zero") from exc
            except OverflowError as exc:
                raise ValueError("result out of range") from exc
            if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
                raise ValueError("result out of range")
            return value
        raise ValueError(f"{type(node).__name__} is not allowed in an arithmetic expression")

    return walk(tree)


class CalculatorTool(BaseTool):
    """``calculator``: ``execute(id, {"expression": "3 * (4 + 2)"})`` → ``"18"`` (a float result with an integer
    value prints as an integer: ``"7/2*2"`` → ``"7"``). A bad expression raises ``ValueError``, which the tool
    runner turns into an error response."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        value = evaluate_arithmetic(str(parameters.get("expression", "")))
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return ToolResponse(text=str(value)), 0.0, {}
