"""The shim's wire protocol as models: one JSON object per line, each way, matched by ``id``.

The in-container side is the package ``shim/agent_shim`` (stdlib only, so it cannot import these); the
``hello`` handshake checks that both sides speak :data:`PROTOCOL_VERSION`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from softprobe.gym.results import SpawnError, StepError, ToolInfo

#: 2: bulk content as raw bytes after the request line. 3: one ``exec`` for any user of the
#: sandbox (``run_as`` is gone), ``put_files``, ``verify`` with ``argv``.
PROTOCOL_VERSION = 3


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HelloRequest(_Request):
    op: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION


class CallRequest(_Request):
    """Run one tool; ``timeout_s`` bounds any process it starts, ``output_cap`` its output.
    ``traceparent`` (W3C, optional) goes into the ``TRACEPARENT`` variable of every process the
    call starts (``shell.exec``, declared tools), so instrumented tools join the step's trace."""

    op: Literal["call"] = "call"
    tool: str
    args: dict[str, Any]
    timeout_s: float
    output_cap: int
    traceparent: str | None = Field(default=None, pattern=r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


class ExistsRequest(_Request):
    op: Literal["exists"] = "exists"
    path: str


class ReadTextRequest(_Request):
    op: Literal["read_text"] = "read_text"
    path: str
    max_bytes: int


#: The most raw content one request may carry: the shim's own limit (``agent_shim.framing.MAX_RAW_BYTES``).
MAX_RAW_BYTES = 1 << 30


class SeedRequest(_Request):
    """Extract a tar (names relative to the workspace), sent as the request's raw content,
    into the workspace."""

    op: Literal["seed"] = "seed"


class OverlayRequest(_Request):
    """Add tools without an image build, once, right after the handshake: ``tools`` maps each
    name to its manifest entry (as in ``tools.json``); ``archive`` is a base64 tar of the files
    (names relative to the overlay folder) or ``""``. The shim answers with its new hello."""

    op: Literal["overlay"] = "overlay"
    tools: dict[str, dict[str, Any]]
    archive: str = ""
    #: MCP servers run inside the sandbox (``{name, command, env, startup_timeout_s}``); their
    #: tools join the declared ones as ``<server>.<tool>``.
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)


class EpisodeEnvRequest(_Request):
    """Fix the episode's clock and random seed for every process the shim starts, once, before
    any call: ``clock_start`` (epoch seconds; needs the ``time_shim`` capability) is where each
    program's clock begins, ``random_seed`` goes into ``PYTHONHASHSEED``,
    ``SOFTPROBE_RANDOM_SEED`` and the seed file. None: leave it live. Answered with the hello."""

    op: Literal["episode_env"] = "episode_env"
    clock_start: int | None = None
    random_seed: int | None = Field(default=None, ge=0, lt=2**32)


class RescanRequest(_Request):
    """Sweep every process, then walk the whole workspace: a digest that trusts no tracker."""

    op: Literal["rescan"] = "rescan"
    #: A container checkpoint: the paths the container changed outside the workspace and its
    #: mounts (``docker diff``), whose holes the shim measures too (``outside_zeros``).
    zero_paths: list[str] | None = None


class CloseSessionsRequest(_Request):
    """Close every persistent session of the episode (``finalize``): each session's processes
    are killed. Answered with the names of the sessions closed."""

    op: Literal["close_sessions"] = "close_sessions"


class ChannelRequest(_Request):
    """Connect to the host's socket (the direct channel, see ``agent_shim/channel.py``) and send
    ``nonce`` there first. Sent over attach, before ``hello``; once per shim."""

    op: Literal["channel"] = "channel"
    nonce: str = Field(pattern=r"^[0-9a-f]{32}$")


class ChannelResult(BaseModel):
    """Whether the shim connected; ``reason`` says why not (the host then stays on attach)."""

    connected: bool
    reason: str = ""


class OutsideZeros(BaseModel):
    """The holes of files the container changed outside the workspace: what ``docker commit``
    writes out at their full length."""

    zero_bytes: int = 0  # apparent size over allocated blocks, summed
    files: list[tuple[str, int, int]] = Field(default_factory=list)  # [path, holes, size], most first (5)
    measured: int = 0  # paths looked at
    complete: bool = True  # False: too many paths, one it cannot stat, or out of time
    why: str | None = None  # why not complete


