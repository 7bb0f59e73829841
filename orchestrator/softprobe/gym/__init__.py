"""softprobe-gym: run AI-agent episodes in isolated Docker containers.

The Python counterpart of ``@softprobe/gym``. Start with :func:`create_host_environment`.
"""

from .actions import TerminateAction, ToolAction, parse_action
from .errors import (
    CapabilityError,
    ConfigurationError,
    DockerUnavailableError,
    EpisodeBrokenError,
    EpisodeExistsError,
    EpisodeNotFoundError,
    ForkRequestError,
    ForkVerificationError,
    GymError,
    ImageBuildError,
    ImageNotFoundError,
    InvalidActionError,
    LeakageError,
    LifecycleError,
    OnStepHookError,
    ReplayDivergenceError,
    SandboxError,
    SandboxLostError,
    SandboxStartError,
    UnsafeArchiveError,
    UnsupportedForkError,
)
from .conformance import CheckOutcome, HostCheckReport, check_host
from .fork import ForkLineage, ForkResult
from .hooks import StepContext
from .host import DEFAULT_IMAGE, HostEnvironment, create_host_environment
from .results import (
    CheckpointRecord,
    EpisodeHandle,
    EpisodeState,
    FinalizeResult,
    ResetResult,
    RewardComponent,
    StepError,
    StepResult,
    ToolInfo,
)
from .settings import Capabilities, ContainerSettings

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_IMAGE",
    "CapabilityError",
    "Capabilities",
    "CheckOutcome",
    "CheckpointRecord",
    "ConfigurationError",
    "ContainerSettings",
    "DockerUnavailableError",
    "EpisodeBrokenError",
    "EpisodeExistsError",
    "EpisodeHandle",
    "EpisodeNotFoundError",
    "EpisodeState",
    "FinalizeResult",
    "ForkLineage",
    "ForkRequestError",
    "ForkResult",
    "ForkVerificationError",
    "GymError",
    "HostCheckReport",
    "HostEnvironment",
    "ImageBuildError",
    "ImageNotFoundError",
    "InvalidActionError",
    "LeakageError",
    "LifecycleError",
    "OnStepHookError",
    "ReplayDivergenceError",
    "ResetResult",
    "RewardComponent",
    "SandboxError",
    "SandboxLostError",
    "SandboxStartError",
    "StepContext",
    "StepError",
    "StepResult",
    "TerminateAction",
    "ToolAction",
    "ToolInfo",
    "UnsafeArchiveError",
    "UnsupportedForkError",
    "check_host",
    "create_host_environment",
    "parse_action",
]
