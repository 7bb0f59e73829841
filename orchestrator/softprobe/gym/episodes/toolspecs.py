"""An episode's tools as JSON Schema, and in the function-calling shape LLM APIs take.

``host.tool_specs(episode_id=...)`` returns a :class:`ToolSchema` per tool: the built-in tools
(their schemas are defined here, once, matching what the shim accepts), then the tools the image
declares and those the world adds (their schemas come from the shim's hello).

Function names: OpenAI-style APIs want ``^[a-zA-Z0-9_-]{1,64}$``, and our tool names have dots
(``crm.get_account``). :func:`function_name_for_tool` maps each ``.`` to ``__``
(``crm__get_account``); :func:`tool_name_for_function` maps back. The mapping is reversible for
every name without ``__`` of its own; pass the episode's schemas to the reverse function to
resolve any name exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from softprobe.gym.errors import ConfigurationError
from softprobe.gym.shim.protocol import HelloTool
from softprobe.gym.worlds import BUILTIN_TOOLS, SESSION_TOOLS

_PATH = {"type": "string", "description": "a path relative to the workspace (/workspace)"}

#: The built-in tools' descriptions and argument schemas: exactly what the shim's argument checks
#: accept (required keys, types; no other keys).
BUILTIN_TOOL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "fs.read": (
        "Read a workspace file as text (a long file: its head and tail around a marker).",
        {"type": "object", "properties": {"path": _PATH}, "required": ["path"], "additionalProperties": False},
    ),
    "fs.write": (
        "Write text to a workspace file, creating it (and its folders) or replacing its content.",
        {
            "type": "object",
            "properties": {"path": _PATH, "content": {"type": "string", "description": "the new content"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    ),
    "fs.list": (
        "List a workspace folder: each entry's name, type (file, dir, symlink, other) and size.",
        {
            "type": "object",
            "properties": {"path": {**_PATH, "description": "a folder relative to the workspace (default '.')"}},
            "additionalProperties": False,
        },
    ),
    "fs.delete": (
        "Delete a workspace file, link or folder (with everything in it).",
        {"type": "object", "properties": {"path": _PATH}, "required": ["path"], "additionalProperties": False},
    ),
    "shell.exec": (
        "Run a /bin/sh command in the workspace; the observation is its output (stdout and stderr).",
        {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the shell command"},
                "timeout_s": {
                    "type": "number", "exclusiveMinimum": 0,
                    "description": "seconds before the command is killed (at most the host's limit)",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    ),
}
assert tuple(BUILTIN_TOOL_SCHEMAS) == BUILTIN_TOOLS  # one list of built-in tools

_SESSION_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                 "description": "the session's name (1-64 letters, digits, '_', '.', '-')"}

#: The session tools' descriptions and schemas (listed only with the ``sessions`` capability).
SESSION_TOOL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "session.start": (
        "Start a persistent session that outlives the step: a bash shell, a Python interpreter (its "
        "variables kept between sends) or a program (an argv), in the workspace.",
        {
            "type": "object",
            "properties": {
                "name": _SESSION_NAME,
                "kind": {
                    "description": '"bash", "python", or a program as a list of strings',
                    "anyOf": [{"type": "string", "enum": ["bash", "python"]},
                              {"type": "array", "items": {"type": "string"}, "minItems": 1}],
                },
            },
            "required": ["name", "kind"],
            "additionalProperties": False,
        },
    ),
    "session.send": (
        "Send input to a session; the observation is its output since the last read. A bash command or a "
        "Python cell is waited for until done; give `until` to wait for a text in the output instead.",
        {
            "type": "object",
            "properties": {
                "name": _SESSION_NAME,
                "input": {"type": "string", "description": "what the session reads (a command, a cell)"},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0,
                              "description": "seconds to wait (at most the host's limit); the session goes on"},
                "until": {"type": "string", "minLength": 1, "description": "return once this text is output"},
            },
            "required": ["name", "input"],
            "additionalProperties": False,
        },
    ),
    "session.close": (
        "Close a session: every process it started is killed.",
        {"type": "object", "properties": {"name": _SESSION_NAME}, "required": ["name"],
         "additionalProperties": False},
    ),
    "session.list": (
        "List the open sessions: name, kind, whether it runs, unread output.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
}
assert tuple(SESSION_TOOL_SCHEMAS) == SESSION_TOOLS

_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def function_name_for_tool(name: str) -> str:
    """The function name a model is given for tool ``name``: each ``.`` becomes ``__``."""
    return name.replace(".", "__")


def tool_name_for_function(function_name: str, tools: Iterable[ToolSchema] | None = None) -> str:
    """The tool a model's function call names: each ``__`` back to ``.``.

    Args:
        function_name: the ``name`` of the model's tool call.
        tools: the episode's schemas (``tool_specs``): then the name is looked up among them,
            exact even for a tool whose own name holds ``__``.

    Raises:
        ConfigurationError: ``tools`` is given and none of them has that function name.
    """
    if tools is None:
        return function_name.replace("__", ".")
    known = {tool.function_name: tool.name for tool in tools}
    if function_name not in known:
        raise ConfigurationError(
            f"no tool of the episode is called {function_name!r} as a function; known: {', '.join(sorted(known))}"
        )
    return known[function_name]


class ToolSchema(BaseModel):
    """One tool of an episode, for a policy to hand to a model.

    Attributes:
        name: the tool's name as actions use it (``crm.get_account``).
        description: what it does.
        parameters: the JSON Schema of its arguments (an object schema).
        builtin: whether it is one of the shim's built-in tools.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any]
    builtin: bool

    @property
    def function_name(self) -> str:
        """The name in the function-calling shape (see :func:`function_name_for_tool`)."""
        return function_name_for_tool(self.name)

    def as_function(self) -> dict[str, Any]:
        """``{"type": "function", "function": {"name", "description", "parameters"}}``, the shape
        OpenAI-style chat APIs take in ``tools``.

        Raises:
            ConfigurationError: the tool's function name is not one such APIs accept (over 64
                characters once its dots are doubled).
        """
        if not _FUNCTION_NAME.match(self.function_name):
            raise ConfigurationError(
                f"tool {self.name!r} has no valid function name ({self.function_name!r} is not "
                "1-64 letters, digits, '_' or '-'); give it a shorter name"
            )
        return {
            "type": "function",
            "function": {"name": self.function_name, "description": self.description, "parameters": self.parameters},
        }