class RescanResult(BaseModel):
    workspace_digest: str
    workspace_digest_complete: bool = True
    #: Bytes of the workspace's files that read as zeros in whole 4 KiB blocks (sparse files'
    #: holes, fallocated space, zeros written out): a checkpoint writes them out in full.
    zero_bytes: int = 0
    #: The files with the most of them: ``[path, zero bytes, size]``, most first (at most 5).
    zero_files: list[tuple[str, int, int]] = Field(default_factory=list)
    #: With ``zero_paths`` asked: their holes.
    outside_zeros: OutsideZeros | None = None
    #: The names of the persistent sessions open (``session.start``); they stay stopped until
    #: the next request, so a checkpoint taken now sees the workspace as walked.
    sessions: list[str] = Field(default_factory=list)


class ExportChangesRequest(_Request):
    """The final state of every workspace path the last call changed (a dependency tape's
    change set), at most ``max_bytes`` of file data and link targets."""

    op: Literal["export_changes"] = "export_changes"
    max_bytes: int


class ExportChangesResult(BaseModel):
    """``entries`` (``{"path", "kind", "mode", "data", "target"}``), or why the change set
    cannot be carried (``unsupported``: ``over_budget``, ``hard_link``, ...; ``detail``: the path)."""

    entries: list[dict[str, Any]] | None = None
    bytes: int = 0
    unsupported: str | None = None
    detail: str | None = None
    workspace_digest: str


class ApplyChangesRequest(_Request):
    """Make the workspace hold a recorded change set (as the agent; paths checked by the shim)."""

    op: Literal["apply_changes"] = "apply_changes"
    changes: list[dict[str, Any]]


class ApplyChangesResult(BaseModel):
    """Whether the set was applied in full (``error`` says why not), and the digest after."""

    applied: bool
    workspace_digest: str
    changed_paths: list[str] = Field(default_factory=list)
    error: StepError | None = None


class WorkspaceSnapshotRequest(_Request):
    """The whole workspace as a manifest, with the content of files whose sha256 the host does
    not hold yet (``known``); at most ``max_bytes`` of new content (host-only)."""

    op: Literal["workspace_snapshot"] = "workspace_snapshot"
    known: list[str] = Field(default_factory=list)
    max_bytes: int = 1
    #: The most file content in one reply (the transfer comes in chunks; see the result).
    chunk_bytes: int = 8 << 20
    #: The next chunk of the snapshot under way (``known`` and ``max_bytes`` are then ignored).
    resume: bool = False
    #: Refuse (``zero_blocks``) a workspace whose files hold more zeros in whole blocks than
    #: this (None: any).
    max_zero_bytes: int | None = None


class WorkspaceSnapshotResult(BaseModel):
    """One chunk of a workspace snapshot. The first carries ``entries`` (``[path, kind ("dir" |
    "file" | "symlink"), mode, sha256 or link target]``, parents first) and ``sizes`` (sha256 ->
    size of each file new to the host); each carries ``pieces`` ``[sha256, offset, base64 data,
    last]`` of that content, ``bytes`` (content sent so far) and ``more`` (ask again, with
    ``resume``). ``blobs`` is empty (older shims sent whole files there)."""

    workspace_digest: str
    entries: list[tuple[str, Literal["dir", "file", "symlink"], int, str]]
    sizes: dict[str, int] = Field(default_factory=dict)
    pieces: list[tuple[str, int, str, bool]] = Field(default_factory=list)
    blobs: dict[str, str] = Field(default_factory=dict)
    bytes: int
    more: bool = False


class WorkspaceStageRequest(_Request):
    """Pieces of the blobs a workspace restore writes (host-only, before any call), each
    ``(sha256, offset, length, last)``, their data following each other in the request's raw
    content: a blob's pieces follow each other from offset 0, and ``last`` checks the whole
    against its sha256. Many small blobs go in one request."""

    op: Literal["workspace_stage"] = "workspace_stage"
    pieces: list[tuple[str, int, int, bool]]


