"""TRACEPARENT reaches the tools of a step in a real container: the agent's shell command and a
declared tool both see the step span's W3C trace context."""

from __future__ import annotations

import pytest
from helpers import BASE, require_extra, tool

require_extra("opentelemetry.sdk", "otel")


from softprobe.gym import create_host_environment  # noqa: E402
from softprobe.gym.tracing import parse_traceparent  # noqa: E402

pytestmark = pytest.mark.docker

ENV_TOOL = {"name": "trace.env", "command": ["/bin/sh", "-c", 'echo "[${TRACEPARENT-unset}]"']}




async def test_traceparent_reaches_the_tools_in_a_container(exporter, tmp_path, seed_root):
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, image=BASE,
                                       tools=[ENV_TOOL], tool_timeout_s=20) as host:
        await host.create_episode(episode_id="ep")
        trace_id = (await host.reset(episode_id="ep")).source_trace_id
        shell = await host.step(episode_id="ep", action=tool("shell.exec", command='echo "[${TRACEPARENT-unset}]"'))
        declared = await host.step(episode_id="ep", action=tool("trace.env"))
        await host.finalize(episode_id="ep")
    steps = sorted((s for s in exporter.get_finished_spans() if s.name == "step"),
                   key=lambda s: s.attributes["softprobe.step.index"])
    assert len(steps) == 2
    for result, span in ((shell, steps[0]), (declared, steps[1])):
        seen = result.observation.strip().strip("[]")
        parsed = parse_traceparent(seen)
        assert parsed is not None, result.observation
        assert parsed[0] == trace_id and parsed[1] == f"{span.context.span_id:016x}"
