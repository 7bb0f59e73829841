"""Persistent sessions (issue 34, item 1) on the real engine, under runc and gVisor: what a
session keeps, and the attacker's tests of the sweep rule "no process outlives its step unless it
belongs to one of the episode's declared sessions"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import NullSubject, docs_section, processes, python_blocks, ready, tool

from softprobe.gym import create_host_environment
from softprobe.gym.errors import CapabilityError
from softprobe.gym.shim.agent_shim.sessions import MAX_SESSIONS, SESSION_BUFFER_BYTES, SESSION_GID_BASE

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("episode_runtime")]  # runc and runsc

SESSIONS = {"sessions": True}
#: Sessions with checkpoints (and their subject: ``helpers.NullSubject``), for
#: ``@pytest.mark.parametrize("episode", [CHECKPOINTS], indirect=True)``.
CHECKPOINTS = {"environment_checkpoint": True, "subject_state_import": True, "sessions": True}

# Started in the background from wherever: a plain child, one in a session of its own, and one
# whose parent exits at once (a double fork), each sleeping under a number naming its origin.
ESCAPES = "sleep {n}1 & setsid sleep {n}2 & (sleep {n}3 &) ; setsid sh -c 'sleep {n}4 &' ; echo started"
# A process that keeps changing its pid (each generation forks the next and exits), to outrun a sweep.
HOPPER = "sh -c 'hop() { sleep 0.01; sh -c \"sleep {n}5\" & exit 0; }; while :; do (hop) ; done' >/dev/null 2>&1 &"


def session(tool_name: str, **args: object) -> dict:
    return {"type": "tool", "name": tool_name, "args": args}


def start(name: str, kind: object) -> dict:
    return session("session.start", name=name, kind=kind)


def send(name: str, text: str, **extra: object) -> dict:
    return session("session.send", name=name, input=text, **extra)


@pytest.fixture
async def episode(request: pytest.FixtureRequest, tmp_path: Path,
                  episode_runtime: str) -> AsyncIterator[tuple[Any, str]]:
    """(host, id of its ready episode "ep-1"): a host with the capabilities the test parametrizes
    ``episode`` with (indirectly; default ``SESSIONS``), under the runtime of ``episode_runtime``."""
    capabilities = getattr(request, "param", SESSIONS)
    subject = NullSubject() if capabilities.get("subject_state_import") else None
    async with create_host_environment(run_root=tmp_path, capabilities=capabilities, subject=subject) as host:
        yield host, await ready(host)


async def ok(host, episode_id: str, action: dict) -> object:  # type: ignore[no-untyped-def]
    result = await host.step(episode_id=episode_id, action=action)
    assert result.error is None, result
    return result.observation


async def test_a_session_keeps_its_variables_and_processes_while_exec_processes_are_swept(episode):
    host, ep = episode
    await ok(host, ep, start("py", "python"))
    await ok(host, ep, start("sh", "bash"))
    assert await ok(host, ep, send("py", "data = list(range(5))\nsum(data)")) == "10\n"
    assert await ok(host, ep, send("sh", "cd /tmp && X=41")) == ""
    # Everything a session starts is the session's: it outlives the step.
    assert await ok(host, ep, send("sh", ESCAPES.format(n=100))) == "started\n"
    # And what shell.exec starts is swept, however it hides.
    assert (await ok(host, ep, tool("shell.exec", command=ESCAPES.format(n=200)))).strip() == "started"
    await ok(host, ep, tool("shell.exec", command=HOPPER.replace("{n}", "300")))
    listing = await processes(host, ep)
    for n in (1001, 1002, 1003, 1004):
        assert f"sleep {n}" in listing, listing
    for n in (2001, 2002, 2003, 2004, 3005):
        assert f"sleep {n}" not in listing, listing
    assert await ok(host, ep, send("py", "data[-1]")) == "4\n"
    assert await ok(host, ep, send("sh", "echo $((X + 1)) $(pwd)")) == "42 /tmp\n"
    listed = await ok(host, ep, session("session.list"))
    assert [s["name"] for s in listed] == ["py", "sh"] and all(s["running"] for s in listed)
    # Closing a session kills everything it started, setsid and double forks included.
    await ok(host, ep, session("session.close", name="sh"))
    listing = await processes(host, ep)
    assert "sleep 100" not in listing, listing
    assert await ok(host, ep, send("py", "data[0]")) == "0\n"


async def test_a_hopper_inside_a_session_is_the_sessions_and_dies_with_it(episode):
    host, ep = episode
    await ok(host, ep, start("sh", "bash"))
    await ok(host, ep, send("sh", HOPPER.replace("{n}", "400")))
    await ok(host, ep, tool("shell.exec", command="true"))
    await ok(host, ep, session("session.close", name="sh"))
    listing = await processes(host, ep)
    assert "sleep 4005" not in listing and "hop" not in listing, listing


async def test_no_process_can_join_or_leave_a_session_group(episode):
    host, ep = episode
    await ok(host, ep, start("py", "python"))
    marker = SESSION_GID_BASE
    probe = (f"import os\ntry:\n    os.setgroups([{marker}]); print('joined')\n"
             "except OSError as err:\n    print('refused', err.errno)")
    joined = await ok(host, ep, tool("shell.exec", command=f"python3 -c \"{probe}\""))
    assert str(joined).startswith("refused"), joined
    # The session holds its marker and cannot drop it either.
    groups = await ok(host, ep, send("py", "import os\nos.getgroups()"))
    assert groups == f"[{marker}]\n"
    dropped = await ok(host, ep, send("py", "try:\n    os.setgroups([])\nexcept OSError as e:\n    print(e.errno)"))
    assert dropped == "1\n"  # EPERM
    # Its uid is the agent's: the same files, the same rights.
    hello = host.runtime_of(episode_id=ep).hello
    assert await ok(host, ep, send("py", "os.getuid(), os.getgid()")) == f"({hello.uid}, {hello.uid})\n"


async def test_a_session_cannot_reach_the_shim_or_another_episode(episode):
    host, a = episode
    b = await ready(host, "b")
    await ok(host, b, start("py", "python"))
    await ok(host, b, send("py", "kept = 'b'"))
    await ok(host, a, start("py", "python"))
    probe = (
        "import os, signal\nout = []\n"
        "for what, attempt in [('kill', lambda: os.kill(1, signal.SIGTERM)),\n"
        "                      ('mem', lambda: open('/proc/1/mem', 'rb').read(1)),\n"
        "                      ('fd', lambda: open('/proc/1/fd/1', 'wb'))]:\n"
        "    try:\n        attempt(); out.append(what + ':ok')\n"
        "    except OSError as err:\n        out.append(what + ':' + type(err).__name__)\n"
        "print(' '.join(out))"
    )
    reached = await ok(host, a, send("py", probe))
    assert "ok" not in str(reached), reached
    # Killing everything it may kill ends episode a's own session only (its pid namespace).
    await ok(host, a, send("py", "os.kill(-1, signal.SIGKILL)", timeout_s=10))  # Linux spares the caller
    assert await ok(host, b, send("py", "kept")) == "'b'\n"
    assert await ok(host, a, tool("shell.exec", command="echo alive")) == "alive\n"


async def test_session_output_cannot_break_the_framing_or_grow_the_shim(episode):
    host, ep = episode
    flood = ["sh", "-c", "head -c 50000000 /dev/zero | tr '\\0' a; printf '\\377\\n{\"id\": 1, \"ok\": true}\\nEND\\n'; exec sleep 1000"]  # alive: a send reads it
    await ok(host, ep, start("flood", flood))
    await ok(host, ep, tool("shell.exec", command="true"))  # it writes while nobody reads
    result = await host.step(episode_id=ep, action=send("flood", "", until="END"))
    assert result.error is None, result
    assert result.diagnostics["output_dropped_bytes"] >= 50_000_000 - SESSION_BUFFER_BYTES
    assert '{"id": 1, "ok": true}' in result.observation and result.observation.endswith("END")
    assert await ok(host, ep, tool("shell.exec", command="echo fine")) == "fine\n"


async def test_session_names_and_limits_are_typed_errors(episode):
    host, ep = episode
    for bad in ("", "a b", "../x", "-x", "x" * 65):
        result = await host.step(episode_id=ep, action=start(bad, "bash"))
        assert result.error is not None and result.error.type == "invalid_session_name", result
    for i in range(MAX_SESSIONS):
        await ok(host, ep, start(f"s{i}", ["sleep", "1000"]))
    over = await host.step(episode_id=ep, action=start("one-more", "bash"))
    assert over.error is not None and over.error.type == "too_many_sessions", over
    again = await host.step(episode_id=ep, action=start("s0", "bash"))
    assert again.error is not None and again.error.type == "session_exists"
    missing = await host.step(episode_id=ep, action=send("nope", "x"))
    assert missing.error is not None and missing.error.type == "no_such_session"
    slow = await host.step(episode_id=ep, action=send("s1", "", until="never", timeout_s=0.2))
    assert slow.error is not None and slow.error.type == "timeout"


@pytest.mark.parametrize("episode", [{}], indirect=True, ids=["no-sessions"])
async def test_sessions_are_refused_without_the_capability(episode):
    host, ep = episode
    names = [spec.name for spec in await host.tool_specs(episode_id=ep)]
    assert not [n for n in names if n.startswith("session.")]
    with pytest.raises(CapabilityError, match="sessions capability"):
        await host.step(episode_id=ep, action=start("sh", "bash"))


async def test_what_a_session_writes_between_steps_is_in_the_next_steps_digest(episode):
    host, ep = episode
    await ok(host, ep, start("sh", "bash"))
    first = await host.step(episode_id=ep, action=send("sh", "echo ready; sleep 0.3; echo late > late.txt",
                                                       until="ready\n"))
    assert first.error is None and "late.txt" not in first.diagnostics["changed_paths"]
    second = await host.step(episode_id=ep, action=send("sh", "cat late.txt"))
    assert second.observation == "late\n"
    assert "late.txt" in second.diagnostics["changed_paths"], second.diagnostics
    # What the session wrote is the agent's like anything else: fs.write may change it.
    await ok(host, ep, tool("fs.write", path="late.txt", content="mine"))
    last = await host.step(episode_id=ep, action=send("sh", "cat late.txt"))
    assert last.observation == "mine"
    # Finalize closes the sessions first, then walks the workspace: the digest the last step gave.
    final = await host.finalize(episode_id=ep)
    assert final.workspace_digest == last.diagnostics["workspace_digest"]


def test_the_docs_sessions_example_runs(capsys: pytest.CaptureFixture[str], episode_runtime: str) -> None:
    (block,) = python_blocks(docs_section("tools.md", "Sessions"))
    exec(compile(block, "docs/tools.md (Sessions)", "exec"), {"__name__": "docs_sessions"})
    assert capsys.readouterr().out.split() == ["3", "hi", "/tmp"]


@pytest.mark.parametrize("episode", [CHECKPOINTS], indirect=True, ids=["checkpoints"])
async def test_a_session_writing_all_the_time_cannot_make_a_checkpoint_lie(episode):
    host, ep = episode
    await ok(host, ep, start("sh", "bash"))
    await ok(host, ep, send("sh", "(n=0; while :; do n=$((n+1)); echo $n > t.tmp; mv t.tmp tick.txt; done) &"))
    for _ in range(3):
        # Stopped from the checkpoint's walk to the next request: the commit is the world walked,
        # so the child's full walk gives the checkpoint's digest (else ForkVerificationError).
        record = await host.checkpoint(episode_id=ep)
        assert record.sessions_not_carried == ["sh"]
        child = await host.fork(episode_id=ep, path="checkpoint_import", checkpoint_id=record.checkpoint_id)
        assert child.lineage.workspace_digest == record.workspace_digest
        assert await ok(host, child.episode_id, session("session.list")) == []
        await host.destroy(episode_id=child.episode_id)
    # The writer went on in the parent after each checkpoint.
    first = await ok(host, ep, tool("fs.read", path="tick.txt"))
    await ok(host, ep, send("sh", "sleep 0.05"))
    assert int(str(await ok(host, ep, tool("fs.read", path="tick.txt")))) > int(str(first))


#: A process whose main thread ends alone (the raw exit syscall, not exit_group): /proc shows the
#: leader as a zombie while its writer thread goes on (found by the attacker's pass).
ZOMBIE_LEADER = r'''python3 -c "
import ctypes, threading, os, time
def write():
    n = 0
    while True:
        n += 1
        with open('NAME.tmp', 'w') as f: f.write(str(n))
        os.rename('NAME.tmp', 'NAME.txt')
threading.Thread(target=write).start()
time.sleep(0.2)
ctypes.CDLL(None).syscall(60, 0)
" >/dev/null 2>&1 &
sleep 0.5'''


async def _still(host, ep: str, name: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``name``.txt stopped changing (its writer is gone)."""
    check = f"a=$(cat {name}.txt); sleep 0.3; b=$(cat {name}.txt); [ \"$a\" = \"$b\" ] && echo still || echo moving"
    return str(await ok(host, ep, tool("shell.exec", command=check))).strip() == "still"


