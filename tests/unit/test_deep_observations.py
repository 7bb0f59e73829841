"""Issue 29 item 12: a tool's JSON observation nested deeper than the host's readers can read.

The shim parsed about 1,000 levels, pydantic writes 255 and reads about 254: at 250 levels a
step line was written that nothing could load (``softprobe-gym grade`` then graded no episode
of the run root), at 300 ``host.step`` raised an untyped ``PydanticSerializationError`` after
the tool ran and the step was missing from ``trajectory.jsonl``, and near 1,000 the host's own
parser gave up (``ShimReplyError``, the step missing too). Now an observation nested more than
64 levels deep (the limit of actions) is the step's ``observation_too_deep`` error: the step is
recorded and readable, and the episode goes on. On the local provider; the same on the real
engine in ``tests/docker/test_attack_mode_bits_holes_and_deep_json.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import tool

from softprobe.gym import create_host_environment
from softprobe.gym.providers.local import LocalProvider
from softprobe.gym.results import StepResult
from softprobe.gym.shim.client import ShimClient
from softprobe.gym.shim.replies import MAX_OBSERVATION_DEPTH, PRUNED, json_depth, prune_deep_json

DEPTHS = [63, 64, 65, 250, 300, 5000]

#: Prints JSON arrays nested ``depth`` levels deep (``depth`` from the tool's arguments).
NESTED = "import json, sys; n = json.load(sys.stdin)['depth']; print('[' * n + ']' * n)"


def nested(depth: int) -> Any:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_tool(name: str = "deep.json") -> dict[str, Any]:
    return {"name": name, "description": "prints nested JSON",
            "args": {"type": "object", "properties": {"depth": {"type": "integer"}}, "required": ["depth"]},
            "command": [sys.executable, "-c", NESTED], "output": "json"}


def read_back(episode_dir: Path) -> list[StepResult]:
    """Every line of the trajectory, read as the graders read it (newline-split, pydantic)."""
    lines = (episode_dir / "trajectory.jsonl").read_bytes().split(b"\n")
    return [StepResult.model_validate_json(line) for line in lines if line]


def test_json_depth_counts_arrays_and_objects_without_recursion():
    assert [json_depth(v) for v in ("x", 1, None, [], {}, [1, {"a": [2]}], {"a": {}, "b": [[[]]]})] == [0, 0, 0, 1, 1, 3, 4]
    assert json_depth(nested(100_000)) == 100_000  # far past any recursion limit


def test_prune_deep_json_cuts_only_what_is_too_deep_and_never_inside_text():
    shallow = b'{"a":["[[[[","\\"]]"],{"b":[1]}]}'
    assert prune_deep_json(shallow, 3) == shallow  # brackets inside strings are text
    assert json.loads(prune_deep_json(b'[[1,[2,[3]]],[4]]', 2)) == [[1, "..."], [4]]
    assert PRUNED == b'"..."'
    deep = ("[" * 200_000 + "]" * 200_000).encode()
    assert json_depth(json.loads(prune_deep_json(deep, 10))) == 10


async def test_deep_json_from_a_declared_tool_is_a_readable_step_and_a_typed_error_when_over(tmp_path):
    provider = LocalProvider(root=tmp_path / "local")
    run_root = tmp_path / "run"
    try:
        async with create_host_environment(run_root=run_root, provider=provider, tools=[deep_tool()]) as host:
            for depth in DEPTHS:
                episode_id = f"d{depth}"
                await host.create_episode(episode_id=episode_id)
                await host.reset(episode_id=episode_id)
                made = await host.step(episode_id=episode_id, action=tool("deep.json", depth=depth))
                if depth <= MAX_OBSERVATION_DEPTH:
                    assert made.error is None and made.observation == nested(depth), made.error
                else:
                    assert made.error is not None and made.error.type == "observation_too_deep", made.error
                    assert made.observation.startswith("error (observation_too_deep): ")
                    assert made.diagnostics["workspace_digest"].startswith("sha256:")
                after = await host.step(episode_id=episode_id, action=tool("shell.exec", command="echo alive"))
                assert after.error is None and after.observation == "alive\n"  # the episode goes on
                await host.step(episode_id=episode_id, action={"type": "terminate", "output": "done"})
                done = await host.finalize(episode_id=episode_id)
                steps = read_back(done.episode_dir)
                assert [s.index for s in steps] == [1, 2, 3]  # no gap, every line readable
                assert steps[0].observation == made.observation and steps[0].error == made.error
    finally:
        await provider.close()
    spec = tmp_path / "assert.yaml"
    spec.write_text("- {type: contains, value: done}\n")
    graded = subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "grade", str(run_root), "--assert", str(spec),
                             "--backend", "native"], capture_output=True, text=True, timeout=300)
    # Every episode of the run root is graded: none is unreadable.
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert f"{len(DEPTHS)} passed" in graded.stdout, graded.stdout


#: An MCP server whose one tool answers with ``structuredContent`` nested ``depth`` deep.
DEEP_MCP = r'''
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("id") is None:
        continue
    if m["method"] == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                                                         "serverInfo": {"name": "deep", "version": "0"}}})
    elif m["method"] == "tools/list":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": [{"name": "nest", "inputSchema": {"type": "object"}}]}})
    else:
        n = m["params"]["arguments"]["depth"]
        sys.stdout.write('{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"nested %d"}],'
                         '"structuredContent":{"v":%s%s}}}\n' % (json.dumps(m["id"]), n, "[" * (n - 1), "]" * (n - 1)))
        sys.stdout.flush()
'''


async def test_deep_structured_content_from_an_mcp_tool_gives_its_text_instead(tmp_path):
    server = tmp_path / "deep_server.py"
    server.write_text(DEEP_MCP)
    manifest = tmp_path / "tools.json"
    manifest.write_text(json.dumps({"tools": {}, "mcp_servers": [{"name": "deep", "command": [sys.executable, str(server)]}]}))
    provider = LocalProvider(root=tmp_path / "local", manifest=manifest)
    try:
        async with create_host_environment(run_root=tmp_path / "run", provider=provider) as host:
            await host.create_episode(episode_id="ep")
            await host.reset(episode_id="ep")
            fits = await host.step(episode_id="ep", action=tool("deep.nest", depth=64))
            assert fits.error is None and json_depth(fits.observation) == 64
            for depth in (65, 300, 900):
                over = await host.step(episode_id="ep", action=tool("deep.nest", depth=depth))
                assert over.error is None and over.observation == f"nested {depth}", over
                assert "nested more than 64" in over.diagnostics["structured_content_dropped"]
            done = await host.finalize(episode_id="ep")
            assert [s.index for s in read_back(done.episode_dir)] == [1, 2, 3, 4]
    finally:
        await provider.close()


class _Replying:
    """A line channel whose shim answers every request with ``observation`` in a call reply (a
    shim that does not bound what it sends: the host's own boundary is what is tested)."""

    kind = "scripted"

    def __init__(self, observation_json: bytes) -> None:
        self.observation_json = observation_json
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()

    async def send_line(self, line: bytes) -> None:
        request_id = json.loads(line)["id"]
        self.replies.put_nowait(b'{"id":%d,"ok":true,"result":{"observation":%s,"error":null,"diagnostics":'
                                b'{"workspace_digest":"sha256:%s","changed_paths":["out.txt"]}}}'
                                % (request_id, self.observation_json, b"0" * 64))

    async def recv_line(self) -> bytes:
        return await self.replies.get()

    def diagnostics(self) -> str:
        return ""

    def close(self) -> None:
        pass


@pytest.mark.parametrize("depth", [65, 250, 300, 980, 5000, 200_000])
async def test_the_host_bounds_a_deep_reply_whatever_the_shim_sends(depth):
    brackets = b"[" * depth + b"]" * depth
    client = ShimClient(_Replying(brackets))
    call = await client.call_tool(tool="deep.json", args={}, timeout_s=5, output_cap=1 << 20)
    assert call.error is not None and call.error.type == "observation_too_deep"
    assert call.diagnostics["changed_paths"] == ["out.txt"]  # the rest of the reply is kept
    StepResult.model_validate_json(StepResult(episode_id="e", index=1, action=tool("deep.json"), observation=call.observation,
                                              error=call.error, diagnostics=call.diagnostics).model_dump_json())


async def test_the_host_keeps_a_reply_at_the_limit_and_its_escaped_names():
    client = ShimClient(_Replying(b'["\\udcff", %s]' % (b"[" * 63 + b"]" * 63)))  # a non-UTF-8 name: the slow path
    call = await client.call_tool(tool="deep.json", args={}, timeout_s=5, output_cap=1 << 20)
    assert call.error is None and call.observation[0] == "\\xff" and json_depth(call.observation) == 64


@pytest.mark.parametrize("depth", [300, 5000])
async def test_a_hand_made_tape_answer_nested_too_deep_is_a_typed_step_error(tmp_path, depth):
    """A tape from elsewhere (a bundle's) is not the shim's reply: what it serves is bounded too."""
    from softprobe.gym.tapes import TapeFolder

    provider = LocalProvider(root=tmp_path / "local")
    try:
        async with create_host_environment(run_root=tmp_path / "rec", provider=provider, tools=[deep_tool()],
                                           tape_mode="record") as host:
            await host.create_episode(episode_id="ep")
            await host.reset(episode_id="ep")
            assert (await host.step(episode_id="ep", action=tool("deep.json", depth=3))).error is None
            tape = (await host.finalize(episode_id="ep")).episode_dir / "tape"
        folder = TapeFolder(tape)
        deep_ref = folder.put_payload(b"[" * depth + b"]" * depth)
        lines = folder.tape_path.read_text().split("\n")
        edited = []
        for line in lines:
            record = json.loads(line) if line else None
            if isinstance(record, dict) and "response" in record:
                record["response"]["payload_ref"] = deep_ref
                line = json.dumps(record)
            edited.append(line)
        folder.tape_path.write_text("\n".join(edited))
        async with create_host_environment(run_root=tmp_path / "rep", provider=provider, tools=[deep_tool()],
                                           tape_mode="replay", tape=tape) as host:
            await host.create_episode(episode_id="ep")
            await host.reset(episode_id="ep")
            served = await host.step(episode_id="ep", action=tool("deep.json", depth=3))
            # Parsed: bounded like a reply; past the parser: the tape is corrupt. Typed either way.
            # Read, then bounded like a reply; past the parser, the tape is corrupt: typed either way.
            expected = "observation_too_deep" if depth < 900 else "tape_corrupt"
            assert served.error is not None and served.error.type == expected, served
            done = await host.finalize(episode_id="ep")
            assert [s.index for s in read_back(done.episode_dir)] == [1]
    finally:
        await provider.close()
