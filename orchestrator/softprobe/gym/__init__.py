"""softprobe-gym: run AI-agent episodes in isolated Docker containers.

The Python counterpart of ``@softprobe/gym``. Start with :func:`create_host_environment`.
``ARCHITECTURE.md`` in the repository shows how the packages fit together.
"""

from softprobe.gym.actions import TerminateAction, ToolAction, parse_action
from softprobe.gym.bundles import Bundle, load_bundle
from softprobe.gym.episodes.check import CheckOutcome, HostCheckReport, check_host
from softprobe.gym.episodes.config import HostConfig
from softprobe.gym.episodes.factory import DEFAULT_IMAGE, create_host_environment, open_host
from softprobe.gym.episodes.forking import ForkLineage, ForkResult
from softprobe.gym.episodes.hooks import StepContext
from softprobe.gym.episodes.host import HostEnvironment
from softprobe.gym.episodes.protocol import Host
from softprobe.gym.episodes.toolspecs import ToolSchema, tool_name_for_function
from softprobe.gym.errors import (
    BundleError,
    CapabilityError,
    CheckpointTooLargeError,
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
    ReplayMissError,
    RewardError,
    SandboxError,
    SandboxLostError,
    SandboxStartError,
    ShimReplyError,
    SplitError,
    SubjectStateError,
    TapeError,
    UnsafeArchiveError,
    UnsupportedForkError,
)
from softprobe.gym.providers.base import Provider
from softprobe.gym.results import (
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
from softprobe.gym.settings import Capabilities, ContainerSettings
from softprobe.gym.training.export import PromptfooInput, TrajectoryStep
from softprobe.gym.training.rewards import Check, Facts, RewardContext, RewardTracker, map_reward_components
from softprobe.gym.training.session import (
    PolicyStep,
    ResetEvent,
    Rollout,
    RolloutResult,
    StepEvent,
    TerminatedEvent,
    TrainingSession,
    create_training_session,
    rollout_to_promptfoo_input,
)
from softprobe.gym.training.splits import TrainEvalSplit, assert_no_leakage, partition_train_eval
from softprobe.gym.worlds import HealthCheck, NetworkPolicy, ServiceSpec, ToolDefinition, ToolOverlay, World

__version__ = "0.1.0"

__all__ = [
    "assert_no_leakage",
    "Bundle",
    "BundleError",
    "Capabilities",
    "CapabilityError",
    "Check",
    "check_host",
    "CheckOutcome",
    "CheckpointRecord",
    "CheckpointTooLargeError",
    "ConfigurationError",
    "ContainerSettings",
    "create_host_environment",
    "create_training_session",
    "DEFAULT_IMAGE",
    "DockerUnavailableError",
    "EgressReport",
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
    "HealthCheck",
    "Host",
    "HostCheckReport",
    "HostConfig",
    "HostEnvironment",
    "ImageBuildError",
    "ImageNotFoundError",
    "InvalidActionError",
    "LeakageError",
    "LifecycleError",
    "load_bundle",
    "map_reward_components",
    "NetworkPolicy",
    "OnStepHookError",
    "open_host",
    "parse_action",
    "partition_train_eval",
    "PolicyStep",
    "PromptfooInput",
    "Provider",
    "ReplayDivergenceError",
    "ReplayMissError",
    "ResetEvent",
    "ResetResult",
    "RewardComponent",
    "RewardContext",
    "RewardError",
    "RewardTracker",
    "Rollout",
    "rollout_to_promptfoo_input",
    "RolloutResult",
    "SandboxError",
    "SandboxLostError",
    "SandboxStartError",
    "ServiceSpec",
    "ShimReplyError",
    "SplitError",
    "StepContext",
    "StepError",
    "StepEvent",
    "StepResult",
    "SubjectStateError",
    "TapeError",
    "TerminateAction",
    "TerminatedEvent",
    "tool_name_for_function",
    "ToolAction",
    "ToolDefinition",
    "ToolInfo",
    "ToolOverlay",
    "ToolSchema",
    "TrainEvalSplit",
    "TrainingSession",
    "TrajectoryStep",
    "UnsafeArchiveError",
    "UnsupportedForkError",
    "World",
]
