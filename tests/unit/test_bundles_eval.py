"""Eval suites with ``bundle:``: tasks grouped per bundle on hosts of their own, the bundle's
assertions graded with the task's, its digest in every record (local provider)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bundle_fixtures import write_bundle

from softprobe.gym.bundles import load_bundle, resolve_bundle
from softprobe.gym.evals.runner import grade_records, preflight_suite, run_suite
from softprobe.gym.evals.suite import SuiteError, load_suite
from softprobe.gym.providers.local import LocalProvider

BUNDLE = """\
schema: softprobe.environment-bundle/v1
name: eval-world
image: softprobe/base:latest
seed: seed
capabilities: {environment_checkpoint: false}
episode: {max_steps: 5}
assertions:
  - {type: contains, value: world}
"""

SUITE = """\
name: bundled
image: softprobe/base:latest
concurrency: 2
tasks:
  - id: on-bundle
    bundle: worlds/one
    actions:
      - {type: tool, name: fs.read, args: {path: README.md}}
      - {type: terminate, output: "hello world"}
  - id: on-bundle-missing-word
    bundle: worlds/one
    actions:
      - {type: terminate, output: "hello"}
  - id: plain
    actions:
      - {type: terminate, output: "plain"}
    assert: [{type: contains, value: plain}]
"""


async def test_tasks_run_on_their_bundle_and_are_graded_with_its_assertions(
    tmp_path: Path, local_provider: LocalProvider
) -> None:
    write_bundle(tmp_path / "suite" / "worlds" / "one", BUNDLE)
    (tmp_path / "suite" / "suite.yaml").write_text(SUITE)
    suite = load_suite(tmp_path / "suite" / "suite.yaml")
    assert suite.bundle_of(suite.tasks[0]) == (tmp_path / "suite" / "worlds" / "one").resolve()
    digest = (await resolve_bundle(load_bundle(tmp_path / "suite" / "worlds" / "one"), local_provider)).digest
    outcome = await run_suite(suite, tmp_path / "out", provider=local_provider, backend="native")
    results = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert results["on-bundle"]["passed"] and results["on-bundle"]["bundle_digest"] == digest
    assert not results["on-bundle-missing-word"]["passed"]  # the bundle's assertion failed it
    assert results["plain"]["passed"] and results["plain"]["bundle_digest"] is None
    assert outcome.summary["bundle_digests"] == [digest]
    record = json.loads((tmp_path / "out" / "tasks" / "on-bundle.json").read_text())
    assert record["bundle_digest"] == digest
    episode_result = json.loads((tmp_path / "out" / "runs" / "episodes" / "on-bundle" / "result.json").read_text())
    assert episode_result["bundle_digest"] == digest
    trajectory = (tmp_path / "out" / "runs" / "episodes" / "on-bundle" / "trajectory.jsonl").read_text()
    assert "refunds go in refund-note.md" in trajectory  # the bundle's seed
    assert list((local_provider.root / "sandboxes").glob("*")) == []
    assert record["bundle_assertions"] == [{"type": "contains", "value": "world"}]
    # The bundle folder edited after the run (or before a --resume): grading keeps the
    # assertions the tasks ran under, not the folder's new ones.
    bundle_yaml = tmp_path / "suite" / "worlds" / "one" / "bundle.yaml"
    bundle_yaml.write_text(bundle_yaml.read_text().replace("value: world", "value: nowhere"))
    regraded = await grade_records(suite, tmp_path / "out", suite.tasks, backend="native", wall_s=1.0,
                                   interrupted=False)
    assert {r.id: r.passed for r in regraded.results} == {"on-bundle": True, "on-bundle-missing-word": False,
                                                          "plain": True}
    # A record written without them: from the store, by its digest.
    del record["bundle_assertions"]
    (tmp_path / "out" / "tasks" / "on-bundle.json").write_text(json.dumps(record))
    regraded = await grade_records(suite, tmp_path / "out", suite.tasks, backend="native", wall_s=1.0,
                                   interrupted=False)
    assert next(r for r in regraded.results if r.id == "on-bundle").passed


def test_suite_limits_every_task_s_bundle_replaces_are_refused_at_their_line(tmp_path: Path) -> None:
    write_bundle(tmp_path / "suite" / "worlds" / "one", BUNDLE)
    dead = SUITE.replace("concurrency: 2\n", "concurrency: 2\nlimits: {max_steps: 9, tool_timeout_s: 5}\n")
    only_bundles = dead.split("  - id: plain")[0]
    (tmp_path / "suite" / "suite.yaml").write_text(only_bundles)
    with pytest.raises(SuiteError) as caught:
        preflight_suite(load_suite(tmp_path / "suite" / "suite.yaml"), check_image=False)
    message = str(caught.value)
    for name in ("max_steps", "tool_timeout_s"):
        assert f"suite.yaml:4: limits.{name}: every task runs on a bundle that sets its own (" in message
    assert str((tmp_path / "suite" / "worlds" / "one").resolve()) in message
    # With a task that runs without a bundle, the limits limit it: no problem.
    (tmp_path / "suite" / "suite.yaml").write_text(dead)
    preflight_suite(load_suite(tmp_path / "suite" / "suite.yaml"), check_image=False)
    # max_steps of a bundle that sets none still holds: only tool_timeout_s is dead.
    write_bundle(tmp_path / "suite2" / "worlds" / "one", BUNDLE.replace("episode: {max_steps: 5}\n", ""))
    (tmp_path / "suite2" / "suite.yaml").write_text(only_bundles)
    with pytest.raises(SuiteError) as caught:
        preflight_suite(load_suite(tmp_path / "suite2" / "suite.yaml"), check_image=False)
    assert "limits.tool_timeout_s" in str(caught.value) and "limits.max_steps" not in str(caught.value)


def test_the_billing_example_suite_passes_the_preflight() -> None:
    example = Path(__file__).resolve().parents[2] / "images" / "support-desk-billing" / "examples" / "suite.yaml"
    preflight_suite(load_suite(example), check_image=False)


def test_an_invalid_bundle_is_reported_at_the_suite_line_naming_it(tmp_path: Path) -> None:
    write_bundle(tmp_path / "suite" / "worlds" / "one", BUNDLE.replace("max_steps: 5", "max_steps: five"))
    (tmp_path / "suite" / "suite.yaml").write_text(SUITE)
    suite = load_suite(tmp_path / "suite" / "suite.yaml")
    with pytest.raises(SuiteError) as caught:
        preflight_suite(suite, check_image=False)
    message = str(caught.value)
    assert f"{tmp_path / 'suite' / 'suite.yaml'}:6: tasks.0.bundle: the bundle" in message
    assert "bundle.yaml:6:" in message and "episode.max_steps" in message
