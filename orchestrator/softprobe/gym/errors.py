"""The exceptions softprobe-gym raises: one small hierarchy under :class:`GymError`.

Exceptions are for the *caller's* mistakes and for infrastructure failures. What an agent gets
wrong inside its container (an unknown tool, a bad path, a timeout, a failing command) is never an
exception: ``step`` returns a ``StepResult`` whose ``error`` says what happened.
"""

from __future__ import annotations

import errno as _errno

#: The OS errors that mean "no room left" (a full disk, a used-up quota), not a bad file.
DISK_FULL_ERRNOS = (_errno.ENOSPC, _errno.EDQUOT)


class GymError(Exception):
    """Base class of every error softprobe-gym raises on purpose."""


class ConfigurationError(GymError, ValueError):
    """An argument to ``create_host_environment`` (or another constructor) is invalid."""


class BundleError(ConfigurationError):
    """An environment bundle is invalid, or cannot be resolved (an image it names is missing).

    The message lists every problem found, each as ``FILE:LINE:COL: field: what`` where the
    problem has a place in a file.

    Attributes:
        problems: the problems, one line each.
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems) if problems is not None else [message]
        super().__init__(message if problems is None else message + ":\n" + "\n".join(self.problems))


class InvalidActionError(GymError, ValueError):
    """What was passed as an action is not an action; nothing ran and the episode is unchanged."""


class EpisodeNotFoundError(GymError, KeyError):
    """No episode with this id exists on this host."""

    def __init__(self, episode_id: str) -> None:
        super().__init__(episode_id)
        self.episode_id = episode_id

    def __str__(self) -> str:
        return f"no episode {self.episode_id!r} on this host; create it with create_episode()"


class EpisodeExistsError(GymError, ValueError):
    """``create_episode`` was given an id that this host already uses, or whose folder under
    ``run_root`` already holds another episode's records (a second host on the same run root):
    nothing of them is touched. Pick another id or ``run_root``."""


class LifecycleError(GymError):
    """A call came out of lifecycle order (for example ``step`` before ``reset``).

    Attributes:
        episode_id: the episode concerned.
        state: the state it was in.
        operation: the call that was refused.
    """

    def __init__(self, episode_id: str, state: str, operation: str, hint: str) -> None:
        super().__init__(f"cannot {operation} episode {episode_id!r} in state {state!r}: {hint}")
        self.episode_id = episode_id
        self.state = state
        self.operation = operation


class EpisodeBrokenError(GymError):
    """The episode's container or shim died or stopped answering; ``reset`` or ``destroy`` it
    (``finalize`` records what the host knows: the trajectory and this reason, no workspace)."""

    def __init__(self, episode_id: str, reason: str) -> None:
        super().__init__(
            f"episode {episode_id!r} is broken: {reason}. Call reset() to start it again "
            "from the seed, or destroy() it."
        )
        self.episode_id = episode_id
        self.reason = reason


class OnStepHookError(GymError):
    """The host's ``on_step`` hook raised. The step itself ran and is recorded in ``step_result``."""

    def __init__(self, message: str, step_result: object) -> None:
        super().__init__(message)
        self.step_result = step_result


