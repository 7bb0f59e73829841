"""Snapshots of containers as images: ``docker commit``, or, when the image's layer chain gets
deep, an export/import flattened to one layer (overlay2 refuses more than ~125 layers, and
checkpoints of checkpoints would get there)."""

from __future__ import annotations

import json
from typing import Any

from softprobe.gym.errors import SandboxError
from softprobe.gym.providers.docker.retry import control_plane


def snapshot_container(
    api: Any, container_id: str, image_id: str, labels: dict[str, str], *, flatten_at_layers: int,
    user: str | None, pause: bool,
) -> str:
    """Snapshot ``container_id`` (started from ``image_id``) as an image carrying ``labels``;
    return its id. Blocking.

    Args:
        flatten_at_layers: flatten instead of committing when the new image would have this
            many layers.
        user: the user the image runs as (kept in a flattened image's configuration).
        pause: pause the container while it is committed (a service that keeps running).
    """
    image = control_plane(api.inspect_image)(image_id)
    if len(image["RootFS"]["Layers"]) + 1 >= flatten_at_layers:
        return _flatten(api, container_id, image["Config"] or {}, labels, user)
    response = control_plane(api.commit)(container_id, conf={"Labels": labels}, pause=pause)
    return str(response["Id"])


def _flatten(api: Any, container_id: str, config: dict[str, Any], labels: dict[str, str], user: str | None) -> str:
    """Snapshot as a one-layer image: export the container's filesystem, import it with the
    image's configuration. Slower than a commit, so only used when a commit chain gets deep."""
    changes = _config_changes(config, labels, user)
    exported = api.export(container_id)
    response = api.import_image_from_stream(exported, changes=changes)
    status = _last_json_line(response)
    image_id: str = status.get("status", "")
    if not image_id.startswith("sha256:"):
        raise SandboxError(f"flattening the checkpoint failed: {status}")
    return image_id


def _config_changes(config: dict[str, Any], labels: dict[str, str], user: str | None) -> list[str]:
    """Dockerfile instructions that give an imported image the configuration of ``config``."""

    def quote(value: str) -> str:
        return json.dumps(value).replace("$", "\\$")

    changes = []
    for entry in config.get("Env") or []:
        key, _, value = entry.partition("=")
        changes.append(f"ENV {key}={quote(value)}")
    if config.get("WorkingDir"):
        changes.append(f"WORKDIR {config['WorkingDir']}")
    if user or config.get("User"):
        changes.append(f"USER {user or config['User']}")
    if config.get("Entrypoint"):
        changes.append(f"ENTRYPOINT {json.dumps(config['Entrypoint'])}")
    if config.get("Cmd"):
        changes.append(f"CMD {json.dumps(config['Cmd'])}")
    merged = dict(config.get("Labels") or {}, **labels)
    changes.extend(f"LABEL {quote(key)}={quote(value)}" for key, value in merged.items())
    return changes


def _last_json_line(response: Any) -> dict[str, Any]:
    text = response if isinstance(response, str) else bytes(response).decode("utf-8", "replace")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    try:
        return dict(json.loads(lines[-1])) if lines else {}
    except ValueError:
        return {"status": text[-300:]}


__all__ = ["snapshot_container"]
