"""A world whose tools grade the agent's work (issue 29, item 1), for the tape tests on the local
provider (tests/unit/test_tape_trust.py) and on the real engine (tests/docker/test_tape_trust_docker.py).

``grade.check`` (an overlay tool) and ``grader.check`` (a tool of an MCP server in the overlay)
read ``answer.txt`` in the workspace and say PASS for 42, else FAIL; ``facts.key`` prints the
expected answer and is declared ``reads_workspace: false``. The attack: record the tape with 42,
then replay it after the agent wrote 41. A replayed PASS would grade wrong work as correct.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bundle_fixtures import write_bundle_folder
from helpers import tool

from softprobe.gym import create_host_environment
from softprobe.gym.tapes import ClosureReport

GRADE = '''
import os
try:
    with open(os.path.join(os.environ["SOFTPROBE_WORKSPACE"], "answer.txt")) as f:
        answer = f.read().strip()
except OSError:
    answer = None
print("PASS" if answer == "42" else "FAIL")
'''

GRADER_MCP = r'''
import json, os, sys

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

def verdict():
    try:
        with open(os.path.join(os.environ["SOFTPROBE_WORKSPACE"], "answer.txt")) as f:
            return "PASS" if f.read().strip() == "42" else "FAIL"
    except OSError:
        return "FAIL"

for line in sys.stdin:
    message = json.loads(line)
    mid, method = message.get("id"), message.get("method")
    if mid is None:
        continue
    if method == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "grader"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "check", "description": "PASS when answer.txt holds 42",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    else:
        result = {"content": [{"type": "text", "text": verdict()}]}
    send({"jsonrpc": "2.0", "id": mid, "result": result})
'''

BUNDLE = """\
schema: softprobe.environment-bundle/v1
name: grading
image: {image}
overlay:
  files: tools
  tools:
    - name: grade.check
      description: PASS when answer.txt holds 42
      command: [{python}, "${{SOFTPROBE_OVERLAY}}/grade.py"]
    - name: facts.key
      description: the expected answer (never looks at the workspace)
      command: [{python}, -c, "print(42)"]
      reads_workspace: false
  mcp_servers:
    - name: grader
      command: [{python}, "${{SOFTPROBE_OVERLAY}}/grader_mcp.py"]
      startup_timeout_s: 20
episode: {{tool_timeout_s: 20}}
"""

GRADES = [tool("grade.check"), tool("grader.check"), tool("facts.key")]
RIGHT = [tool("fs.write", path="answer.txt", content="42\n"), *GRADES]
# The agent's own command writes the wrong answer before the grading calls.
WRONG = [tool("shell.exec", command="echo 41 > answer.txt"), *GRADES]


def write_grading_bundle(folder: Path, *, image: str, python: str) -> Path:
    """The grading world as a bundle folder."""
    return write_bundle_folder(folder, BUNDLE.format(image=image, python=json.dumps(python)),
                               {"tools/grade.py": GRADE, "tools/grader_mcp.py": GRADER_MCP})


#: The ids of the hosts :func:`run` made (a Docker test checks each left nothing behind).
HOST_IDS: list[str] = []


async def run(run_root: Path, bundle: Path, actions: list[dict[str, Any]], **options: Any) -> tuple[list[Any], Any]:
    """Every step of one episode of ``actions`` and its finalize result."""
    async with create_host_environment(run_root=run_root, bundle=bundle, **options) as host:
        HOST_IDS.append(host.host_id)
        await host.create_episode(episode_id="ep")
        await host.reset(episode_id="ep")
        steps = [await host.step(episode_id="ep", action=action) for action in actions]
        return steps, await host.finalize(episode_id="ep")


async def grading_attack(tmp_path: Path, bundle: Path, **options: Any) -> None:
    """Record with the right answer; run the wrong one live (FAIL: the attack is real), then
    replay it: each grading call that reads the workspace misses, naming the workspace digest,
    never a PASS; the tool declared ``reads_workspace: false`` is served. Replaying the right
    answer is still served whole."""
    recorded, final = await run(tmp_path / "rec", bundle, RIGHT, tape_mode="record", **options)
    assert [s.observation for s in recorded[1:]] == ["PASS\n", "PASS", "42\n"], recorded
    tape = final.episode_dir / "tape"
    live, _ = await run(tmp_path / "live", bundle, WRONG, **options)
    assert [s.observation for s in live[1:]] == ["FAIL\n", "FAIL", "42\n"], live

    replayed, final2 = await run(tmp_path / "rep", bundle, WRONG, tape_mode="replay", tape=tape, **options)
    wrote = replayed[0]
    assert wrote.error is None and wrote.diagnostics["changed_paths"] == ["answer.txt"]
    digest = wrote.diagnostics["workspace_digest"]  # the workspace with 41 in it
    for step, category in zip(replayed[1:3], ("TOOL_CALL", "MCP_CALL"), strict=True):
        assert step.error is not None and step.error.type == "replay_miss", step
        assert step.observation is None and not step.diagnostics["replayed"]
        miss = step.diagnostics["replay_miss"]
        assert miss["category"] == category and json.loads(miss["canonical_request"])["workspace_digest"] == digest
        assert digest in step.error.message
    assert replayed[3].error is None and replayed[3].observation == "42\n" and replayed[3].diagnostics["replayed"]
    assert "workspace_digest" not in json.loads(recorded_request(tape, "facts.key"))
    report = ClosureReport.model_validate_json(final2.closure_report_path.read_text())
    graded = {d.operation: d.provider for d in report.dependencies if d.category in ("TOOL_CALL", "MCP_CALL")}
    assert graded == {"grade.check": "unsupported", "grader.check": "unsupported", "facts.key": "recorded"}
    assert report.run_level == "live"

    again, final3 = await run(tmp_path / "again", bundle, RIGHT, tape_mode="replay", tape=tape, **options)
    assert [s.observation for s in again[1:]] == ["PASS\n", "PASS", "42\n"]
    assert all(s.diagnostics["replayed"] for s in again[1:])
    assert ClosureReport.model_validate_json(final3.closure_report_path.read_text()).run_level == "recorded_external"


def recorded_request(tape: Path, operation: str) -> str:
    """The canonical request the tape recorded for ``operation`` (its first entry)."""
    from softprobe.gym.tapes import TapeFolder

    folder = TapeFolder(tape)
    entry = next(e for e in folder.entries() if e.operation == operation)
    return folder.get_payload(entry.request.payload_ref).decode("utf-8")
