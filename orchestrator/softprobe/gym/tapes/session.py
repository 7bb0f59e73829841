"""One episode attempt's tape: records, replays or just observes its dependency calls, and
keeps the ledger its closure report is made from.

Phase 1 tapes ``TOOL_CALL`` only: a call of an image- or overlay-declared tool is one entry.
Replay matching rule: the next unconsumed entry (lowest sequence) of the same category and
operation whose canonical request digest equals the call's; on a match it is consumed and its
response returned, and the tool is not run; on none the call fails closed with
:class:`~softprobe.gym.errors.ReplayMissError` (never a fallback to the live tool).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from softprobe.gym.errors import ReplayMissError, TapeError
from softprobe.gym.results import StepError
from softprobe.gym.shim.protocol import CallResult
from softprobe.gym.tapes.canonical import canonical_json, sha256_digest
from softprobe.gym.tapes.model import (
    ClosureDependency,
    ClosureReport,
    DependencyProvider,
    TapeEntry,
    TapeMode,
    TapeRequest,
    TapeResponse,
    run_level_of,
)
from softprobe.gym.tapes.store import TapeFolder

#: What a dependency of a replayable category can offer.
TAPE_REPLAY = "tape_replay"


@dataclass(frozen=True)
class TapedCall:
    """An entry this attempt recorded, replayed or inherited, the step it belongs to, and the
    folder holding its payloads."""

    step: int
    entry: TapeEntry
    source: TapeFolder


class TapeSession:
    """The tape of one episode attempt (one reset, or one fork's child).

    Args:
        mode: ``off`` (observe only), ``record`` or ``replay``.
        folder: where to record, or the tape to replay (None with ``off``).
        network_mode: the world's network policy mode (what built-in commands could reach).
        prefix: a fork's inherited entries: copied into the recorded tape at once, and served
            (replayed) to the steps up to ``prefix_steps`` instead of running the tools.
        prefix_steps: the branch step of a fork (0: none).

    Raises:
        TapeError: the tape to replay cannot be read, or the record folder cannot be written.
    """

    def __init__(
        self,
        mode: TapeMode,
        folder: TapeFolder | None,
        *,
        network_mode: str = "none",
        prefix: list[TapedCall] | None = None,
        prefix_steps: int = 0,
    ) -> None:
        self.mode = mode
        self.folder = folder
        self.network_mode = network_mode
        self.prefix_steps = prefix_steps
        self.log: list[TapedCall] = []  # this attempt's entries, in order
        self._dependencies: list[ClosureDependency] = [
            ClosureDependency(category="FILESYSTEM", operation="workspace", provider="seeded", call_site="reset")
        ]
        self._live_process_site: str | None = None  # the first step a process ran for real
        self._queue: list[TapedCall] = []  # what replay may serve, in sequence order
        self._consumed: set[int] = set()
        if mode == "replay":
            if folder is None:
                raise TapeError("replay needs a tape folder")
            self._queue = [TapedCall(0, entry, folder) for entry in folder.entries()]
        elif mode == "record":
            if folder is None:
                raise TapeError("record needs a tape folder")
            folder.start()
            for inherited in prefix or []:
                self.log.append(self._append(inherited.step, inherited.entry, inherited.source))
            self._queue = list(self.log)

    @property
    def cursor(self) -> int:
        """The sequence the next entry of this attempt gets (= entries so far)."""
        return len(self.log)

    def prefix_until(self, step: int) -> list[TapedCall]:
        """This attempt's entries of steps ``1..step`` (what a fork branching there inherits)."""
        return [call for call in self.log if call.step <= step]

    async def tool_call(
        self,
        *,
        tool: str,
        args: dict[str, Any],
        step: int,
        causal_parent: str,
        workspace_digest: str,
        run: Callable[[], Awaitable[CallResult]],
    ) -> CallResult:
        """A declared tool's call through the tape: replayed (``run`` never called), or run
        and recorded (``record``), or just run (``off``). A replay miss is returned as a step
        error of type ``replay_miss``, the tool not run."""
        request = canonical_json({"tool": tool, "args": args})
        digest = sha256_digest(request)
        call_site = f"step:{step}"
        if self.mode == "replay" or step <= self.prefix_steps:
            try:
                served = self._match("TOOL_CALL", tool, digest, call_site, request)
            except ReplayMissError as miss:
                self._depend("TOOL_CALL", tool, "unsupported", call_site, digest, capabilities=[])
                return CallResult(
                    error=StepError(type="replay_miss", message=str(miss)),
                    diagnostics={"workspace_digest": workspace_digest, "changed_paths": [], "replayed": False,
                                 "replay_miss": miss.diagnostic()},
                )
            self._depend("TOOL_CALL", tool, "recorded", call_site, digest)
            if self.mode == "replay":  # (a fork's prefix entries are on the child's tape already)
                self.log.append(TapedCall(step, served.entry, served.source))
            observation, error = _response_of(served)
            return CallResult(
                observation=observation, error=error,
                diagnostics={"workspace_digest": workspace_digest, "changed_paths": [], "replayed": True,
                             "tape_sequence": served.entry.sequence},
            )
        call = await run()
        self._live_process_site = self._live_process_site or call_site
        if self.mode != "record":
            self._depend("TOOL_CALL", tool, "live", call_site, digest, capabilities=[])
            return call
        assert self.folder is not None
        entry = self._record(tool, request, digest, call_site, causal_parent, call)
        self.log.append(TapedCall(step, entry, self.folder))
        self._depend("TOOL_CALL", tool, "live", call_site, digest)
        call.diagnostics["tape_sequence"] = entry.sequence
        return call

    def observe_builtin(self, tool: str, args: dict[str, Any], step: int) -> None:
        """Note a built-in tool's call (run live): ``shell.exec`` is a live CHILD_PROCESS; the
        ``fs.*`` tools act on the seeded workspace (the FILESYSTEM dependency already listed)."""
        if tool == "shell.exec":
            call_site = f"step:{step}"
            digest = sha256_digest(canonical_json({"tool": tool, "args": args}))
            self._depend("CHILD_PROCESS", tool, "live", call_site, digest, capabilities=[])
            self._live_process_site = self._live_process_site or call_site

    def closure_report(self) -> ClosureReport:
        """Every dependency observed so far. When a process ran for real (a live tool, a
        command), its clock and randomness were live too, and with a network it may have made
        calls we cannot see: those are listed as ``live`` and ``unsupported``."""
        dependencies = list(self._dependencies)
        site = self._live_process_site
        if site is not None:
            for category, operation in (("CLOCK", "time"), ("RANDOM", "random")):
                dependencies.append(ClosureDependency(
                    category=category, operation=operation, provider="live", call_site=site  # type: ignore[arg-type]
                ))
            if self.network_mode != "none":
                dependencies.append(ClosureDependency(
                    category="HTTP_CLIENT", operation=f"network:{self.network_mode}", provider="unsupported",
                    call_site=site,
                ))
        return ClosureReport(run_level=run_level_of(dependencies), dependencies=dependencies)

    # -- internals --------------------------------------------------------------------------------

    def _depend(
        self, category: Any, operation: str, provider: DependencyProvider, call_site: str, digest: str | None,
        *, capabilities: list[str] | None = None,
    ) -> None:
        self._dependencies.append(ClosureDependency(
            category=category, operation=operation, provider=provider, call_site=call_site,
            canonical_request_digest=digest,
            available_capabilities=[TAPE_REPLAY] if capabilities is None else capabilities,
        ))

    def _match(self, category: str, operation: str, digest: str, call_site: str, request: bytes) -> TapedCall:
        for candidate in self._queue:
            entry = candidate.entry
            if (entry.sequence not in self._consumed and entry.category == category
                    and entry.operation == operation and entry.request.canonical_digest == digest):
                self._consumed.add(entry.sequence)
                return candidate
        raise ReplayMissError(
            f"replay miss: the tape has no unconsumed {category} entry for {operation} with request "
            f"{digest} (at {call_site}); nothing was run. Record a tape that makes this call, or "
            "run with tape_mode='record' or 'off'.",
            category=category, operation=operation, call_site=call_site,
            canonical_request_digest=digest, canonical_request=request.decode("utf-8"),
        )

    def _record(
        self, tool: str, request: bytes, digest: str, call_site: str, causal_parent: str, call: CallResult
    ) -> TapeEntry:
        assert self.folder is not None
        if call.error is not None:
            outcome, runtime_type = "error", "application/json"
            # What the agent saw with the error (its output, if any) comes back with it.
            body = canonical_json({"type": call.error.type, "message": call.error.message,
                                   "observation": call.observation})
        elif call.observation is None:
            outcome, runtime_type, body = "null", "application/json", b"null"
        elif isinstance(call.observation, str):
            outcome, runtime_type, body = "value", "text/plain; charset=utf-8", call.observation.encode("utf-8")
        else:
            # Not sorted: the observation comes back with its keys in the order they had.
            outcome, runtime_type = "value", "application/json"
            body = json.dumps(call.observation, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        entry = TapeEntry(
            sequence=self.cursor, category="TOOL_CALL", operation=tool, call_site=call_site,
            causal_parent=causal_parent,
            request=TapeRequest(canonical_digest=digest, payload_ref=self.folder.put_payload(request)),
            response=TapeResponse(payload_ref=self.folder.put_payload(body), runtime_type=runtime_type,
                                  outcome=outcome),  # type: ignore[arg-type]
        )
        self.folder.append(entry)
        return entry

    def _append(self, step: int, entry: TapeEntry, source: TapeFolder) -> TapedCall:
        """Copy an inherited entry (and its payloads) into this attempt's tape."""
        assert self.folder is not None
        for ref in (entry.request.payload_ref, entry.response.payload_ref):
            self.folder.put_payload(source.get_payload(ref))
        copied = entry.model_copy(update={"sequence": self.cursor})
        self.folder.append(copied)
        return TapedCall(step, copied, self.folder)


def _response_of(served: TapedCall) -> tuple[Any, StepError | None]:
    """The observation and error a recorded response stands for."""
    response = served.entry.response
    body = served.source.get_payload(response.payload_ref)
    if response.outcome == "error":
        error = json.loads(body)
        return error.get("observation"), StepError(type=error["type"], message=error["message"])
    if response.outcome == "null":
        return None, None
    if response.runtime_type.startswith("text/plain"):
        return body.decode("utf-8"), None
    return json.loads(body), None


__all__ = ["TAPE_REPLAY", "TapeSession", "TapedCall"]
