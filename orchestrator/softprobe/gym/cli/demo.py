"""The main job: the docs' support-desk story, run for real in one episode."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softprobe.gym.episodes.factory import create_host_environment
from softprobe.gym.results import StepResult
from softprobe.gym.text import terminal_safe


def _note(account: Any) -> str:
    if not isinstance(account, dict):
        return "# Refund note\n\nAccount lookup failed; escalate to a human.\n"
    tickets = account.get("open_tickets") or []
    lines = [f"# Refund note for {account.get('id')} ({account.get('name')})", ""]
    for ticket in tickets:
        lines.append(f"- {ticket['ticket']}: {ticket['subject']} -> refund ${ticket['amount_usd']:.2f}")
    if not tickets:
        lines.append("- no open tickets; no refund due")
    return "\n".join(lines) + "\n"


async def run_demo(*, image: str, run_root: Path, out: Callable[[str], None] = print) -> None:
    """Create, reset, look up A-42, write refund-note.md, terminate, finalize; print it all."""
    run_root.mkdir(parents=True, exist_ok=True)
    seed = run_root / "seed"
    seed.mkdir(exist_ok=True)
    (seed / "README.md").write_text("Support desk: refund requests go in refund-note.md.\n")
    episode_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    async with create_host_environment(run_root=run_root, seed_root=seed, image=image) as host:
        await host.create_episode(episode_id=episode_id)
        reset = await host.reset(episode_id=episode_id)
        out(f"episode {episode_id} on {image}: reset in {reset.duration_ms:.0f} ms")
        out(f"tools: {', '.join(reset.observation['tools'])}")
        out(f"seed files: {', '.join(reset.observation['workspace_files']) or '(none)'}")
        out("")
        steps: list[StepResult] = []
        lookup = await host.step(
            episode_id=episode_id,
            action={"type": "tool", "name": "crm.get_account", "args": {"id": "A-42"}},
        )
        steps.append(lookup)
        steps.append(
            await host.step(
                episode_id=episode_id,
                action={
                    "type": "tool",
                    "name": "fs.write",
                    "args": {"path": "refund-note.md", "content": _note(lookup.observation)},
                },
            )
        )
        steps.append(
            await host.step(
                episode_id=episode_id,
                action={"type": "terminate", "output": "Refund note written for account A-42."},
            )
        )
        for step in steps:
            out(format_step(step))
        done = await host.finalize(episode_id=episode_id)
        await host.destroy(episode_id=episode_id)
    out("")
    out(f"final output: {terminal_safe(done.final_output)}")
    out(f"workspace digest: {done.workspace_digest}")
    out(f"artifacts: {done.episode_dir}")
    out(f"  trajectory: {done.trajectory_path}")
    out(f"  result:     {done.result_path}")
    out(f"  workspace:  {done.workspace_path}")


def format_step(step: StepResult) -> str:
    """Three lines for a step: the action; its status, time and changed paths; its observation, shortened."""
    action = step.action
    if action.type == "tool":
        called = f"{action.name} {json.dumps(action.args)[:60]}"
    else:
        called = "terminate"
    observation = step.observation if isinstance(step.observation, str) else json.dumps(step.observation)
    observation = terminal_safe(observation.replace("\n", " "))
    called = terminal_safe(called)
    status = f"error {terminal_safe(step.error.type)}" if step.error else "ok"
    changed = terminal_safe(", ".join(step.diagnostics.get("changed_paths", []))) or "-"
    return (
        f"step {step.index}: {called}\n"
        f"  -> {status} in {step.duration_ms:.1f} ms; changed: {changed}\n"
        f"  observation: {observation[:110]}{'...' if len(observation) > 110 else ''}"
    )
