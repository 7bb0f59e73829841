"""MCP servers inside real containers: the ``softprobe/mcp-example`` image declares a
knowledge-base MCP server in its manifest; a bundle adds one of its own through the overlay. The
servers run as the episode's tool uid (not the agent's, not root), leave no process behind their
step, and their calls are taped as ``MCP_CALL`` and replayed without running. The protocol's
faults are tested on the local provider (tests/unit/test_mcp_in.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bundle_fixtures import write_bundle_folder
from helpers import processes, ready, tool

from softprobe.gym import create_host_environment
from softprobe.gym.providers.docker.images import MCP_EXAMPLE_IMAGE
from softprobe.gym.tapes import ClosureReport, read_entries

pytestmark = pytest.mark.docker

#: An MCP server of a bundle's overlay: it says who runs it, and can start a process meant to
#: outlive its step.
WHOAMI = r'''
import json, os, subprocess, sys

TOOLS = [{"name": "whoami", "inputSchema": {"type": "object", "properties": {}}},
         {"name": "linger", "inputSchema": {"type": "object", "properties": {}}}]
for line in sys.stdin:
    message = json.loads(line)
    mid, method = message.get("id"), message.get("method")
    if mid is None:
        continue
    if method == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "who"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif message["params"]["name"] == "whoami":
        me = {"uid": os.getuid(), "euid": os.geteuid(), "home": os.environ.get("HOME"), "cwd": os.getcwd(),
              "greeting": os.environ.get("GREETING")}
        result = {"content": [{"type": "text", "text": json.dumps(me)}], "structuredContent": me}
    else:
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
        result = {"content": [{"type": "text", "text": "started sleep 1000"}]}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
'''


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle_folder(tmp_path / "mcp-bundle", f"""\
schema: softprobe.environment-bundle/v1
name: mcp-in
image: {MCP_EXAMPLE_IMAGE}
overlay:
  files: tools
  mcp_servers:
    - name: who
      command: [python3, "${{SOFTPROBE_OVERLAY}}/whoami.py"]
      env: {{GREETING: hello}}
      startup_timeout_s: 20
""", {"tools/whoami.py": WHOAMI})


async def test_image_and_bundle_servers_run_as_the_tool_uid_and_leave_nothing(tmp_path, bundle):
    async with create_host_environment(run_root=tmp_path / "run", bundle=bundle) as host:
        episode = await ready(host, "mcp")
        specs = {s.name: s for s in await host.tool_specs(episode_id=episode)}
        assert specs["kb.search"].parameters["required"] == ["query"]
        assert {"kb.get_article", "who.whoami", "who.linger"} <= set(specs)
        hello = host.runtime_of(episode_id=episode).hello
        assert hello.mcp_errors == {}

        found = await host.step(episode_id=episode, action=tool("kb.search", query="refund"))
        assert found.error is None, found
        assert found.observation == {"results": [{"id": "KB-1", "title": "Refund policy"}]}
        missing = await host.step(episode_id=episode, action=tool("kb.get_article", id="KB-9"))
        assert missing.error is not None and missing.error.type == "tool_failed"

        who = await host.step(episode_id=episode, action=tool("who.whoami"))
        assert who.error is None, who
        assert who.observation["uid"] == who.observation["euid"] == hello.tool_uid
        assert hello.tool_uid not in (0, hello.uid)
        assert (who.observation["home"], who.observation["cwd"], who.observation["greeting"]) == (
            "/nonexistent", "/", "hello")

        lingering = await host.step(episode_id=episode, action=tool("who.linger"))
        assert lingering.error is None, lingering
        listing = await processes(host, episode)
        assert "sleep 1000" not in listing and "whoami.py" not in listing and "kb_server.py" not in listing


async def test_mcp_calls_are_recorded_and_replayed_as_mcp_call(tmp_path):
    actions = [tool("kb.search", query="plan"), tool("kb.get_article", id="KB-2"), tool("kb.get_article", id="nope")]
    async with create_host_environment(run_root=tmp_path / "rec", image=MCP_EXAMPLE_IMAGE, tape_mode="record") as host:
        episode = await ready(host, "rec")
        recorded = [await host.step(episode_id=episode, action=a) for a in actions]
        final = await host.finalize(episode_id=episode)
    tape = final.episode_dir / "tape"
    assert [(e.category, e.operation) for e in read_entries(tape / "tape.jsonl")] == [
        ("MCP_CALL", "kb.search"), ("MCP_CALL", "kb.get_article"), ("MCP_CALL", "kb.get_article")]
    assert recorded[1].observation.startswith("Changing a plan") and recorded[2].error.type == "tool_failed"

    async with create_host_environment(run_root=tmp_path / "rep", image=MCP_EXAMPLE_IMAGE, tape_mode="replay",
                                       tape=tape) as host:
        episode = await ready(host, "rep")
        replayed = [await host.step(episode_id=episode, action=a) for a in actions]
        final2 = await host.finalize(episode_id=episode)
    for old, new in zip(recorded, replayed, strict=True):
        assert (new.observation, new.error) == (old.observation, old.error)
        assert new.diagnostics["replayed"] is True and "mcp_server" not in new.diagnostics  # nothing ran
    report = ClosureReport.model_validate_json(final2.closure_report_path.read_text())
    assert [(d.category, d.provider) for d in report.dependencies[1:]] == [("MCP_CALL", "recorded")] * 3
