"""The host's side of the shim protocol: an unreadable reply fails that request, not the episode."""

from __future__ import annotations

import json

import pytest

from softprobe.gym import SandboxLostError, ShimReplyError
from softprobe.gym.shim.client import ShimClient


class ScriptedChannel:
    """A line channel whose replies are given up front (no container needed)."""

    kind = "scripted"

    def __init__(self, *replies: bytes) -> None:
        self.replies = list(replies)
        self.sent: list[bytes] = []
        self.closed = False

    async def send_line(self, line: bytes) -> None:
        self.sent.append(line)

    async def recv_line(self) -> bytes:
        if not self.replies:
            raise EOFError("no more replies")
        return self.replies.pop(0)

    def diagnostics(self) -> str:
        return ""

    def close(self) -> None:
        self.closed = True


def call_reply(request_id: int, observation: object) -> bytes:
    body = {"id": request_id, "ok": True, "result": {"observation": observation, "diagnostics": {"workspace_digest": "d", "changed_paths": []}}}
    return json.dumps(body).encode()


async def call(client: ShimClient):  # type: ignore[no-untyped-def]
    return await client.call_tool(tool="fs.list", args={}, timeout_s=5, output_cap=1024)


async def test_names_that_are_not_utf8_arrive_as_readable_text():
    # What the shim writes for a file named b"bad-\xff": a JSON escape of a lone surrogate.
    raw = b'{"id":1,"ok":true,"result":{"observation":[{"name":"bad-\\udcff"}],"diagnostics":{"changed_paths":["bad-\\udcff"]}}}'
    client = ShimClient(ScriptedChannel(raw))
    result = await call(client)
    assert result.observation == [{"name": "bad-\\xff"}]
    assert result.diagnostics["changed_paths"] == ["bad-\\xff"]
    result.model_dump_json()  # serialisable as it comes


@pytest.mark.parametrize(
    "reply",
    [b"not json at all", b'{"id":1,"ok":true,"result":{"observation":NaN,"diagnostics":{}}}', b"[1, 2]",
     b'{"id":1,"ok":true,"result":{"observation":"x","diagnostics":"not a dict"}}', b"\xff\xfe"],
    ids=["garbage", "nan", "not-an-object", "wrong-shape", "bad-utf8"],
)
async def test_an_unreadable_reply_fails_the_request_but_keeps_the_connection(reply):
    channel = ScriptedChannel(reply, call_reply(2, "second"))
    client = ShimClient(channel)
    with pytest.raises(ShimReplyError, match="container is kept"):
        await call(client)
    assert client.lost is None and not channel.closed
    assert (await call(client)).observation == "second"


async def test_a_closed_channel_is_still_a_lost_sandbox():
    client = ShimClient(ScriptedChannel())
    with pytest.raises(SandboxLostError):
        await call(client)
    assert client.lost is not None


async def test_raw_content_follows_its_line_and_oversized_content_is_not_sent(monkeypatch):
    """A seed goes as its request's line, a newline and the tar as it is (no base64); content
    over what the shim takes at once is refused before anything is sent, the connection kept."""
    from softprobe.gym import SandboxError
    from softprobe.gym.shim import client as client_module

    hello = {"id": 1, "ok": True, "result": {
        "protocol": 2, "shim_version": "v", "python": "3", "uid": 1000, "workspace": "/workspace", "tools": [],
        "shim_sha256": "s", "workspace_digest": "d", "workspace_files": ["seeded.txt"]}}
    channel = ScriptedChannel(json.dumps(hello).encode())
    client = ShimClient(channel)
    tar = b"tar\nwith\nnewlines"
    assert (await client.seed(tar)).workspace_files == ["seeded.txt"]
    header, _, content = channel.sent[0].partition(b"\n")
    assert json.loads(header) == {"op": "seed", "id": 1, "raw": len(tar)} and content == tar
    monkeypatch.setattr(client_module, "MAX_RAW_BYTES", 4)
    with pytest.raises(SandboxError, match="nothing was sent"):
        await client.seed(b"12345")
    assert len(channel.sent) == 1 and client.lost is None
