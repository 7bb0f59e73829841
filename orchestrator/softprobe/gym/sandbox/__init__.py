"""Where episode containers run (backends) and how the host talks to the shim inside them."""

from .base import Sandbox, SandboxBackend, SandboxSpec, SweepReport

__all__ = ["Sandbox", "SandboxBackend", "SandboxSpec", "SweepReport"]
