"""``CHILD_PROCESS`` entries: what identifies a ``shell.exec`` on a tape.

The canonical request of a taped ``shell.exec`` is ``{"tool": "shell.exec", "args": <the
action's args>, "cwd": ".", "timeout_s": <the effective time limit>, "workspace_digest": <the
workspace digest before the call>}``: ``cwd`` is relative to the workspace (commands always start
at its root, wherever the provider puts it); the environment is the container's, fixed for the
episode, so it is not part of the request. The digest makes a replay from another workspace state
miss (fail closed) rather than serve an answer the command might not have given there.
"""

from __future__ import annotations

from typing import Any

#: The operation of a taped process.
PROCESS_TOOL = "shell.exec"


def process_context(*, timeout_s: float, workspace_digest: str) -> dict[str, Any]:
    """What a ``shell.exec`` request adds to ``{"tool", "args"}`` on a tape."""
    return {"cwd": ".", "timeout_s": timeout_s, "workspace_digest": workspace_digest}


__all__ = ["PROCESS_TOOL", "process_context"]
