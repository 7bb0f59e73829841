"""A whole eval suite on the local provider: run_suite takes any provider, so a suite can be
tried without an engine (the example suite's tools come from the support-desk manifest)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import EXAMPLES

from softprobe.gym.evals.runner import run_suite
from softprobe.gym.evals.suite import load_suite
from softprobe.gym.providers.local import LocalProvider


async def test_the_example_suite_runs_on_the_local_provider(tmp_path: Path, desk_provider: LocalProvider) -> None:
    suite = load_suite(EXAMPLES / "suite.yaml")
    outcome = await run_suite(suite, tmp_path / "out", provider=desk_provider, backend="native")
    results = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert [i for i, r in results.items() if not r["passed"]] == ["wrong-account-fails"]
    assert results["refund-a42"]["reward_total"] == 5.0
    assert Path(results["refund-a42"]["artifacts"], "workspace", "refund-note.md").exists()
    assert outcome.summary["passed"] == 4
    assert list((desk_provider.root / "sandboxes").glob("*")) == []  # every task's sandbox went
