"""Actions an agent can take, and their validation.

An action is ``{"type": "tool", "name": str, "args": dict}`` or ``{"type": "terminate"}`` (with an
optional ``"output"``, the agent's final answer). Plain dicts and the models below are both
accepted; :func:`parse_action` turns either into a model or raises :class:`InvalidActionError`
before anything runs.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import InvalidActionError

#: Largest action accepted, as UTF-8 JSON. Bigger ones are refused before they reach the shim.
MAX_ACTION_BYTES = 16 * 1024 * 1024
#: Deepest nesting of lists and objects in tool arguments (well below any JSON decoder's limit).
MAX_ARGS_DEPTH = 64


class ToolAction(BaseModel):
    """Call one tool in the episode's container."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tool"] = "tool"
    name: str = Field(min_length=1, max_length=256, description="tool name, e.g. 'fs.read'")
    args: dict[str, Any] = Field(default_factory=dict, description="the tool's JSON arguments")


class TerminateAction(BaseModel):
    """End the episode; ``output`` is the agent's final answer, if it has one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["terminate"] = "terminate"
    output: str | None = None


Action = Annotated[Union[ToolAction, TerminateAction], Field(discriminator="type")]

_action_adapter: TypeAdapter[ToolAction | TerminateAction] = TypeAdapter(Action)


def parse_action(action: object) -> ToolAction | TerminateAction:
    """Validate ``action`` (a dict or an action model) and return it as a model.

    Raises:
        InvalidActionError: ``action`` is not an action: wrong shape or types, an unknown
            ``type``, text that is not valid Unicode, nesting deeper than ``MAX_ARGS_DEPTH``, or more than
            ``MAX_ACTION_BYTES`` of JSON. The message says which.
    """
    if isinstance(action, (ToolAction, TerminateAction)):
        parsed = action
    else:
        if not isinstance(action, dict):
            raise InvalidActionError(
                f"an action must be a dict or an action model, not {type(action).__name__}; "
                'e.g. {"type": "tool", "name": "fs.read", "args": {"path": "notes.md"}}'
            )
        try:
            parsed = _action_adapter.validate_python(action)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'action'}: {e['msg']}" for e in err.errors()
            )
            raise InvalidActionError(f"invalid action: {problems}") from None
    if isinstance(parsed, ToolAction):
        _check_depth(parsed.args)
    encoded_size(parsed)
    return parsed


def _check_depth(args: dict[str, Any]) -> None:
    stack: list[tuple[Any, int]] = [(args, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_ARGS_DEPTH:
            raise InvalidActionError(
                f"invalid action: arguments are nested too deeply (more than {MAX_ARGS_DEPTH} levels)"
            )
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def encoded_size(action: ToolAction | TerminateAction) -> int:
    """Bytes of the action as UTF-8 JSON; raises InvalidActionError if it cannot be sent."""
    try:
        data = json.dumps(action.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidActionError(
            "invalid action: it contains text that is not valid Unicode (a lone surrogate); "
            "send bytes as base64 or valid UTF-8 text"
        ) from None
    except (TypeError, ValueError) as err:
        raise InvalidActionError(f"invalid action: arguments are not JSON: {err}") from None
    if len(data) > MAX_ACTION_BYTES:
        raise InvalidActionError(
            f"invalid action: {len(data)} bytes of JSON exceeds the {MAX_ACTION_BYTES}-byte limit"
        )
    return len(data)
