"""Actions an agent can take, and their validation.

An action is ``{"type": "tool", "name": str, "args": dict}`` or ``{"type": "terminate"}`` (with an
optional ``"output"``, the agent's final answer). Plain dicts and the models below are both
accepted; :func:`parse_action` turns either into a model or raises :class:`InvalidActionError`
before anything runs.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from softprobe.gym.errors import InvalidActionError
from softprobe.gym.text import has_surrogate, readable_text

#: Largest action accepted, as UTF-8 JSON. Bigger ones are refused before they reach the shim.
MAX_ACTION_BYTES = 16 * 1024 * 1024
#: Deepest nesting of lists and objects in tool arguments (well below any JSON decoder's limit).
MAX_ARGS_DEPTH = 64
#: Largest magnitude of an integer argument (64-bit signed): bigger ones cannot become a float
#: or a C integer in the shim (``10**400`` would raise OverflowError there).
MAX_INT = 2**63 - 1


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


Action = Annotated[ToolAction | TerminateAction, Field(discriminator="type")]

_action_adapter: TypeAdapter[ToolAction | TerminateAction] = TypeAdapter(Action)


def parse_action(action: object) -> ToolAction | TerminateAction:
    """Validate ``action`` (a dict or an action model) and return it as a model.

    Every value is checked before anything runs: text must be valid Unicode (no lone
    surrogates, keys included), numbers finite and within 64-bit integer range, values plain
    JSON (objects with text keys, arrays, text, numbers, booleans, null), nesting at most
    ``MAX_ARGS_DEPTH`` deep, and the JSON that will be sent at most ``MAX_ACTION_BYTES``.

    Raises:
        InvalidActionError: ``action`` is not an action: wrong shape or types, an unknown
            ``type``, or a value as above. The message says which.
    """
    if isinstance(action, (ToolAction, TerminateAction)):
        parsed = action
    else:
        if not isinstance(action, dict):
            raise InvalidActionError(
                f"an action must be a dict or an action model, not {type(action).__name__}; "
                'e.g. {"type": "tool", "name": "fs.read", "args": {"path": "notes.md"}}'
            )
        _check_text_keys(action)
        try:
            parsed = _action_adapter.validate_python(action)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'action'}: {e['msg']}" for e in err.errors()
            )
            raise InvalidActionError(f"invalid action: {readable_text(problems)}") from None
    if isinstance(parsed, ToolAction):
        _check_text(parsed.name, "name")
        _check_values(parsed.args)
    elif parsed.output is not None:
        _check_text(parsed.output, "output")
    encoded_size(parsed)
    return parsed


def loads_action(text: str | bytes) -> Any:
    """Parse an action sent as JSON text. ``NaN`` and ``Infinity`` are refused (they are not
    JSON, and a non-finite number must never reach a timer).

    Raises:
        InvalidActionError: the text is not strict JSON.
    """
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        raise InvalidActionError(f"the action is not JSON: {readable_text(str(err))}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


#: One encoder for every message (``json.dumps`` with options builds a new one per call).
_WIRE_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def wire_json(value: Any) -> bytes:
    """``value`` as the UTF-8 JSON the host sends to the shim (one encoder for both, so what is
    size-checked is exactly what is sent). Raises ValueError, TypeError or UnicodeEncodeError
    for what cannot be sent."""
    return _WIRE_ENCODER.encode(value).encode("utf-8")


def _check_text_keys(action: dict[Any, Any]) -> None:
    for key in action:
        if isinstance(key, str):
            _check_text(key, "a key")


def _check_text(text: str, where: str) -> None:
    if has_surrogate(text):
        raise InvalidActionError(
            f"invalid action: {where} contains text that is not valid Unicode (a lone "
            f"surrogate: {readable_text(text)[:80]!r}); send bytes as base64 or valid UTF-8 text"
        )


def _check_values(args: dict[str, Any]) -> None:
    """Walk the arguments once: plain JSON types, valid text, finite bounded numbers, depth."""
    stack: list[tuple[Any, int, str]] = [(args, 1, "args")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_ARGS_DEPTH:
            raise InvalidActionError(
                f"invalid action: arguments are nested too deeply (more than {MAX_ARGS_DEPTH} levels)"
            )
        if isinstance(value, dict):
            for key, child in value.items():
                if not isinstance(key, str):
                    raise InvalidActionError(f"invalid action: {where} has a key that is not text: {key!r}")
                _check_text(key, f"a key of {where}")
                stack.append((child, depth + 1, f"{where}.{readable_text(key)[:40]}"))
        elif isinstance(value, (list, tuple)):
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if not -MAX_INT <= value <= MAX_INT:
                raise InvalidActionError(
                    f"invalid action: {where} is an integer outside the 64-bit range"
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidActionError(
                    f"invalid action: {where} is {value!r}; numbers must be finite"
                )
        else:
            raise InvalidActionError(
                f"invalid action: {where} is a {type(value).__name__}; arguments must be JSON "
                "values (objects, arrays, text, numbers, booleans, null)"
            )


def encoded_size(action: ToolAction | TerminateAction) -> int:
    """Bytes of the action as sent (UTF-8 JSON, :func:`wire_json`); raises InvalidActionError if
    it cannot be sent or exceeds ``MAX_ACTION_BYTES``."""
    payload: Any = action.args if isinstance(action, ToolAction) else action.output
    try:
        data = wire_json(payload)
    except UnicodeEncodeError:
        raise InvalidActionError(
            "invalid action: it contains text that is not valid Unicode (a lone surrogate); "
            "send bytes as base64 or valid UTF-8 text"
        ) from None
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidActionError(f"invalid action: arguments are not JSON: {err}") from None
    if len(data) > MAX_ACTION_BYTES:
        raise InvalidActionError(
            f"invalid action: {len(data)} bytes of JSON exceeds the {MAX_ACTION_BYTES}-byte limit"
        )
    return len(data)
