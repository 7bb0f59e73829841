"""The shim's wire protocol as models: one JSON object per line, each way, matched by ``id``.

The in-container side is ``shim/agent_shim.py`` (stdlib only, so it cannot import these); the
``hello`` handshake checks that both sides speak :data:`PROTOCOL_VERSION`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from softprobe.gym.results import StepError, ToolInfo

PROTOCOL_VERSION = 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HelloRequest(_Request):
    op: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION


class CallRequest(_Request):
    """Run one tool; ``timeout_s`` bounds any process it starts, ``output_cap`` its output."""

    op: Literal["call"] = "call"
    tool: str
    args: dict[str, Any]
    timeout_s: float
    output_cap: int


class ExistsRequest(_Request):
    op: Literal["exists"] = "exists"
    path: str


class ReadTextRequest(_Request):
    op: Literal["read_text"] = "read_text"
    path: str
    max_bytes: int


class SeedRequest(_Request):
    """Extract a base64 tar (names relative to the workspace) into the workspace."""

    op: Literal["seed"] = "seed"
    archive: str


class RescanRequest(_Request):
    """Sweep every process, then walk the whole workspace: a digest that trusts no tracker."""

    op: Literal["rescan"] = "rescan"


class RescanResult(BaseModel):
    workspace_digest: str
    workspace_digest_complete: bool = True


ShimRequest = HelloRequest | CallRequest | ExistsRequest | ReadTextRequest | SeedRequest | RescanRequest


class ShimFailure(BaseModel):
    """Why the shim could not serve a request at all (not a tool failure)."""

    type: str
    message: str


class ShimResponse(BaseModel):
    id: int | None = None
    ok: bool
    result: Any = None
    error: ShimFailure | None = None


class HelloResult(BaseModel):
    """The shim's introduction: its version, user, tools and the initial workspace."""

    protocol: int
    shim_version: str
    python: str
    uid: int  # the agent's uid: what shell.exec runs as and file tools act as
    shim_uid: int = 0
    tool_uid: int = 0  # what image-declared tools run as
    shim_sha256: str = ""
    workspace: str
    tools: list[ToolInfo]
    workspace_digest: str
    workspace_digest_complete: bool = True
    workspace_files: list[str]  # at most max_list_entries, sorted
    workspace_files_count: int = 0
    digest_mode: str = "scan"
    pid: int = 0
    hardened: bool = False


class CallResult(BaseModel):
    """A tool's outcome: an observation, maybe an agent-facing error, and diagnostics."""

    observation: Any = None
    error: StepError | None = None
    diagnostics: dict[str, Any]
