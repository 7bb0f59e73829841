"""What a step's span says about the step: names, numbers and sizes, never contents.

Pure functions of a :class:`~softprobe.gym.results.StepResult` (no OpenTelemetry needed). The
observation, the action's arguments, file names and command output stay out of spans: a trace
goes to a collector that may be shared, and an agent's workspace can hold secrets.
"""

from __future__ import annotations

import json
from typing import Any

from softprobe.gym.actions import ToolAction
from softprobe.gym.results import StepResult

#: An attribute value OpenTelemetry accepts (the subset we use).
AttributeValue = str | bool | int | float


def observation_bytes(observation: Any) -> int:
    """The size of an observation as the agent gets it: UTF-8 bytes of text, else of its JSON."""
    if isinstance(observation, str):
        return len(observation.encode("utf-8", "surrogatepass"))
    try:
        return len(json.dumps(observation, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError):  # not JSON (a hook's object): its text's size
        return len(str(observation).encode("utf-8", "surrogatepass"))


def changed_path_count(diagnostics: dict[str, Any]) -> int:
    """How many workspace paths the step changed (the shim lists at most a few, with the count)."""
    count = diagnostics.get("changed_paths_count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    paths = diagnostics.get("changed_paths")
    return len(paths) if isinstance(paths, list) else 0


def step_attributes(result: StepResult) -> dict[str, AttributeValue]:
    """The attributes of a step's span (``softprobe.*`` names).

    Args:
        result: the step as recorded, after scoring (its reward components, if a session scored it).

    Returns:
        Tool name, index, error type, exit code, durations, changed-path count, observation size,
        terminated/truncated, and each reward component as ``softprobe.reward.<kind>.<name>``.
    """
    action = result.action
    attrs: dict[str, AttributeValue] = {
        "softprobe.step.index": result.index,
        "softprobe.tool.name": action.name if isinstance(action, ToolAction) else "terminate",
        "softprobe.step.duration_ms": result.duration_ms,
        "softprobe.step.changed_paths": changed_path_count(result.diagnostics),
        "softprobe.step.observation_bytes": observation_bytes(result.observation),
        "softprobe.step.terminated": result.terminated,
        "softprobe.step.truncated": result.truncated,
    }
    if result.error is not None:
        attrs["softprobe.step.error_type"] = result.error.type
    for key in ("exit_code", "tool_ms", "command_ms", "output_bytes"):
        value = result.diagnostics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[f"softprobe.step.{key}"] = value
    if result.reward is not None:
        attrs["softprobe.reward"] = result.reward
    for component in result.reward_components:
        attrs[f"softprobe.reward.{component.kind}.{component.name}"] = component.value
    return attrs


__all__ = ["AttributeValue", "changed_path_count", "observation_bytes", "step_attributes"]
