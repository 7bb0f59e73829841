"""The containers of a world around the agent's: a private network, service sidecars, and the
egress proxy (all blocking calls; the provider runs them on the engine's threads).

Each episode with services or a network policy gets a network of its own, created ``internal``
(Docker gives it no route out). Services join it under their names, the agent's container under
``agent``; nothing else does, so one episode never reaches another's services. Under ``egress``
the proxy container is the only member of both that network and the provider's egress network.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors

from softprobe.gym import labels as L
from softprobe.gym.errors import ConfigurationError, SandboxError, SandboxStartError
from softprobe.gym.providers.base import LiveRestore
from softprobe.gym.providers.docker import live
from softprobe.gym.providers.docker.engine import DockerEngine
from softprobe.gym.providers.docker.retry import control_plane
from softprobe.gym.providers.docker.snapshots import snapshot_container
from softprobe.gym.settings import ContainerSettings
from softprobe.gym.worlds import ServiceSpec, World

#: Label on a checkpoint image of a world's agent: ``{service name: image id}`` of the service
#: images committed with it, so a restore starts each service from its own snapshot.
WORLD_SERVICES = "softprobe.gym.world-services"
#: Label on a checkpoint image of a world's agent: the image the world's egress proxy runs
#: from (the agent's original image, never a snapshot the agent could have changed).
WORLD_PROXY_IMAGE = "softprobe.gym.world-proxy-image"
#: Label on every service and proxy container: which part of the world it is.
WORLD_ROLE = "softprobe.gym.world-role"
PROXY_NAME = "egress-proxy"
PROXY_PORT = 3128
#: Given to the agent's and the services' containers as their upstream DNS: Docker's embedded
#: DNS still answers the world's own names, but nothing it cannot answer is forwarded out, so
#: a name lookup is not a way to send data out of a world with no route out.
NO_UPSTREAM_DNS = ["127.0.0.1"]
_PROXY_SOURCE = (Path(__file__).parent / "egress_proxy.py").read_text()
#: The proxy's HTTP tape folder (softprobe.gym.tapes.http): an anonymous volume (its root file
#: system stays read-only), holding ``spool/``, owned by the proxy's user: the host puts
#: ``control.json`` there, the proxy appends ``journal.jsonl``.
PROXY_VOLUME = "/journal"
PROXY_SPOOL = f"{PROXY_VOLUME}/spool"
PROXY_JOURNAL = f"{PROXY_SPOOL}/journal.jsonl"
PROXY_USER = 65534


@dataclass
class WorldContainers:
    """What a started world holds besides the agent's container."""

    network: str
    services: dict[str, str] = field(default_factory=dict)  # name -> container id
    proxy: str | None = None
    proxy_image: str | None = None  # what the proxy runs from (recorded in checkpoints)



def proxy_environment(service_names: list[str]) -> dict[str, str]:
    """The agent's proxy variables (both spellings: tools differ) under network mode egress;
    the world's own services are reached directly."""
    url = f"http://{PROXY_NAME}:{PROXY_PORT}"
    direct = ",".join([*service_names, "localhost", "127.0.0.1"])
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "NO_PROXY": direct, "no_proxy": direct}


