"""The shim's entry point: its options, then one request after another until stdin ends."""

from __future__ import annotations

import json
import os
import signal
import sys

from .channel import connect, follow, guard_folder
from .common import (
    DEFAULT_MANIFEST,
    DEFAULT_MAX_CHANGED_PATHS,
    DEFAULT_MAX_LIST_ENTRIES,
    MAX_TIMEOUT_S,
    Limits,
    ProtocolError,
    ShimBroken,
    ToolError,
    _is_count,
)
from .dropper import install_dropper
from .framing import _REQUEST_DECODER, _RESPONSE_ENCODER, MAX_RAW_BYTES, _LineReader, _readable, _write_all
from .identity import Identity
from .local import _close_scratch_folders
from .server import Shim
from .sweep import _become_subreaper, harden

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .common import Ids
    from .framing import RawStream


def main(argv: list[str]) -> int:
    workspace = "/workspace"
    manifest = DEFAULT_MANIFEST
    digest_mode = "inotify"
    numbers: dict[str, int] = {}
    local_asked = False
    home = None
    overlay = None
    it = iter(argv)
    for arg in it:
        if arg == "--local":
            local_asked = True
        elif arg == "--home":
            home = next(it)
        elif arg == "--workspace":
            workspace = next(it)
        elif arg == "--manifest":
            manifest = next(it)
        elif arg == "--overlay":
            overlay = next(it)
        elif arg == "--digest":
            digest_mode = next(it)
        elif arg.startswith("--") and arg[2:].replace("-", "_") in _NUMERIC_OPTIONS:
            numbers[arg[2:].replace("-", "_")] = int(next(it))
    if local_asked and os.getpid() == 1:
        sys.stderr.write("softprobe shim: refusing --local as PID 1 of a PID namespace (a container's init)\n")
        return 2
    # Not PID 1 of its own PID namespace: not alone in a container, so touch only what it starts.
    local = local_asked or os.getpid() != 1
    if local:
        sys.stderr.write(
            "softprobe shim: local mode (pid %d, not a container's init): no process sweep, system "
            "folders and uids left alone; a command that leaves its session can outlive its step, "
            "so this is for development and tests, not untrusted agents\n" % os.getpid()
        )
    # Tools must not inherit the protocol streams.
    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    stdout: RawStream = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    hardened = harden()
    # Before any tool runs: only root may reach the host's socket (see channel.py).
    channel_problem = "local mode" if local else guard_folder()
    # A tool running as root (user="0") could otherwise interrupt the shim with SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    agent = _ids(numbers, "agent")
    identity = Identity(agent=agent, tool=_ids(numbers, "tool") or agent)
    if os.geteuid() == 0:
        if not local:  # it changes the machine's folders: in a container of its own only
            _close_scratch_folders()
            identity.dropper = install_dropper()
        if not local or identity.agent is not None:
            os.setgroups([])  # acting as the agent must not keep root's supplementary groups
    if numbers.get("max_processes") and (not local or identity.agent is not None):
        # Per real uid, so per episode (each has its own uids); the shim itself (uid 0) is exempt.
        # Under gVisor the container's pids limit counts the sandbox kernel's threads, not the
        # agent's processes: this is what stops a fork bomb there. In local mode only for an
        # agent uid of its own: the limit counts every process of the uid on the machine.
        import resource

        limit = numbers["max_processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    if local:
        _become_subreaper()
    limits = Limits(
        quota_bytes=numbers.get("quota_bytes", 0),
        quota_inodes=numbers.get("quota_inodes", 0),
        max_list=numbers.get("max_list_entries", DEFAULT_MAX_LIST_ENTRIES),
        max_changed=numbers.get("max_changed_paths", DEFAULT_MAX_CHANGED_PATHS),
        max_timeout_s=numbers.get("max_timeout_s", int(MAX_TIMEOUT_S)),
    )
    shim = Shim(workspace, manifest, digest_mode, identity, limits, local=local, home=home, overlay=overlay)
    shim.hardened = hardened
    reader = _LineReader(stdin)
    direct = None  # the host's socket, once connected, until the host's next request shows its choice
    while True:
        line = reader.readline()
        if line is None:
            shim.sessions.close_all()  # in local mode they would outlive the shim otherwise
            return 0
        request_id: Any = None
        response: dict[str, Any]
        try:
            request = _REQUEST_DECODER.decode(line.decode("utf-8", "surrogatepass"))
            if not isinstance(request, dict):
                raise ProtocolError("a request must be a JSON object")
            request_id = request.get("id")
            if request.get("op") == "channel":  # answered here: it changes the streams
                direct, reason = connect(request.get("nonce"), channel_problem)
                channel_problem = "the channel was asked for before"  # one attempt per shim
                result: Any = {"connected": True} if direct is not None else {"connected": False, "reason": reason}
            else:
                raw = b""
                if "raw" in request:
                    size = request["raw"]
                    if not _is_count(size) or size > MAX_RAW_BYTES:
                        # The stream cannot be followed past content of an unknown length.
                        raise ShimBroken("a request announced raw content of %r bytes" % (size,))
                    content = reader.read_exact(size)
                    if content is None:
                        shim.sessions.close_all()
                        return 0
                    raw = content
                result = shim.handle(request, raw)
            response = {"id": request_id, "ok": True, "result": result}
        except ShimBroken as err:
            sys.stderr.write("softprobe shim: giving up: %s\n" % err)
            return 70  # the container ends; the host reports the episode as broken
        except (ValueError, ProtocolError) as err:
            response = {"id": request_id, "ok": False, "error": {"type": "protocol_error", "message": str(err)}}
        except ToolError as err:
            response = {"id": request_id, "ok": False, "error": {"type": err.type, "message": err.message}}
        except Exception as err:  # never die on a request: report it and go on
            response = {
                "id": request_id,
                "ok": False,
                "error": {"type": "shim_error", "message": "%s: %s" % (type(err).__name__, err)},
            }
        try:
            data = _RESPONSE_ENCODER.encode(response)
        except (ValueError, RecursionError) as err:  # a non-finite number or a depth no check foresaw
            failure = {"type": "shim_error", "message": "the reply held %s" % err}
            data = json.dumps({"id": request_id, "ok": False, "error": failure})
        try:
            encoded = data.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate somewhere: send it as readable text
            encoded = json.dumps(_readable(response), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        _write_all(stdout, encoded + b"\n")
        if direct is not None:
            stream = follow(direct, stdin, bool(reader.buffer))
            if stream is not None:
                reader, stdout = _LineReader(stream), stream
            direct = None


_NUMERIC_OPTIONS = (
    "agent_uid", "agent_gid", "tool_uid", "tool_gid", "quota_bytes", "quota_inodes",
    "max_list_entries", "max_changed_paths", "max_timeout_s", "max_processes",
)


def _ids(numbers: dict[str, int], who: str) -> Ids | None:
    uid = numbers.get(who + "_uid")
    return None if uid is None else (uid, numbers.get(who + "_gid", uid))
