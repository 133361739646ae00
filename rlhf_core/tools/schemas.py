"""Tool schemas in OpenAI function form and the tool response (verl ``verl/tools/schemas.py`` field names).

A tool config's ``tool_schema`` must validate as :class:`OpenAIFunctionToolSchema`::

    type: function
    function: {name: str, description: str, parameters: {type: object, properties: {...}, required: [...]}}

``required`` may only name declared properties (verl does not check this; a schema that requires an undeclared
argument can never be called correctly, so we refuse it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: a JSON-schema ``type`` and optional ``description`` / ``enum``."""

    model_config = ConfigDict(extra="allow")
    type: str
    description: str | None = None
    enum: list[str] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters object: ``type: object`` with named properties and the required ones."""

    type: Literal["object"]
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _required_are_declared(self) -> "OpenAIFunctionParametersSchema":
        missing = [name for name in self.required if name not in self.properties]
        if missing:
            raise ValueError(f"required names undeclared properties {missing}; declared: {sorted(self.properties)}")
        return self


class OpenAIFunctionSchema(BaseModel):
    """The function: a non-empty ``name``, a ``description`` and its parameters."""

    name: str = Field(min_length=1)
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(
        default_factory=lambda: OpenAIFunctionParametersSchema(type="object", properties={}, required=[])
    )
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in OpenAI form: ``{"type": "function", "function": {...}}``; ``model_dump()`` goes to the chat
    template's ``tools=`` argument."""

    type: Literal["function"]
    function: OpenAIFunctionSchema


@dataclass
class ToolResponse:
    """What a tool returns to the model; only text is rendered here (verl's ``image``/``video`` are not)."""

    text: str | None = None


@dataclass(frozen=True)
class FunctionCall:
    """One tool call parsed from an assistant turn.

    Attributes:
        name: the tool name the model wrote.
        arguments: the parsed JSON arguments (``{}`` when ``error`` is set).
        error: why the call is malformed (bad JSON, missing ``name``, arguments not an object), else ``None``.
    """

    name: str
    arguments: dict[str, Any]
    error: str | None = None
