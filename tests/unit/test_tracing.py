"""OpenTelemetry traces of episodes and grading runs, collected in memory on the local provider:
the tree of spans, their attributes (never contents), fork links, the grading trace, TRACEPARENT
in the tools' environment, and everything still working without OpenTelemetry installed."""

from __future__ import annotations

import sys

import pytest
from helpers import require_extra, tool

require_extra("opentelemetry.sdk", "otel")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from softprobe.gym import create_host_environment  # noqa: E402
from softprobe.gym.evals.grading import grade_traced  # noqa: E402
from softprobe.gym.shim import agent_shim as shim  # noqa: E402
from softprobe.gym.tracing import NO_TRACING, current_tracing, parse_traceparent, root_span_id  # noqa: E402

ALL_CAPS = {"environment_checkpoint": True, "subject_state_import": True, "deterministic_prefix_reexecution": True}
SECRET = "s3cret-contents-of-the-workspace"
PRINT_TRACEPARENT = {"name": "trace.env", "command": [sys.executable, "-c",
                                                      "import os; print(os.environ.get('TRACEPARENT', 'unset'))"]}




@pytest.fixture
async def traced_host(exporter, tmp_path, seed_root, local_provider):
    async with create_host_environment(
        run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider, capabilities=ALL_CAPS,
        tools=[PRINT_TRACEPARENT], subject=Subject(),
    ) as host:
        yield host


class Subject:
    def export_state(self, episode_id: str) -> dict:
        return {}

    def import_state(self, episode_id: str, state: object) -> None:
        pass


def hex_trace(span: ReadableSpan) -> str:
    return f"{span.context.trace_id:032x}"


def by_name(spans: list[ReadableSpan], name: str, trace_id: str | None = None) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name and (trace_id is None or hex_trace(s) == trace_id)]


def attribute_text(spans: list[ReadableSpan]) -> str:
    """Every attribute value of every span (and of their links and events), as one text."""
    values: list[str] = []
    for span in spans:
        values += [str(v) for v in (span.attributes or {}).values()]
        for link in span.links:
            values += [str(v) for v in (link.attributes or {}).values()]
        for event in span.events:
            values += [str(v) for v in (event.attributes or {}).values()]
    return "\n".join(values)


async def test_an_episode_is_one_trace_with_a_span_per_operation(traced_host, exporter):
    host = traced_host
    await host.create_episode(episode_id="ep")
    reset = await host.reset(episode_id="ep")
    trace_id = reset.source_trace_id
    wrote = await host.step(episode_id="ep", action=tool("fs.write", path="secret.txt", content=SECRET))
    read = await host.step(episode_id="ep", action=tool("fs.read", path="secret.txt"))
    failed = await host.step(episode_id="ep", action=tool("shell.exec", command="cat secret.txt; exit 3"))
    printed = await host.step(episode_id="ep", action=tool("shell.exec", command='echo "$TRACEPARENT"'))
    declared = await host.step(episode_id="ep", action=tool("trace.env"))
    assert read.observation == SECRET and SECRET in failed.diagnostics["output"]
    finalized = await host.finalize(episode_id="ep")
    assert finalized.source_trace_id == trace_id

    spans = list(exporter.get_finished_spans())
    (root,) = by_name(spans, "episode")
    assert hex_trace(root) == trace_id and root.parent is None  # a true root: no parent span id
    assert root.context.span_id == root_span_id(trace_id)
    assert root.attributes["softprobe.episode.id"] == "ep"
    assert {s.name for s in spans} == {"episode", "reset", "step", "shim.call", "shim.command", "finalize"}
    assert all(hex_trace(s) == trace_id for s in spans)
    for name in ("reset", "finalize"):
        (span,) = by_name(spans, name)
        assert span.parent.span_id == root.context.span_id
    steps = sorted(by_name(spans, "step"), key=lambda s: s.attributes["softprobe.step.index"])
    assert [s.attributes["softprobe.tool.name"] for s in steps] == [
        "fs.write", "fs.read", "shell.exec", "shell.exec", "trace.env"]
    assert all(s.parent.span_id == root.context.span_id for s in steps)
    first, _, bad, echo, _ = (s.attributes for s in steps)
    assert first["softprobe.step.changed_paths"] == 1 and "softprobe.step.error_type" not in first
    assert first["softprobe.step.observation_bytes"] == len(wrote.observation.encode())
    assert first["softprobe.step.duration_ms"] == wrote.duration_ms
    assert bad["softprobe.step.error_type"] == "command_failed" and bad["softprobe.step.exit_code"] == 3
    assert steps[2].status.status_code.name == "ERROR"
    assert echo["softprobe.step.exit_code"] == 0 and echo["softprobe.step.changed_paths"] == 0
    # The shim's own timings: a shim.call per tool step, with shim.command for processes.
    calls = by_name(spans, "shim.call")
    assert sorted(c.parent.span_id for c in calls) == sorted(s.context.span_id for s in steps)
    commands = by_name(spans, "shim.command")
    assert len(commands) == 3 and {c.parent.span_id for c in commands} <= {c.context.span_id for c in calls}
    for call in calls:
        assert call.end_time - call.start_time == pytest.approx(call.attributes["softprobe.shim.tool_ms"] * 1e6, abs=1)
    # Names and numbers, never contents: the file's text is in no attribute.
    assert SECRET not in attribute_text(spans) and "secret.txt" not in attribute_text(spans)

    # The tools of a step (a shell command, a declared tool) see that step's span as their parent.
    for result, span in ((printed, steps[3]), (declared, steps[4])):
        parsed = parse_traceparent(result.observation.strip())
        assert parsed is not None, result.observation
        assert parsed[0] == trace_id and parsed[1] == f"{span.context.span_id:016x}" and int(parsed[2], 16) & 1  # sampled


