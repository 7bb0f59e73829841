"""`softprobe-gym mcp` on the real engine: one test per transport, and the MCP round trip next
to a direct ``host.step`` of the same action (printed, not asserted)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from helpers import SUPPORT_DESK, require_extra

from softprobe.gym import create_host_environment
from softprobe.gym import labels as L
from softprobe.gym.mcp_server import EpisodeSessions, HttpEndpoint
from softprobe.gym.mcp_server.server import META_EPISODE

require_extra("mcp", "mcp")

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine")]
ORCHESTRATOR = str(Path(__file__).resolve().parents[2] / "orchestrator")


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


SAMPLES = 40


async def interleaved(
    host: Any, mcp_call: Callable[[], Awaitable[Any]], path: str = "refund-note.md"
) -> tuple[list[float], list[float]]:
    """SAMPLES of an fs.read as a direct host.step and through MCP, alternating."""
    direct: list[float] = []
    via_mcp: list[float] = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        await host.step(episode_id="direct", action={"type": "tool", "name": "fs.read", "args": {"path": path}})
        direct.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        result = await mcp_call()
        via_mcp.append((time.perf_counter() - started) * 1000)
        assert not result.is_error
    return direct, via_mcp


def report(name: str, direct: list[float], via_mcp: list[float]) -> None:
    def row(label: str, samples: list[float]) -> str:
        p90 = statistics.quantiles(samples, n=10)[-1]
        return f"  {label:<34} median {statistics.median(samples):6.2f} ms   p90 {p90:6.2f} ms"

    print(f"\n[docker, support-desk] fs.read round trip, {SAMPLES} interleaved samples:")
    print(row("direct host.step", direct))
    print(row(name, via_mcp))
    print(f"  overhead (median): {statistics.median(via_mcp) - statistics.median(direct):.2f} ms")


def containers_of(host_id: str, episode_id: str) -> list[Any]:
    """Containers of one episode of one host (never anything else on the shared engine)."""
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": [f"{L.HOST}={host_id}", f"{L.EPISODE}={episode_id}"]})
    finally:
        client.close()


async def test_stdio_on_docker_runs_the_images_tools_and_removes_the_container(tmp_path: Path) -> None:
    run_root = tmp_path / "run"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "softprobe.gym.cli", "mcp", "--image", SUPPORT_DESK, "--run-root", str(run_root)],
        env={"PYTHONPATH": ORCHESTRATOR, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
             **({"DOCKER_HOST": os.environ["DOCKER_HOST"]} if "DOCKER_HOST" in os.environ else {})},
    )
    async with Client(params) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert "crm.get_account" in tools and "fs.write" in tools  # image-declared and built-in
        assert tools["crm.get_account"].input_schema["type"] == "object"
        account = await client.call_tool("crm.get_account", {"id": "A-42"})
        assert not account.is_error and json.loads(text(account))["id"] == "A-42"
        episode_id = account.meta[META_EPISODE]
        host_id = json.loads((run_root / "episodes" / episode_id / "episode.json").read_text())["host_id"]
        assert len(containers_of(host_id, episode_id)) == 1
        await client.call_tool("fs.write", {"path": "refund-note.md", "content": "refund A-42"})
        assert text(await client.call_tool("fs.read", {"path": "refund-note.md"})) == "refund A-42"
        bad = await client.call_tool("crm.get_account", {"id": 42})
        assert bad.is_error
        # The round trip through the stdio server next to a direct step of this process's host.
        async with create_host_environment(run_root=tmp_path / "direct", image=SUPPORT_DESK) as host:
            await host.create_episode(episode_id="direct")
            await host.reset(episode_id="direct")
            await host.step(episode_id="direct", action={"type": "tool", "name": "fs.write",
                                                         "args": {"path": "refund-note.md", "content": "refund A-42"}})
            direct, via_mcp = await interleaved(host, lambda: client.call_tool("fs.read", {"path": "refund-note.md"}))
            assert containers_of(host.host_id, "direct") != []
        report("MCP tools/call (stdio)", direct, via_mcp)
    folder = run_root / "episodes" / episode_id
    assert (folder / "workspace" / "refund-note.md").read_text() == "refund A-42"
    assert json.loads((folder / "result.json").read_text())["steps"] == 4 + SAMPLES
    assert containers_of(host_id, episode_id) == []


async def test_http_on_docker_gives_each_session_a_container_and_measures_the_round_trip(tmp_path: Path) -> None:
    host = create_host_environment(run_root=tmp_path / "run", image=SUPPORT_DESK)
    sessions = EpisodeSessions(host)
    endpoint = HttpEndpoint(sessions, port=0)
    url = await endpoint.start()
    try:
        await host.create_episode(episode_id="direct")
        await host.reset(episode_id="direct")
        async with Client(url) as a, Client(url) as b:
            ep_a = (await a.call_tool("fs.write", {"path": "f", "content": "A"})).meta[META_EPISODE]
            ep_b = (await b.call_tool("fs.write", {"path": "f", "content": "B"})).meta[META_EPISODE]
            assert ep_a != ep_b
            assert len(containers_of(host.host_id, ep_a)) == len(containers_of(host.host_id, ep_b)) == 1
            assert text(await b.call_tool("fs.read", {"path": "f"})) == "B"
            await host.step(episode_id="direct", action={"type": "tool", "name": "fs.write",
                                                         "args": {"path": "f", "content": "A"}})
            direct, via_mcp = await interleaved(host, lambda: a.call_tool("fs.read", {"path": "f"}), path="f")
        await sessions.wait_closed(ep_a)
        await sessions.wait_closed(ep_b)
        assert containers_of(host.host_id, ep_a) == containers_of(host.host_id, ep_b) == []
        assert (tmp_path / "run" / "episodes" / ep_a / "workspace" / "f").read_text() == "A"
        await host.destroy(episode_id="direct")
    finally:
        await endpoint.stop()
        await host.close()

    report("MCP tools/call (streamable HTTP)", direct, via_mcp)
