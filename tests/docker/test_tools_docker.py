"""The tools' container side: a uid allocated per episode, the shim as PID 1 sweeping what a
command left, the support-desk image's own tools, and the container's file limit. Every tool's
logic is tested on the local provider (tests/unit/test_tools.py)."""

from __future__ import annotations

import pytest
from helpers import processes, ready, tool

pytestmark = pytest.mark.docker


async def test_seed_files_are_copied_into_the_workspace_with_their_modes(host):
    episode_id = await host.create_episode(episode_id="ep")
    reset = await host.reset(episode_id="ep")
    assert sorted(reset.observation["workspace_files"]) == ["docs/guide.md", "hello.txt"]
    assert reset.diagnostics["workspace_digest"].startswith("sha256:")
    listing = await host.step(episode_id="ep", action=tool("shell.exec", command="id -u; stat -c '%a %u %n' hello.txt docs"))
    agent_uid, *modes = listing.observation.splitlines()
    # Owned by the episode's own uid (allocated per container, never the host's user).
    assert int(agent_uid) >= 1 << 20
    assert modes == [f"640 {agent_uid} hello.txt", f"755 {agent_uid} docs"]
    assert episode_id.episode_id == "ep"


async def test_a_timeout_kills_the_command_and_everything_it_started(host):
    episode_id = await ready(host)
    command = "sleep 300 & (setsid sleep 301 &) ; echo started; sleep 302"
    result = await host.step(episode_id=episode_id, action=tool("shell.exec", command=command, timeout_s=1))
    assert result.error.type == "timeout"
    assert "killed" in result.error.message
    assert result.diagnostics["command_ms"] < 10_000
    survivors = await processes(host, episode_id)
    assert "sleep 30" not in survivors, survivors


async def test_background_processes_do_not_outlive_their_step(host):
    episode_id = await ready(host)
    quick = await host.step(episode_id=episode_id, action=tool("shell.exec", command="sleep 120 & echo bg"))
    assert quick.observation == "bg\n" and quick.diagnostics["command_ms"] < 5_000
    after = await processes(host, episode_id)
    assert "sleep 120" not in after, after


async def test_an_image_declared_tool_runs_with_json_in_and_out(host):
    episode_id = await ready(host)
    account = await host.step(episode_id=episode_id, action=tool("crm.get_account", id="A-42"))
    assert account.error is None
    assert account.observation["id"] == "A-42" and account.observation["name"] == "Acme Rockets"
    missing = await host.step(episode_id=episode_id, action=tool("crm.get_account", id="A-0"))
    assert missing.error.type == "tool_failed" and "no account A-0" in missing.error.message
    wrong = await host.step(episode_id=episode_id, action=tool("crm.get_account", id=42))
    assert wrong.error.type == "invalid_arguments"


async def test_reading_a_huge_file_returns_its_head_and_tail_without_reading_it_all(host):
    episode_id = await ready(host)
    make = "printf START > big; truncate -s 900M big; printf END >> big"  # under the 1 GiB file limit
    assert (await host.step(episode_id=episode_id, action=tool("shell.exec", command=make))).error is None
    read = await host.step(episode_id=episode_id, action=tool("fs.read", path="big"))
    assert read.diagnostics["bytes"] == 900 * 1024**2 + 3
    assert read.observation.startswith("START") and read.observation.endswith("END")
    assert read.diagnostics["output_truncated"] is True