async def test_each_reset_starts_a_new_trace_and_destroy_ends_the_open_one(traced_host, exporter):
    host = traced_host
    await host.create_episode(episode_id="ep")
    first = (await host.reset(episode_id="ep")).source_trace_id
    await host.step(episode_id="ep", action=tool("fs.list", path="."))
    second = (await host.reset(episode_id="ep")).source_trace_id
    assert first != second
    roots = by_name(list(exporter.get_finished_spans()), "episode")
    assert [hex_trace(r) for r in roots] == [first]  # the first attempt's root ended at the reset
    await host.destroy(episode_id="ep")
    roots = by_name(list(exporter.get_finished_spans()), "episode")
    assert [hex_trace(r) for r in roots] == [first, second]


@pytest.mark.parametrize("path", ["prefix_reexecution", "checkpoint_import"])
async def test_a_fork_starts_the_childs_trace_linked_to_the_parent(traced_host, exporter, path):
    host = traced_host
    await host.create_episode(episode_id="parent")
    parent_trace = (await host.reset(episode_id="parent")).source_trace_id
    await host.step(episode_id="parent", action=tool("fs.write", path="a.txt", content="a"))
    await host.step(episode_id="parent", action=tool("fs.write", path="b.txt", content="b"))
    if path == "checkpoint_import":
        record = await host.checkpoint(episode_id="parent")
        fork = await host.fork(episode_id="parent", path=path, checkpoint_id=record.checkpoint_id,
                               child_episode_id="child")
    else:
        fork = await host.fork(episode_id="parent", path=path, prefix_length=1, child_episode_id="child")
    child_trace = (await host.step(episode_id="child", action=tool("fs.list", path="."))).source_trace_id
    assert child_trace != parent_trace
    await host.finalize(episode_id="child")

    spans = list(exporter.get_finished_spans())
    (child_root,) = by_name(spans, "episode", child_trace)
    assert child_root.parent is None and child_root.attributes["softprobe.episode.id"] == "child"
    (fork_span,) = by_name(spans, "fork")
    assert hex_trace(fork_span) == child_trace and fork_span.parent.span_id == child_root.context.span_id
    assert fork_span.attributes["softprobe.fork.path"] == path
    assert fork_span.attributes["softprobe.fork.branch_step"] == fork.lineage.branch_step
    links = {link.attributes["softprobe.link.relation"]: link.context for link in fork_span.links}
    assert links["forked_from"].span_id == root_span_id(parent_trace)
    assert f"{links['forked_from'].trace_id:032x}" == parent_trace
    branch = [s for s in by_name(spans, "step", parent_trace)
              if s.attributes["softprobe.step.index"] == fork.lineage.branch_step]
    assert links["branch_step"].span_id == branch[0].context.span_id
    child_spans = [s for s in spans if hex_trace(s) == child_trace]
    if path == "prefix_reexecution":  # its reset and replayed step ran inside the fork
        (reset,) = by_name(child_spans, "reset")
        replayed = [s for s in by_name(child_spans, "step") if s.parent.span_id == fork_span.context.span_id]
        assert reset.parent.span_id == fork_span.context.span_id and len(replayed) == 1
    later = [s for s in by_name(child_spans, "step") if s.parent.span_id == child_root.context.span_id]
    assert len(later) == 1  # the step after the fork hangs off the child's root
    assert {s.name for s in child_spans} >= {"episode", "fork", "step", "finalize"}


