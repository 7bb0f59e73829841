"""The in-container agent shim and the host's side of its protocol.

``agent_shim.py`` is the program (stdlib only) that runs inside every sandbox; ``protocol.py``
holds the wire models and ``client.py`` the provider-independent client that speaks it over any
line channel a provider opens.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The shim program on disk (shipped inside the package).
SHIM_PROGRAM = Path(__file__).resolve().parent / "agent_shim.py"
_SOURCE = SHIM_PROGRAM.read_bytes()
#: The sha256 a sandbox's shim must report in its hello: the library's own program.
SHIM_SHA256 = hashlib.sha256(_SOURCE).hexdigest()


def shim_source() -> bytes:
    """The shim program this version of the library speaks to."""
    return _SOURCE


__all__ = ["SHIM_PROGRAM", "SHIM_SHA256", "shim_source"]
