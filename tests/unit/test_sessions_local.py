"""Persistent sessions on the local provider (no engine): the tools, their typed errors, the
capability and the closure report. The isolation tests are Docker's
(tests/docker/test_sessions_docker.py)."""

from __future__ import annotations

import json

import pytest
from helpers import ready

from softprobe.gym import create_host_environment
from softprobe.gym.errors import CapabilityError, ConfigurationError


def call(tool_name: str, **args: object) -> dict:
    return {"type": "tool", "name": tool_name, "args": args}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


async def test_sessions_keep_state_across_steps_and_die_at_close_and_finalize(tmp_path, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", provider=local_provider,
                                       capabilities={"sessions": True}) as host:
        ep = await ready(host)
        names = [spec.name for spec in await host.tool_specs(episode_id=ep)]
        assert names[-4:] == ["session.start", "session.send", "session.close", "session.list"]
        started = await host.step(episode_id=ep, action=call("session.start", name="py", kind="python"))
        py_pid = started.diagnostics["session"]["pid"]
        await host.step(episode_id=ep, action=call("session.send", name="py", input="x = 41"))
        await host.step(episode_id=ep, action=call("shell.exec", command="true"))
        got = await host.step(episode_id=ep, action=call("session.send", name="py", input="x + 1"))
        assert got.observation == "42\n" and got.error is None
        wrote = await host.step(episode_id=ep, action=call("session.send", name="py",
                                                           input="open('out.txt', 'w').write('hi')"))
        assert wrote.diagnostics["changed_paths"] == ["out.txt"]
        sh = await host.step(episode_id=ep, action=call("session.start", name="sh", kind="bash"))
        sh_pid = sh.diagnostics["session"]["pid"]
        failed = await host.step(episode_id=ep, action=call("session.send", name="sh", input="false; echo $?"))
        assert failed.observation == "1\n"
        await host.step(episode_id=ep, action=call("session.close", name="sh"))
        assert not alive(sh_pid)
        assert alive(py_pid)
        await host.finalize(episode_id=ep)
        assert not alive(py_pid)
        report = (tmp_path / "run" / "episodes" / ep / "closure-report.json").read_text()
        assert '"session.send"' in report and '"CHILD_PROCESS"' in report


async def test_session_tools_are_refused_without_the_capability(tmp_path, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", provider=local_provider) as host:
        ep = await ready(host)
        assert not [s.name for s in await host.tool_specs(episode_id=ep) if s.name.startswith("session.")]
        with pytest.raises(CapabilityError, match="sessions capability"):
            await host.step(episode_id=ep, action=call("session.list"))


async def test_session_errors_are_typed(tmp_path, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", provider=local_provider,
                                       capabilities={"sessions": True}) as host:
        ep = await ready(host)

        async def error_of(tool_name: str, **args: object) -> str | None:
            result = await host.step(episode_id=ep, action=call(tool_name, **args))
            return None if result.error is None else result.error.type

        assert await error_of("session.start", name="bad name", kind="bash") == "invalid_session_name"
        assert await error_of("session.start", name="x", kind=[]) == "invalid_arguments"
        assert await error_of("session.start", name="x", kind=["/no/such/program"]) == "command_failed"
        assert await error_of("session.send", name="x", input="") == "no_such_session"
        assert await error_of("session.start", name="once", kind=["sh", "-c", "echo bye"]) is None
        ended = await host.step(episode_id=ep, action=call("session.send", name="once", input="", until="never"))
        assert ended.error is not None and ended.error.type == "session_exited"
        assert "bye" in ended.diagnostics["output"]
        assert await error_of("session.send", name="once", input="") == "session_exited"
        assert await error_of("session.close", name="once") is None
        assert await error_of("session.start", name="cat", kind=["cat"]) is None
        echoed = await host.step(episode_id=ep, action=call("session.send", name="cat", input="ping\n", until="ping"))
        assert echoed.observation == "ping"


async def test_sessions_and_taped_processes_do_not_mix(tmp_path, local_provider):
    with pytest.raises(ConfigurationError, match="record_processes"):
        create_host_environment(run_root=tmp_path / "a", provider=local_provider, capabilities={"sessions": True},
                                tape_mode="record", tape=tmp_path / "tape", record_processes=True)
    # Per episode too: an attempt whose tape serves shell.exec refuses to start a session.
    async with create_host_environment(run_root=tmp_path / "run", provider=local_provider,
                                       capabilities={"sessions": True}, tape_mode="record",
                                       tape=tmp_path / "tape2") as host:
        ep = (await host.create_episode(record_processes=True)).episode_id
        await host.reset(episode_id=ep)
        with pytest.raises(CapabilityError, match="taped"):
            await host.step(episode_id=ep, action=call("session.start", name="sh", kind="bash"))
        # The session calls are live dependencies of the closure report, never taped entries.
        plain = (await host.create_episode()).episode_id
        await host.reset(episode_id=plain)
        await host.step(episode_id=plain, action=call("session.start", name="sh", kind="bash"))
        await host.step(episode_id=plain, action=call("session.send", name="sh", input="echo hi"))
        final = await host.finalize(episode_id=plain)
        assert final.closure_report_path is not None
        report = json.loads(final.closure_report_path.read_text())
        sends = [d for d in report["dependencies"] if d["operation"] == "session.send"]
        assert sends and all(d["provider"] == "live" and d["category"] == "CHILD_PROCESS" for d in sends)
        assert report["run_level"] != "hermetic"


async def test_a_session_past_the_quota_between_steps_is_caught_and_can_still_be_closed(tmp_path, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", provider=local_provider,
                                       capabilities={"sessions": True},
                                       container={"workspace_quota_bytes": "1m"}) as host:
        ep = await ready(host)
        await host.step(episode_id=ep, action=call("session.start", name="sh", kind="bash"))
        # It answers at once, then writes past the quota after the step.
        first = await host.step(episode_id=ep, action=call(
            "session.send", name="sh", input="echo go; head -c 3000000 /dev/urandom > big.bin; echo done", until="go\n"))
        assert first.error is None
        # The next step waits for the write (the shell runs its lines in order) and sees it.
        grown = await host.step(episode_id=ep, action=call("session.send", name="sh", input="", until="done"))
        assert grown.error is not None and grown.error.type == "quota_exceeded", grown
        refused = await host.step(episode_id=ep, action=call("session.send", name="sh", input="echo more"))
        assert refused.error is not None and refused.error.type == "quota_exceeded"
        closed = await host.step(episode_id=ep, action=call("session.close", name="sh"))
        assert closed.error is None, closed