def offered_tools(tools: Sequence[HelloTool], *, sessions: bool) -> list[HelloTool]:
    """The tools of a shim's hello that an episode offers, in its order: all of them but the
    built-in session tools, which only a host that declares ``sessions`` offers."""
    return [tool for tool in tools if sessions or not (tool.builtin and tool.name in SESSION_TOOL_SCHEMAS)]


def tool_schemas(tools: Sequence[HelloTool], *, sessions: bool = False) -> list[ToolSchema]:
    """The schemas of the tools a shim's hello lists, in its order; the session tools only with
    ``sessions`` (the host declares the capability).

    A schema is what the shim publishes for the tool; the shim itself enforces only its
    ``required``, each property's ``type`` and ``additionalProperties: false`` when a call
    arrives. Other keywords (``minimum``, ``enum``, ``pattern``, ...) reach the model but are not
    checked: a tool must validate those itself.

    Raises:
        ConfigurationError: two tools would have the same function name (``a.b`` and ``a__b``),
            or a tool's function name is over 64 characters (an image-declared tool with a long
            dotted name; an added tool's is refused when it is defined).
    """
    schemas = []
    for tool in offered_tools(tools, sessions=sessions):
        if tool.builtin and tool.name in SESSION_TOOL_SCHEMAS:
            description, parameters = SESSION_TOOL_SCHEMAS[tool.name]
            schemas.append(ToolSchema(name=tool.name, description=description, parameters=parameters, builtin=True))
        elif tool.builtin and tool.name in BUILTIN_TOOL_SCHEMAS:
            description, parameters = BUILTIN_TOOL_SCHEMAS[tool.name]
            schemas.append(ToolSchema(name=tool.name, description=description, parameters=parameters, builtin=True))
        else:
            parameters = _object_schema(tool.args)
            schemas.append(ToolSchema(name=tool.name, description=tool.description, parameters=parameters,
                                      builtin=tool.builtin))
    seen: dict[str, str] = {}
    for schema in schemas:
        if not _FUNCTION_NAME.match(schema.function_name):
            raise ConfigurationError(
                f"tool {schema.name!r} has no valid function name ({schema.function_name!r} is not "
                "1-64 letters, digits, '_' or '-'); give it a shorter name in the image's tool manifest"
            )
        other = seen.setdefault(schema.function_name, schema.name)
        if other != schema.name:
            raise ConfigurationError(
                f"tools {other!r} and {schema.name!r} have the same function name {schema.function_name!r}; "
                "rename one of them"
            )
    return schemas


def _object_schema(args: dict[str, Any] | None) -> dict[str, Any]:
    """``args`` as a complete object schema (a manifest may leave out ``type`` and ``properties``)."""
    schema = dict(args or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


__all__ = ["BUILTIN_TOOL_SCHEMAS", "ToolSchema", "function_name_for_tool", "tool_name_for_function", "tool_schemas"]
