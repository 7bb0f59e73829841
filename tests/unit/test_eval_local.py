"""A whole eval suite on the local provider: run_suite takes any provider, so a suite can be
tried without an engine (the example suite's tools come from the support-desk manifest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import EXAMPLES

from softprobe.gym.evals.runner import run_suite
from softprobe.gym.evals.suite import SuiteError, load_suite
from softprobe.gym.providers.local import LocalProvider


async def test_the_example_suite_runs_on_the_local_provider(tmp_path: Path, desk_provider: LocalProvider) -> None:
    suite = load_suite(EXAMPLES / "suite.yaml")
    # Its billing task needs a service container, which the local provider refuses, by name:
    with pytest.raises(SuiteError, match=r"suite.yaml:\d+: tasks.5.bundle: .* cannot run here: the local "
                                          r"provider runs no services"):
        await run_suite(suite, tmp_path / "refused", provider=desk_provider, backend="native")
    assert list((desk_provider.root / "sandboxes").glob("*")) == []
    suite.tasks = [task for task in suite.tasks if suite.bundle_of(task) is None]
    outcome = await run_suite(suite, tmp_path / "out", provider=desk_provider, backend="native")
    results = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert [i for i, r in results.items() if not r["passed"]] == ["wrong-account-fails"]
    assert results["refund-a42"]["reward_total"] == 5.0
    assert Path(results["refund-a42"]["artifacts"], "workspace", "refund-note.md").exists()
    assert outcome.summary["passed"] == 4
    assert list((desk_provider.root / "sandboxes").glob("*")) == []  # every task's sandbox went