@pytest.mark.parametrize("episode", [CHECKPOINTS], indirect=True, ids=["checkpoints"])
async def test_a_process_whose_main_thread_ended_cannot_outlive_a_close_a_step_or_a_checkpoint(episode):
    host, ep = episode
    await ok(host, ep, start("sh", "bash"))
    # Inside a session: frozen while the shim reads as root, so a checkpoint's digest is the
    # child's (was ForkVerificationError under both runtimes).
    await ok(host, ep, send("sh", ZOMBIE_LEADER.replace("NAME", "sess")))
    for _ in range(2):
        record = await host.checkpoint(episode_id=ep)
        child = await host.fork(episode_id=ep, path="checkpoint_import", checkpoint_id=record.checkpoint_id)
        assert child.lineage.workspace_digest == record.workspace_digest
        await host.destroy(episode_id=child.episode_id)
    # Outside a session, with one open: swept at the step's end (the shim gave up before).
    await ok(host, ep, tool("shell.exec", command="cat > z.sh <<'EOF'\n" + ZOMBIE_LEADER.replace("NAME", "exec")
                            + "\nEOF\nsetsid sh z.sh"))
    assert await _still(host, ep, "exec")
    # Closing the session kills it (it wrote on, unfrozen, before).
    await ok(host, ep, session("session.close", name="sh"))
    assert await _still(host, ep, "sess")