class WorkspaceStageResult(BaseModel):
    """How many blobs this request completed (each checked), and the bytes it staged."""

    staged: int
    bytes: int


class WorkspaceRestoreRequest(_Request):
    """Empty the workspace, then write ``changes`` (an apply_changes set whose files may name a
    staged blob by ``blob``: its sha256), before any call; the staged blobs are removed after."""

    op: Literal["workspace_restore"] = "workspace_restore"
    changes: list[dict[str, Any]]


class _ProgramRequest(_Request):
    """A program the shim runs for the host (the ``exec`` and ``verify`` ops): ``argv`` is
    resolved through ``PATH`` of its environment (the agent's, with ``user``'s HOME, plus
    ``env``); ``cwd`` is absolute or relative to the workspace (None: the workspace); it and
    everything it started are killed after ``timeout_s``; ``output_cap`` bounds what is kept
    of its output. No other process of the sandbox runs meanwhile, and none it started outlives
    it.

    ``user`` is who runs it: None, the episode's agent uid (as ``shell.exec``: no capabilities,
    the workspace quota polled); a user name or uid of the sandbox; or ``"root"`` / ``0``. Only
    the host speaks to the shim, so any user is allowed: a program run as root holds the
    shim's capabilities and could end or subvert the shim, so whether it is trusted is the
    business of whoever asks the host for it (as for a world whose agent is root,
    ``user="0"``). A name the sandbox does not have is refused (``unknown_user``).
    """

    argv: list[str] = Field(min_length=1)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    timeout_s: float
    output_cap: int


class ExecRequest(_ProgramRequest):
    """Run one program for the host (Inspect's ``exec``, a Harbor environment's commands), not
    a tool call: its stdin is the request's raw content; each of stdout and stderr keeps its
    last ``output_cap`` bytes. Answered with an :class:`ExecReply`."""

    op: Literal["exec"] = "exec"


class PutFilesRequest(_Request):
    """Place files (the request's raw content: an uncompressed tar of folders and regular files,
    names relative, no links) into ``folder`` (absolute or relative to the workspace; made if
    missing), merged with what is there: each file replaces what is at its path, folders
    merge. Every entry placed is ``user``'s (as for :class:`ExecRequest`; None: the agent's),
    with the archive's permission bits. Refused, before anything is written: a member that
    leaves the folder, one that is not a folder or a regular file, and (``files_refused``) a
    path that goes through a link or a file in the sandbox (a link on the way to ``folder`` is
    followed only when root made it: the image's own). No other process runs meanwhile.
    Answered with a :class:`PutFilesResult`. What a Harbor environment's uploads use."""

    op: Literal["put_files"] = "put_files"
    folder: str = Field(min_length=1)
    user: str | int | None = None


class PutFilesResult(BaseModel):
    """How many entries ``put_files`` placed, the folder they went to, and the workspace's
    digest after (it changes when the folder is in the workspace)."""

    entries: int
    folder: str
    workspace_digest: str
    workspace_digest_complete: bool = True


class VerifyRequest(_ProgramRequest):
    """Run a world's verifier after the agent's steps (see ``agent_shim.host_programs.run_verifier``): its
    files (the request's raw content, a tar placed as ``put_files`` places one) go into
    ``files_dir`` made afresh, root's; ``logs_dir`` is made empty; ``argv`` runs as an ``exec``
    does, as ``user`` (None: the agent; a verifier usually runs as ``"root"``), with stdout and
    stderr together, the real clock and no workspace quota; the files of ``logs_dir`` named in
    ``read`` come back."""

    op: Literal["verify"] = "verify"
    files_dir: str
    logs_dir: str
    read: list[str] = Field(default_factory=list)


class VerifierFile(BaseModel):
    """The last bytes (at most 1 MiB) of a file the verifier wrote, and its size."""

    text: str
    size: int
    truncated: bool = False