async def test_a_grading_run_has_its_own_trace_derived_from_the_source(exporter):
    source = "0123456789abcdef0123456789abcdef"
    cases = [{"attempt_id": "task-1", "final_output": "refund issued", "trajectory_digest": "sha256:" + "0" * 64,
              "source_trace_id": source, "assertions": [{"type": "contains", "value": "refund"}]}]
    (outcome,) = await grade_traced(cases, backend="native")
    (link,) = outcome.framework_result.trace_links
    (grade,) = exporter.get_finished_spans()
    assert grade.name == "grade" and grade.parent is None
    assert hex_trace(grade) == link.evaluator_trace_id != source
    (derived,) = grade.links
    assert derived.attributes["softprobe.link.relation"] == "derived_from"
    assert f"{derived.context.trace_id:032x}" == source and derived.context.span_id == root_span_id(source)
    assert grade.attributes["softprobe.grade.passed"] is True
    assert grade.attributes["softprobe.grade.source_trace_id"] == source


def test_the_shim_takes_only_a_well_formed_traceparent():
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert shim.valid_traceparent(good) == good
    for bad in [None, 7, "", good.upper(), "01" + good[2:], good + " ", " " + good, good.replace("-", "_"),
                "00-" + "0" * 32 + "-b7ad6b7169203331-01", "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1", "00-0af7651916cd43dd8448eb211c8031g9-b7ad6b7169203331-01",
                good + "\nX=1"]:
        assert shim.valid_traceparent(bad) is None, bad
        assert parse_traceparent(bad) is None, bad
    assert shim._with_traceparent({"A": "1"}, None) == {"A": "1"}
    assert shim._with_traceparent({"A": "1"}, good) == {"A": "1", "TRACEPARENT": good}


def test_a_malformed_traceparent_reaches_no_tool(tmp_path):
    from test_shim_local import Shim

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "no-tools.json").write_text("{}")
    with Shim(workspace, "--local") as running:
        request = {"op": "call", "tool": "shell.exec", "args": {"command": 'echo "[${TRACEPARENT-unset}]"'},
                   "timeout_s": 10, "output_cap": 4096}
        assert running.ask({**request, "traceparent": "00-abc-def-01; touch pwned"})["observation"] == "[unset]\n"
        good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        assert running.ask({**request, "traceparent": good})["observation"] == f"[{good}]\n"
        assert running.ask(request)["observation"] == "[unset]\n"  # per call, not remembered
        running.close()
    assert not (workspace / "pwned").exists()


async def test_without_opentelemetry_episodes_run_and_nothing_is_traced(
    exporter, monkeypatch, tmp_path, seed_root, local_provider
):
    # As if the extra were not installed: importing any opentelemetry module fails.
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "softprobe.gym.tracing.otel", raising=False)
    assert current_tracing() is NO_TRACING
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider,
                                       capabilities=ALL_CAPS, subject=Subject()) as host:
        await host.create_episode(episode_id="ep")
        reset = await host.reset(episode_id="ep")
        step = await host.step(episode_id="ep", action=tool("shell.exec", command='echo "[${TRACEPARENT-unset}]"'))
        assert step.observation == "[unset]\n" and step.source_trace_id == reset.source_trace_id
        fork = await host.fork(episode_id="ep", path="prefix_reexecution", prefix_length=1, child_episode_id="kid")
        assert fork.lineage.branch_step == 1
        result = await host.finalize(episode_id="ep")
        assert result.source_trace_id == reset.source_trace_id and len(reset.source_trace_id) == 32
    assert exporter.get_finished_spans() == ()


async def test_the_applications_global_provider_is_used_when_it_has_set_one(monkeypatch, tmp_path, seed_root,
                                                                            local_provider):
    from opentelemetry import trace

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    try:
        async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root,
                                           provider=local_provider) as host:
            await host.create_episode(episode_id="ep")
            trace_id = (await host.reset(episode_id="ep")).source_trace_id
        assert {hex_trace(s) for s in memory.get_finished_spans()} == {trace_id}
    finally:
        provider.shutdown()


def test_otlp_variables_set_up_an_sdk_provider_from_the_standard_configuration(monkeypatch):
    from softprobe.gym.tracing import provider as choice

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    made = choice._otlp_provider()  # not made global here: that can happen once per process
    try:
        assert isinstance(made, TracerProvider)
        assert made.resource.attributes["service.name"] == "softprobe-gym"
    finally:
        made.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-evals")
    made = choice._otlp_provider()
    try:
        assert made.resource.attributes["service.name"] == "my-evals"
    finally:
        made.shutdown()
