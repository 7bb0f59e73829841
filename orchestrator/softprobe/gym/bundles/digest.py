"""A bundle's digest: the sha256 of a canonical JSON manifest in which every reference is itself
a digest, so two bundles with the same digest are the same world.

- the agent image and each service image: by image id (``sha256:...``), never by tag;
- the seed folder and the overlay files: by :func:`tree_digest` (paths, types, permission bits
  and contents; not mtimes, owners or where the folder is), so a copy elsewhere has the same digest;
- tools (in name order, as the shim lists them), network policy, limits, capabilities, episode
  policy, assertions and the tape reference: verbatim (as validated, so key order and YAML spelling do not count).

The bundle's name, description and ``demo`` actions are not part of the world, so not of the
digest. Functions here take a *resolver* (image name -> id, or None if missing) so they are pure;
:func:`resolve_images` makes one from a provider.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from softprobe.gym.bundles.bundle import Bundle
from softprobe.gym.bundles.model import SCHEMA
from softprobe.gym.errors import BundleError
from softprobe.gym.providers.base import Provider

#: Image name -> image id (``sha256:...``), or None when the image does not exist.
Resolver = Callable[[str], "str | None"]


@dataclass(frozen=True)
class ResolvedBundle:
    """A bundle with every reference resolved.

    Attributes:
        bundle: the bundle.
        manifest: the canonical manifest (what the digest is of).
        digest: ``sha256:<64 hex>``.
        image_ids: image name -> id, for every image the bundle names.
    """

    bundle: Bundle
    manifest: dict[str, Any]
    digest: str
    image_ids: Mapping[str, str]

    def host_options(self) -> dict[str, Any]:
        """:meth:`Bundle.host_options` with the images pinned by id and the digest."""
        return self.bundle.host_options(image_ids=self.image_ids, digest=self.digest)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def digest_of(value: Any) -> str:
    """``sha256:`` of :func:`canonical_json` of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def tree_digest(root: Path) -> str:
    """The digest of a folder's tree: each entry's relative path, type, permission bits and
    content (a file's sha256, a symlink's target text), sorted by path. Symlinks are not
    followed. Permission bits count because the seed keeps them in the world (a file the agent
    cannot read is another world than one it can).

    Raises:
        BundleError: the tree holds something else than files, folders and symlinks (a FIFO,
            a socket, a device), or cannot be read.
    """
    entries: list[tuple[str, str, int, str | None]] = []
    try:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted([*dirs, *files]):
                path = Path(folder) / name
                relative = path.relative_to(root).as_posix()
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    entries.append((relative, "symlink", 0, os.readlink(path)))
                elif stat.S_ISDIR(info.st_mode):
                    entries.append((relative, "dir", stat.S_IMODE(info.st_mode), None))
                elif stat.S_ISREG(info.st_mode):
                    entries.append((relative, "file", stat.S_IMODE(info.st_mode), _file_sha256(path)))
                else:
                    raise BundleError(f"{path}: only files, folders and symlinks can be part of a bundle")
    except OSError as err:
        raise BundleError(f"cannot read {err.filename}: {err.strerror}") from None
    entries.sort(key=lambda entry: entry[0])
    return digest_of([list(entry) for entry in entries])


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def canonical_manifest(bundle: Bundle, resolve: Resolver) -> dict[str, Any]:
    """The manifest the digest is of (see the module docstring).

    Raises:
        BundleError: an image does not exist (the message says how to get it); the seed or
            overlay tree cannot be read.
    """
    ids = image_ids(bundle, resolve)
    manifest = bundle.manifest
    world = bundle.world
    return {
        "schema": SCHEMA,
        "image": ids[manifest.image],
        "seed": tree_digest(bundle.seed_root) if bundle.seed_root is not None else None,
        "overlay": {
            "files": tree_digest(world.tools.files_root) if world.tools.files_root is not None else None,
            # By name: the shim lists tools by name, so their order in bundle.yaml is not the world.
            "tools": [tool.model_dump(mode="json") for tool in sorted(world.tools.tools, key=lambda t: t.name)],
        },
        "services": [
            {**service.model_dump(mode="json", exclude={"image"}), "image": ids[service.image]}
            for service in world.services
        ],
        "network": world.network.model_dump(mode="json"),
        "limits": manifest.limits.model_dump(mode="json", exclude_none=True),
        "capabilities": manifest.capabilities.model_dump(mode="json"),
        "episode": manifest.episode.model_dump(mode="json"),
        "assertions": list(manifest.assertions),
        "tape": manifest.tape,
    }


def image_ids(bundle: Bundle, resolve: Resolver) -> dict[str, str]:
    """Image name -> id for every image of the bundle.

    Raises:
        BundleError: one or more images do not exist; all of them are named.
    """
    ids: dict[str, str] = {}
    missing = []
    for ref in bundle.image_refs():
        image_id = resolve(ref)
        if image_id is None:
            missing.append(ref)
        else:
            ids[ref] = image_id
    if missing:
        built = {s.image for s in bundle.world.services if s.name in bundle.builds}
        hints = [f"{ref} (run `softprobe-gym bundle build {bundle.root}`)" if ref in built
                 else f"{ref} (build or pull it first; `softprobe-gym images build` makes the project's own)"
                 for ref in missing]
        raise BundleError(f"bundle {bundle.name}: images missing on the engine", hints)
    return ids


def resolve(bundle: Bundle, resolver: Resolver) -> ResolvedBundle:
    """Resolve ``bundle`` with ``resolver``: its canonical manifest and digest.

    Raises:
        BundleError: see :func:`canonical_manifest`.
    """
    manifest = canonical_manifest(bundle, resolver)
    return ResolvedBundle(bundle=bundle, manifest=manifest, digest=digest_of(manifest),
                          image_ids=image_ids(bundle, resolver))


async def resolve_images(provider: Provider, refs: list[str]) -> dict[str, str | None]:
    """Ask ``provider`` for the id of each image (None where it has none)."""
    return {ref: await provider.resolve_image(ref) for ref in refs}


async def resolve_bundle(bundle: Bundle, provider: Provider) -> ResolvedBundle:
    """Resolve ``bundle`` against the images where ``provider`` runs.

    Raises:
        BundleError: an image is missing (the message says how to build it).
    """
    ids = await resolve_images(provider, bundle.image_refs())
    return resolve(bundle, ids.get)


__all__ = ["ResolvedBundle", "Resolver", "canonical_json", "canonical_manifest", "digest_of", "image_ids",
           "resolve", "resolve_bundle", "resolve_images", "tree_digest"]