class VerifyResult(BaseModel):
    """What a verifier run did: ``exit_code`` None when it timed out or could not start
    (``error`` says why), its capped output, the files asked for (None: absent or not a
    regular file), and the workspace digest after it."""

    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    output: str = ""
    duration_ms: float = 0.0
    files: dict[str, VerifierFile | None] = Field(default_factory=dict)
    workspace_digest: str
    files_dir: str = ""
    logs_dir: str = ""


class ExecReply(BaseModel):
    """An ``exec``'s outcome: ``exit_code`` as Popen reports it (``-N``: signal N; None when it
    never started, see ``spawn_error``), both streams' kept tails in base64 with their full
    lengths, ``error`` for a timeout, ``quota_exceeded`` (the agent's programs only) or
    ``out_of_memory``, and the workspace after it."""

    exit_code: int | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    error: StepError | None = None
    spawn_error: SpawnError | None = None
    command_ms: float = 0.0
    changed_paths: list[str] = Field(default_factory=list)
    workspace_digest: str
    workspace_digest_complete: bool = True


ShimRequest = (
    HelloRequest | CallRequest | ExistsRequest | ReadTextRequest | SeedRequest | OverlayRequest | RescanRequest
    | CloseSessionsRequest | ChannelRequest
    | ExportChangesRequest | ApplyChangesRequest
    | EpisodeEnvRequest | WorkspaceSnapshotRequest | WorkspaceStageRequest | WorkspaceRestoreRequest
    | ExecRequest | PutFilesRequest | VerifyRequest
)


class ShimFailure(BaseModel):
    """Why the shim could not serve a request at all (not a tool failure)."""

    type: str
    message: str


class ShimResponse(BaseModel):
    id: int | None = None
    ok: bool
    result: Any = None
    error: ShimFailure | None = None


class HelloTool(BaseModel):
    """A tool as the shim's hello lists it: declared tools (image or overlay) carry ``args``,
    their JSON Schema; built-in tools' schemas are the host's
    (:data:`softprobe.gym.episodes.toolspecs.BUILTIN_TOOL_SCHEMAS`)."""

    name: str
    builtin: bool
    description: str = ""
    args: dict[str, Any] | None = Field(default=None, description="JSON Schema of a declared tool's arguments")
    #: The MCP server (inside the sandbox) a tool ``<server>.<tool>`` comes from; None otherwise.
    mcp_server: str | None = None
    #: Whether a declared tool may read the workspace (its manifest entry or MCP server says
    #: ``reads_workspace: false`` when not): a tape then keys its calls on the workspace digest.
    reads_workspace: bool = True

    def info(self) -> ToolInfo:
        """The tool as results list it (without its schema)."""
        return ToolInfo(name=self.name, builtin=self.builtin, description=self.description)


class LinkOut(BaseModel):
    """A workspace symlink whose path resolves outside the workspace: the workspace digest
    covers it by its target text only, so what it leads to is measured apart."""

    path: str  # relative to the workspace
    target: str  # the resolved path, outside the workspace
    #: What the resolved path holds (missing, a file's mode and content, a folder's tree).
    sha256: str | None = None
    #: Why it could not be measured within the shim's bounds (then a call is never replayed).
    unkeyable: str | None = None


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
    tools: list[HelloTool]
    workspace_digest: str
    workspace_digest_complete: bool = True
    workspace_files: list[str]  # at most max_list_entries, sorted
    workspace_files_count: int = 0
    digest_mode: str = "scan"
    pid: int = 0
    hardened: bool = False
    #: MCP server -> why (some of) its tools are not offered (it failed to list them, or a
    #: tool's name is invalid or taken).
    mcp_errors: dict[str, str] = Field(default_factory=dict)
    #: What the sandbox offers beyond the tools: ``time_shim`` (libfaketime, for a recorded clock).
    capabilities: list[str] = Field(default_factory=list)
    #: The workspace's symlinks that resolve outside it, measured at this hello (see
    #: :class:`LinkOut`): what replay keys a call that reads the workspace on, besides its digest.
    links_out: list[LinkOut] = Field(default_factory=list)


class CallResult(BaseModel):
    """A tool's outcome: an observation, maybe an agent-facing error, and diagnostics."""

    observation: Any = None
    error: StepError | None = None
    diagnostics: dict[str, Any]
