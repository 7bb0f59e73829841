"""The bundle store: every bundle resolved to run (``bundle build``, ``bundle run``, ``eval``,
``create_host_environment(bundle=...)``) keeps its canonical manifest here, so
``bundle inspect sha256:...`` finds any digest a result records: ``$SOFTPROBE_GYM_BUNDLE_STORE``,
default ``~/.cache/softprobe-gym/bundles/``, one ``<64 hex>.json`` per digest, and the seed and
overlay snapshots in ``trees/`` (see :mod:`.trees`)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from softprobe.gym.bundles.digest import ResolvedBundle
from softprobe.gym.bundles.trees import STORE_ENV, store_dir
from softprobe.gym.errors import BundleError

_PREFIX = re.compile(r"^(sha256:)?[0-9a-f]{4,64}$")


class StoredBundle(BaseModel):
    """One store entry.

    Attributes:
        digest: the bundle's digest.
        manifest: its canonical manifest (what the digest is of).
        name / description: the bundle's (not part of the digest).
        source: the folder it was built from.
        images: image name -> id, as resolved when it was built.
        stored_at: when (UTC, ISO 8601).
    """

    digest: str
    manifest: dict[str, Any]
    name: str
    description: str = ""
    source: str
    images: dict[str, str]
    stored_at: str


def save(resolved: ResolvedBundle) -> Path:
    """Write ``resolved``'s entry (replacing the one of the same digest: the manifest is the
    same, only ``source`` and ``stored_at`` may differ); return its path.

    Raises:
        BundleError: the store folder cannot be written.
    """
    bundle = resolved.bundle
    entry = StoredBundle(
        digest=resolved.digest, manifest=resolved.manifest, name=bundle.name,
        description=bundle.manifest.description, source=str(bundle.root), images=dict(resolved.image_ids),
        stored_at=datetime.now(timezone.utc).isoformat(),
    )
    folder = store_dir()
    target = folder / f"{resolved.digest.removeprefix('sha256:')}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Written whole, then renamed: a reader never sees half an entry.
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".entry-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(entry.model_dump_json(indent=2))
        os.replace(temporary, target)
    except OSError as err:
        raise BundleError(f"cannot write the bundle store {folder} ({err.strerror}); set {STORE_ENV} to a "
                          "writable folder") from None
    return target


def find(digest: str) -> StoredBundle:
    """The entry of ``digest`` (``sha256:<hex>``, or a unique prefix of the hex, 4 digits at least).

    Raises:
        BundleError: not a digest, no entry, or the prefix names more than one.
    """
    if not _PREFIX.match(digest):
        raise BundleError(f"{digest!r} is neither a bundle folder nor a digest (sha256:<hex>, or a prefix of 4+ hex)")
    prefix = digest.removeprefix("sha256:")
    folder = store_dir()
    matches = sorted(folder.glob(f"{prefix}*.json")) if folder.is_dir() else []
    if not matches:
        raise BundleError(f"no bundle {digest} in the store {folder}; `softprobe-gym bundle build DIR` "
                          "(or any run of the bundle) stores one")
    if len(matches) > 1:
        names = ", ".join("sha256:" + m.stem[:16] + "..." for m in matches[:5])
        raise BundleError(f"{digest} names {len(matches)} stored bundles ({names}); give more digits")
    try:
        return StoredBundle.model_validate(json.loads(matches[0].read_text()))
    except (OSError, ValueError) as err:
        raise BundleError(f"the store entry {matches[0]} cannot be read ({err}); rebuild the bundle") from None


__all__ = ["STORE_ENV", "StoredBundle", "find", "save", "store_dir"]