class RunRootWriteError(GymError):
    """A file the host writes under ``run_root`` (an episode's records, its final workspace)
    could not be written: the disk is full, or the folder cannot be written.

    Nothing half-written is left where a reader would take it for whole: ``episode.json``,
    ``result.json`` and checkpoint records are replaced atomically or left as they were, a
    ``trajectory.jsonl`` line is written whole or not at all, and a workspace copy that could
    not be finished is removed. The message says what the call left and what to do (free space,
    then repeat the call).

    Attributes:
        path: the file that could not be written.
        errno: the OS error number (``errno.ENOSPC`` for a full disk), or None.
        step_result: for ``step``, the step that ran but could not be recorded (the episode is
            then broken, so its trajectory has no gap), else None.
    """

    def __init__(self, message: str, *, path: object, errno: int | None, cause: str = "", remedy: str = "",
                 step_result: object = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno
        self.cause = cause  # "the disk of run_root is full (No space left on device)"
        self.remedy = remedy  # "Free space there (or use a run_root on a disk with room)"
        self.step_result = step_result

    @classmethod
    def from_os_error(cls, err: OSError, path: object, left: str, then: str = "repeat the call") -> RunRootWriteError:
        """The error for ``err`` while writing ``path``: ``left`` says what the failed write
        left, ``then`` what to do once there is room."""
        if err.errno in DISK_FULL_ERRNOS:
            cause = f"the disk of run_root is full ({err.strerror})"
            remedy = "Free space there (or use a run_root on a disk with room)"
        else:
            cause = f"it cannot be written ({err.strerror or err})"
            remedy = "Make run_root writable"
        return cls(f"{path} could not be written: {cause}; {left}. {remedy}, then {then}.",
                   path=path, errno=err.errno, cause=cause, remedy=remedy)

    def again(self, message: str, *, step_result: object = None) -> RunRootWriteError:
        """This error with the caller's ``message`` (what the call left, what to do)."""
        return RunRootWriteError(message, path=self.path, errno=self.errno, cause=self.cause, remedy=self.remedy,
                                 step_result=step_result)


class SubjectStateError(GymError):
    """The subject adapter's ``export_state`` (during ``checkpoint``) or ``import_state`` (during a
    ``checkpoint_import`` fork) raised. Nothing was kept: no checkpoint image, no child episode.
    The original exception is the ``__cause__``."""


class SandboxError(GymError):
    """The sandbox backend (Docker) failed to do something the host asked of it."""


class LiveCheckpointError(SandboxError):
    """A live checkpoint was refused by the runtime (say, a TCP connection it cannot save);
    nothing was kept and the episode goes on from where it was. The message says why."""


class DockerUnavailableError(SandboxError):
    """No Docker engine answers."""


class ImageNotFoundError(SandboxError):
    """The seed image does not exist on the engine."""


class ImageBuildError(SandboxError):
    """Building one of the project's images failed; the message carries the build's output."""


class SandboxStartError(SandboxError):
    """A container started but its shim did not come up; the message carries the shim's stderr."""


class SandboxLostError(SandboxError):
    """The container or its shim died, or the shim stopped answering, in the middle of a call.

    ``stream_ended``: the shim's output stream ended (it exited, or its container died), as
    opposed to a shim that stopped answering; the provider asks the engine why only then.
    """

    def __init__(self, message: str, *, stream_ended: bool = False) -> None:
        super().__init__(message)
        self.stream_ended = stream_ended


class ShimReplyError(SandboxError):
    """A reply from the shim could not be read (not strict JSON, or not the protocol's shape).

    Only that request failed: the container and the connection are kept, the episode is not
    marked broken, and the next call may work. A tool the request ran may have had effects.
    """


class UnsafeArchiveError(SandboxError):
    """An archive copied out of a container held a member that would land outside its destination."""


class CheckpointTooLargeError(GymError):
    """The container's filesystem changes exceed ``checkpoint_budget_bytes``, or the workspace's
    files hold more zeros in whole 4 KiB blocks (sparse files' holes, fallocated space) than 1/32
    of it (a container checkpoint adds the holes of the files the container changed outside the
    workspace, and refuses when it cannot measure them all); nothing was committed and the
    episode goes on. Delete large (or sparse) files first, or raise the budget.

    Attributes:
        size_bytes: the size of the changes (apparent size, as Docker counts it; for a
            workspace checkpoint, the host disk its new blobs and manifest would use), or the
            zeros in whole blocks when those were over, or None when it is not known (the
            sandbox stopped counting at the budget).
        budget_bytes: the budget.
    """

    def __init__(self, message: str, *, size_bytes: int | None, budget_bytes: int) -> None:
        super().__init__(message)
        self.size_bytes = size_bytes
        self.budget_bytes = budget_bytes


class WorkspaceCheckpointError(SandboxError):
    """A workspace checkpoint (``checkpoint_scope="workspace"``) could not be taken: the
    workspace holds what an archive of files, folders and links cannot carry faithfully (a
    FIFO, socket or device, a file with several hard links, a name that is not UTF-8, an
    unreadable file). Nothing was stored; the episode goes on."""


class ForkManyError(GymError):
    """Some children of a ``fork_many`` could not be created. Every child that was created has
    been destroyed again (their ids are free); nothing of the group stays.

    Attributes:
        failures: child index (0-based) -> the error that child's fork raised.
        cancelled: how many children were created and then destroyed because of the failures.
    """

    def __init__(self, message: str, *, failures: dict[int, BaseException], cancelled: int) -> None:
        super().__init__(message)
        self.failures = failures
        self.cancelled = cancelled


class CapabilityError(GymError):
    """An operation needs a capability the host did not declare."""


class LiveCheckpointUnavailableError(CapabilityError):
    """The host declares ``live_checkpoint``, but where its episodes run a live checkpoint
    cannot work (runc, an engine without experimental mode, Docker Desktop, a remote engine);
    raised when the host is created, before any work. The message says what to change."""


class UnsupportedForkError(CapabilityError):
    """A fork was asked for on a path that is not legal here (see ``HostEnvironment.fork``)."""


class ForkRequestError(UnsupportedForkError):
    """A fork on a legal path was asked for with arguments that cannot work (an unknown
    checkpoint, a prefix longer than the parent's trajectory, a missing argument)."""


class ForkVerificationError(GymError):
    """A forked child's world did not match its parent's at the branch point; the child was
    destroyed."""


class ReplayDivergenceError(ForkVerificationError):
    """Re-executing the parent's prefix gave a different world (or, in strict mode, a different
    observation) at ``step``. The child was destroyed.

    Attributes:
        step: the 1-based step that diverged (0: the freshly reset world already differed).
        expected_digest: the parent's ``workspace_digest`` after that step.
        actual_digest: the child's.
    """

    def __init__(self, message: str, *, step: int, expected_digest: str, actual_digest: str) -> None:
        super().__init__(message)
        self.step = step
        self.expected_digest = expected_digest
        self.actual_digest = actual_digest


class TapeError(GymError):
    """A dependency tape folder is missing, malformed or inconsistent (a corrupt line before the
    last, a payload whose bytes do not match its digest)."""


class ReplayMissError(TapeError):
    """Replay found no recorded entry for a dependency call: the call was not run (replay fails
    closed, never falling back to the live dependency). A step reports it as error type
    ``replay_miss`` with :meth:`diagnostic` in its diagnostics; a host made with
    ``replay_strict=True`` raises it from ``step`` instead.

    Attributes:
        category: the dependency class, e.g. ``TOOL_CALL``.
        operation: e.g. the tool's name ``billing.refund``.
        call_site: where the call was made, e.g. ``step:3``.
        canonical_request_digest: ``sha256:`` of the canonical request.
        canonical_request: the canonical request itself (JSON text).
        step_result: with strict replay, the step that missed (recorded all the same); else None.
    """

    def __init__(
        self, message: str, *, category: str, operation: str, call_site: str,
        canonical_request_digest: str, canonical_request: str, step_result: object = None,
    ) -> None:
        super().__init__(message)
        self.step_result = step_result
        self.category = category
        self.operation = operation
        self.call_site = call_site
        self.canonical_request_digest = canonical_request_digest
        self.canonical_request = canonical_request

    def diagnostic(self) -> dict[str, str]:
        """The miss as a JSON-ready dict (what a step's ``diagnostics["replay_miss"]`` holds)."""
        return {
            "category": self.category, "operation": self.operation, "call_site": self.call_site,
            "canonical_request_digest": self.canonical_request_digest,
            "canonical_request": self.canonical_request,
        }


class RewardError(GymError):
    """``reward_from`` raised, returned malformed facts, or its checks changed between steps.

    The step itself ran and is recorded (``step_result``); the rollout stops.
    """

    def __init__(self, message: str, step_result: object = None) -> None:
        super().__init__(message)
        self.step_result = step_result


class SplitError(GymError, ValueError):
    """``partition_train_eval`` got ids or a ratio it cannot split."""


class LeakageError(GymError):
    """An id (or task content) appears in both the train and the eval split."""


__all__ = [
    "BundleError",
    "CapabilityError",
    "CheckpointTooLargeError",
    "LiveCheckpointError",
    "LiveCheckpointUnavailableError",
    "ConfigurationError",
    "DockerUnavailableError",
    "EpisodeBrokenError",
    "EpisodeExistsError",
    "EpisodeNotFoundError",
    "ForkManyError",
    "ForkRequestError",
    "ForkVerificationError",
    "GymError",
    "ImageBuildError",
    "ImageNotFoundError",
    "InvalidActionError",
    "LeakageError",
    "LifecycleError",
    "OnStepHookError",
    "ReplayDivergenceError",
    "ReplayMissError",
    "RewardError",
    "RunRootWriteError",
    "SandboxError",
    "SandboxLostError",
    "SandboxStartError",
    "ShimReplyError",
    "SplitError",
    "SubjectStateError",
    "TapeError",
    "UnsafeArchiveError",
    "UnsupportedForkError",
    "WorkspaceCheckpointError",
]