class WorldBuilder:
    """Creates, commits and removes the containers and network of worlds on one engine.

    Args:
        engine: the engine.
        egress_network: the network the egress proxy reaches the outside through.
    """

    def __init__(self, engine: DockerEngine, egress_network: str) -> None:
        self.engine = engine
        self.egress_network = egress_network

    # -- checks --------------------------------------------------------------------------------

    def check(self, world: World, settings: ContainerSettings) -> None:
        """Refuse a world this engine cannot run, before any episode starts (blocking)."""
        if not world.has_containers:
            return
        if settings.network != "none":
            raise ConfigurationError(
                f"container network {settings.network!r} would give the agent a second way out; a world "
                "with services or a network policy sets its own network (leave container.network at 'none')"
            )
        if settings.runtime is not None:
            runtimes = self.engine.info().get("Runtimes") or {}
            args = (runtimes.get(settings.runtime) or {}).get("runtimeArgs") or []
            if "--network=none" in args:
                raise ConfigurationError(
                    f"runtime {settings.runtime!r} is registered with --network=none, so its containers have no "
                    "network and services are unreachable; register it without that flag for worlds with services"
                )

    # -- start ---------------------------------------------------------------------------------

    def create_network(self, labels: dict[str, str]) -> str:
        """A new internal network for one episode; return its name."""
        name = f"softprobe-{uuid.uuid4().hex[:16]}"
        try:
            control_plane(self.engine.api.create_network)(
                name, driver="bridge", internal=True, labels={**labels, WORLD_ROLE: "network"}, check_duplicate=True,
                # internal alone drops forwarded traffic only: the bridge's own address is the
                # host's, so every host port bound to 0.0.0.0 would be in reach. Without an
                # address on the bridge the host is not on the network at all.
                options={"com.docker.network.bridge.inhibit_ipv4": "true"},
            )
        except docker.errors.APIError as err:
            if "could not find an available, non-overlapping" in str(err.explanation or err):
                raise SandboxStartError(
                    "Docker has no free address pool for another network (each episode with services uses "
                    "one; the default pools allow about 30). Lower concurrency, or give dockerd more with "
                    '"default-address-pools" in daemon.json, e.g. [{"base": "10.200.0.0/16", "size": 24}].'
                ) from None
            raise
        return name

    def start_services(
        self, world: World, network: str, labels: dict[str, str], settings: ContainerSettings,
        images: dict[str, str], deadline: float, stop: threading.Event, restore: LiveRestore | None = None,
    ) -> dict[str, str]:
        """Start the world's services in dependency order (a service starts once everything it
        depends on is healthy); return ``{name: container id}`` once all are healthy.

        ``stop`` set (the start was abandoned) ends the wait: what started is removed and
        SandboxStartError raised.
        """
        started: dict[str, str] = {}
        pending = list(world.services)
        try:
            while pending:
                ready = [s for s in pending if all(d in started for d in s.depends_on)]
                for service in ready:
                    started[service.name] = self._start_service(
                        service, images.get(service.name, service.image), network, labels, settings,
                        restore if restore is not None and service.name in restore.services else None)
                for service in ready:
                    self._wait_healthy(service, started[service.name], deadline, stop)
                pending = [s for s in pending if s.name not in started]
        except BaseException:
            for container_id in started.values():
                self.engine.remove_container(container_id)
            raise
        return started

    def _start_service(
        self, service: ServiceSpec, image: str, network: str, labels: dict[str, str], settings: ContainerSettings,
        restore: LiveRestore | None = None,
    ) -> str:
        api = self.engine.api
        healthcheck = None
        if service.healthcheck is not None:
            check = service.healthcheck
            healthcheck = {
                "test": check.docker_test(), "interval": int(check.interval_s * 1e9),
                "timeout": int(check.timeout_s * 1e9), "retries": check.retries,
                "start_period": int(check.start_period_s * 1e9),
            }
        host_config = api.create_host_config(
            network_mode=network, dns=NO_UPSTREAM_DNS, init=False, mem_limit=settings.memory,
            memswap_limit=settings.memory, pids_limit=settings.pids_limit, nano_cpus=int(settings.cpus * 1e9),
            security_opt=["no-new-privileges:true"],
            # Kept (bounded) for the error message of a service that fails to start.
            log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
            # A service keeps what its image may need (a database changes owners, binds ports),
            # but not raw sockets: the agent may take a service over, and must still not forge
            # packets on the episode's network.
            cap_drop=["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP"],
            **({"runtime": settings.runtime} if settings.runtime else {}),
        )
        try:
            response = control_plane(api.create_container)(
                image, command=service.command, environment=dict(service.environment),
                labels={**labels, WORLD_ROLE: f"service:{service.name}"}, healthcheck=healthcheck,
                host_config=host_config, hostname=service.name,
                networking_config=api.create_networking_config(
                    {network: api.create_endpoint_config(aliases=[service.name])}),
            )
        except docker.errors.ImageNotFound:
            raise SandboxStartError(
                f"service {service.name!r}: image {image!r} is not on this Docker engine; build it (a bundle's "
                "build: services are built by `softprobe-gym bundle build`) or pull it"
            ) from None
        container_id = str(response["Id"])
        try:
            if restore is None:
                control_plane(api.start)(container_id)
            else:  # its processes and memory from the live checkpoint
                live.place(live.data_root(api), container_id, restore.name, restore.folder / "services" / service.name)
                live.start(api, container_id, restore.name)
        except BaseException:
            self.engine.remove_container(container_id)
            raise
        return container_id

    def _wait_healthy(self, service: ServiceSpec, container_id: str, deadline: float, stop: threading.Event) -> None:
        """Return once the service is healthy, or running when Docker runs no healthcheck for it
        (none declared, in the spec or its image, or ``["NONE"]``)."""
        delay = 0.01
        while True:
            if stop.is_set():
                raise SandboxStartError(f"the start of service {service.name!r} was abandoned")
            state = self.engine.container_state(container_id)
            health = (state.get("Health") or {}).get("Status")
            if not state.get("Running"):
                raise SandboxStartError(
                    f"service {service.name!r} exited with code {state.get('ExitCode')} before it was ready"
                    f"{_last_probe(state)}; check its image and command{self._last_output(container_id)}"
                )
            # What Docker reports decides: a healthcheck the image declares is waited for too.
            if health is None or health == "healthy":
                return
            if health == "unhealthy":
                raise SandboxStartError(
                    f"service {service.name!r} is unhealthy{_last_probe(state)}{self._last_output(container_id)}")
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"service {service.name!r} was not healthy within the start timeout (DockerProvider("
                    f"service_start_timeout_s=...)){_last_probe(state)}; check that it starts, or raise the "
                    f"timeout{self._last_output(container_id)}"
                )
            # Docker has no event for "became healthy" that a blocking call could wait on
            # without a second stream per service; a short, growing poll is cheap here.
            stop.wait(delay)
            delay = min(delay * 2, 0.1)

    def _last_output(self, container_id: str, lines: int = 10) -> str:
        """The service's last lines of output, for an error message ("" when there are none)."""
        try:
            raw = control_plane(self.engine.api.logs)(container_id, stdout=True, stderr=True, tail=lines)
        except docker.errors.APIError:
            return ""
        text = bytes(raw).decode("utf-8", "replace").strip()
        return f". Its last output:\n{text[-2000:]}" if text else ""

    def start_proxy(
        self, world: World, image: str, network: str, labels: dict[str, str], deadline: float, stop: threading.Event,
    ) -> str:
        """The egress proxy for ``world``'s allow-list, on ``network`` and the egress network."""
        api = self.engine.api
        host_config = api.create_host_config(
            network_mode=network, init=False, mem_limit="128m", memswap_limit="128m", pids_limit=64,
            cap_drop=["ALL"], security_opt=["no-new-privileges:true"], read_only=True,
            # Its stdout is the egress report; the proxy itself bounds what it writes (see
            # egress_proxy.MAX_LOGGED), well under this cap, so nothing is rotated away.
            log_config={"type": "json-file", "config": {"max-size": "16m", "max-file": "1"}},
        )
        response = control_plane(api.create_container)(
            image, entrypoint=["python3", "-I", "-u", "-c", _PROXY_SOURCE],
            command=[f"--journal={PROXY_SPOOL}", *world.network.allow], volumes=[PROXY_VOLUME],
            user=str(PROXY_USER), labels={**labels, WORLD_ROLE: "proxy"}, host_config=host_config,
            networking_config=api.create_networking_config(
                {network: api.create_endpoint_config(aliases=[PROXY_NAME])}),
        )
        container_id = str(response["Id"])
        try:
            control_plane(api.put_archive)(container_id, PROXY_VOLUME, _tar("spool", None, PROXY_USER, 0o700))
            control_plane(api.connect_container_to_network)(container_id, self.egress_network)
            control_plane(api.start)(container_id)
            self._wait_listening(container_id, deadline, stop)
        except BaseException:
            self.engine.remove_container(container_id)
            raise
        return container_id

    def _wait_listening(self, container_id: str, deadline: float, stop: threading.Event) -> None:
        """Return once the proxy's first record (``listening``) is in its log."""
        delay = 0.005
        while True:
            if stop.is_set():
                raise SandboxStartError("the start of the egress proxy was abandoned")
            out = bytes(control_plane(self.engine.api.logs)(container_id, stdout=True, stderr=False))
            if b'"listening"' in out:
                return
            state = self.engine.container_state(container_id)
            if not state.get("Running") or time.monotonic() > deadline:
                why = "exited" if not state.get("Running") else "did not listen in time"
                raise SandboxStartError(f"the egress proxy {why}{self._last_output(container_id)}")
            stop.wait(delay)
            delay = min(delay * 2, 0.1)

    # -- snapshot, report, removal -------------------------------------------------------------

    def commit_services(
        self, world: WorldContainers, labels: dict[str, str], flatten_at_layers: int, *, pause: bool = True
    ) -> dict[str, str]:
        """Snapshot each service container as an image carrying ``labels``; ``{name: image id}``.
        ``pause=False``: the services are stopped already (a live checkpoint)."""
        committed: dict[str, str] = {}
        try:
            for name, container_id in world.services.items():
                image_id = control_plane(self.engine.api.inspect_container)(container_id)["Image"]
                # Paused: a service keeps running between steps, and its files must be consistent.
                committed[name] = snapshot_container(self.engine.api, container_id, image_id, labels,
                                                     flatten_at_layers=flatten_at_layers, user=None, pause=pause)
        except BaseException:
            self.remove_images(committed.values())
            raise
        return committed

    def remove_images(self, image_ids: Iterable[str]) -> None:
        for image_id in image_ids:
            try:
                control_plane(self.engine.api.remove_image)(image_id)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as err:
                if err.status_code != 409:  # still used by a running service: swept later
                    raise

    def egress_log(self, world: WorldContainers) -> dict[str, Any]:
        """The proxy's report so far: ``decisions`` (the first ``MAX_LOGGED``), ``suppressed``
        (how many came after them) and ``truncated`` (the log lost its start)."""
        report: dict[str, Any] = {"decisions": [], "suppressed": 0, "truncated": False}
        if world.proxy is None:
            return report
        try:
            raw = control_plane(self.engine.api.logs)(world.proxy, stdout=True, stderr=False)
        except docker.errors.NotFound:
            report["truncated"] = True
            return report
        lines = bytes(raw).decode("utf-8", "replace").splitlines()
        report["truncated"] = not (lines and '"listening"' in lines[0])
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            if record.get("event") in ("allowed", "refused", "failed"):
                report["decisions"].append(record)
            elif record.get("event") == "suppressed":
                report["suppressed"] = max(report["suppressed"], int(record.get("count") or 0))
        return report

    def configure_proxy(self, world: WorldContainers, control: bytes) -> bool:
        """Put ``control.json`` (the proxy's HTTP tape mode and replay entries) into the world's
        proxy, replacing the one before; False when the world has no proxy (blocking)."""
        if world.proxy is None:
            return False
        control_plane(self.engine.api.put_archive)(world.proxy, PROXY_SPOOL, _tar("control.json", control, 0, 0o644))
        return True

    def journal_size(self, world: WorldContainers) -> int:
        """The size of the proxy's ``journal.jsonl`` (0: none yet), by a stat: a few ms, where
        copying the file out takes tens (blocking)."""
        if world.proxy is None:
            return 0
        api = self.engine.api
        # docker-py has no stat call; the archive endpoint's HEAD is Docker's (``docker cp``'s) own.
        response = control_plane(api.head)(api._url("/containers/{0}/archive", world.proxy),
                                          params={"path": PROXY_JOURNAL})
        if response.status_code == 404:
            return 0
        response.raise_for_status()
        stat = json.loads(base64.b64decode(response.headers.get("X-Docker-Container-Path-Stat", "") or b"e30="))
        return int(stat.get("size") or 0)

    def read_journal(self, world: WorldContainers) -> bytes:
        """The proxy's ``journal.jsonl`` as it is now (b"" when there is none; blocking).

        The whole file: Docker's archive endpoint has no offset, and a tail would take an exec in
        the proxy per step. What bounds the copy is the proxy's JOURNAL_CAP (past it every line
        is a small digest-only one) and the stat before it (a step that made no request copies
        nothing)."""
        if world.proxy is None:
            return b""
        try:
            stream, _ = control_plane(self.engine.api.get_archive)(world.proxy, PROXY_JOURNAL)
        except docker.errors.NotFound:
            return b""
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            member = archive.next()
            handle = archive.extractfile(member) if member is not None else None
            return handle.read() if handle is not None else b""

    def remove(self, world: WorldContainers) -> None:
        """Remove the world's containers, then its network. Idempotent."""
        for container_id in [*world.services.values(), *([world.proxy] if world.proxy else [])]:
            self.engine.remove_container(container_id)
        self.remove_network(world.network)

    def remove_network(self, network: str) -> None:
        """Remove a world's network, first whatever is still attached to it: containers of ours
        are removed (a start abandoned half-way may leave one), anything else disconnected."""
        api = self.engine.api
        try:
            attached = (control_plane(api.inspect_network)(network).get("Containers") or {})
            for container_id in attached:
                try:
                    config = control_plane(api.inspect_container)(container_id)["Config"]
                    ours = L.MANAGED in (config.get("Labels") or {})
                except docker.errors.NotFound:
                    continue
                if ours:
                    self.engine.remove_container(container_id)
                else:
                    control_plane(api.disconnect_container_from_network)(container_id, network, force=True)
            control_plane(api.remove_network)(network)
        except docker.errors.NotFound:
            pass

    def list_networks(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        networks: list[dict[str, Any]] = control_plane(self.engine.api.networks)(filters=filters)
        return networks


def _last_probe(state: dict[str, Any]) -> str:
    log = (state.get("Health") or {}).get("Log") or []
    if not log:
        return ""
    output = str(log[-1].get("Output") or "").strip().splitlines()
    return f" (last healthcheck: exit {log[-1].get('ExitCode')}{': ' + output[-1][:200] if output else ''})"


def _tar(name: str, data: bytes | None, uid: int, mode: int) -> bytes:
    """A one-member tar: a folder (``data`` None) or a file, owned by ``uid``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.uid = info.gid = uid
        info.mode = mode
        info.mtime = int(time.time())
        if data is None:
            info.type = tarfile.DIRTYPE
            archive.addfile(info)
        else:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def service_images(image_labels: dict[str, str]) -> dict[str, str]:
    """The service images a world checkpoint's agent image names (empty for any other image)."""
    raw = image_labels.get(WORLD_SERVICES)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise SandboxError(f"checkpoint label {WORLD_SERVICES} is not JSON") from None
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


__all__ = ["NO_UPSTREAM_DNS", "PROXY_NAME", "WORLD_PROXY_IMAGE", "WORLD_ROLE", "WORLD_SERVICES", "WorldBuilder",
           "WorldContainers", "proxy_environment", "service_images"]
