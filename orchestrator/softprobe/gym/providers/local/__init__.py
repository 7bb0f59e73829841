"""The local-process provider: the shim as a subprocess of this process, in a private folder.

For development and tests: it needs no engine and starts in milliseconds, and every part above
the seam (shim protocol, host, training, evals) runs unchanged on it. It is **not** a sandbox:
tools run as this user on this machine, with this machine's network and files. Never give it
an untrusted agent.
"""

from softprobe.gym.providers.local.provider import LocalProvider

__all__ = ["LocalProvider"]
