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
    RewardError,
    SandboxError,
    SandboxLostError,
    SandboxStartError,
    ShimReplyError,
    SplitError,
    UnsafeArchiveError,
    UnsupportedForkError,
)
from .conformance import CheckOutcome, HostCheckReport, check_host
from .fork import ForkLineage, ForkResult
from .export import PromptfooInput, TrajectoryStep
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
from .rewards import Check, Facts, RewardContext, RewardTracker, map_reward_components
from .session import (
    ResetEvent,
    RolloutResult,
    StepEvent,
    TerminatedEvent,
    TrainingSession,
    create_training_session,
    rollout_to_promptfoo_input,
)
from .settings import Capabilities, ContainerSettings
from .splits import TrainEvalSplit, assert_no_leakage, partition_train_eval

__version__ = "0.1.0"

__all__ = [
    "Capabilities",
    "CapabilityError",
    "Check",
    "CheckOutcome",
    "CheckpointRecord",
    "ConfigurationError",
    "ContainerSettings",
    "DEFAULT_IMAGE",
    "DockerUnavailableError",
    "EpisodeBrokenError",
    "EpisodeExistsError",
    "EpisodeHandle",
    "EpisodeNotFoundError",
    "EpisodeState",
    "Facts",
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
    "PromptfooInput",
    "ReplayDivergenceError",
    "ResetEvent",
    "ResetResult",
    "RewardComponent",
    "RewardContext",
    "RewardError",
    "RewardTracker",
    "RolloutResult",
    "SandboxError",
    "SandboxLostError",
    "SandboxStartError",
    "ShimReplyError",
    "SplitError",
    "StepContext",
    "StepError",
    "StepEvent",
    "StepResult",
    "TerminateAction",
    "TerminatedEvent",
    "ToolAction",
    "ToolInfo",
    "TrainEvalSplit",
    "TrainingSession",
    "TrajectoryStep",
    "UnsafeArchiveError",
    "UnsupportedForkError",
    "assert_no_leakage",
    "check_host",
    "create_host_environment",
    "create_training_session",
    "map_reward_components",
    "parse_action",
    "partition_train_eval",
    "rollout_to_promptfoo_input",
]
