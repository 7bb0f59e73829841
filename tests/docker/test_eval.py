"""`softprobe-gym eval` on the engine: a suite end to end, resume, interruption, preflight, and the
report in a browser. Suite validation and the summary are tested in tests/unit/test_eval_suite.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import EXAMPLES, SCREENSHOT_SIZE, owned_by_process, png_size

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def run_eval(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "eval", *args],
                          capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def example_run(tmp_path_factory, docker_engine) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("eval")
    return out, run_eval(str(EXAMPLES / "suite.yaml"), "--out", str(out))


@pytest.mark.docker
def test_the_example_suite_runs_end_to_end(example_run):
    out, done = example_run
    assert done.returncode == 1, done.stderr  # one task fails on purpose
    assert "5/6 tasks passed (1 failed" in done.stdout
    results = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(results) == {"refund-a42", "no-refund-a7", "list-accounts", "note-from-seed", "wrong-account-fails",
                            "billing-refund-inv1001"}
    # The billing task ran in its bundle's world; the others in the suite's image.
    assert results["billing-refund-inv1001"]["bundle_digest"].startswith("sha256:")
    assert results["refund-a42"].get("bundle_digest") is None
    assert [i for i, r in results.items() if not r["passed"]] == ["wrong-account-fails"]
    assert results["wrong-account-fails"]["reason"] == 'Expected output to contain "A-42"'
    refund = results["refund-a42"]
    assert refund["steps"] == 3 and refund["reward_total"] == 5.0
    assert [r["components"] for r in refund["rewards"]][1] == {"note_written": 1.0, "no_error": 1.0}
    assert refund["trajectory_digest"].startswith("sha256:") and len(refund["source_trace_id"]) == 32
    assert Path(refund["artifacts"], "workspace", "refund-note.md").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["planned"], summary["passed"], summary["failed"]) == (6, 5, 1)
    assert summary["errored"] == 0 and summary["status_counts"]["succeeded"] == 6
    for task in results:  # both grading artifacts per task, named in results.jsonl
        assert set(results[task]["grading"]) == {"framework_result", "native_bundle"}
        envelope = json.loads((out / results[task]["grading"]["framework_result"]).read_text())
        assert envelope["schema"] == "softprobe.framework-result/v1" and envelope["attempt_label"] == task
        assert envelope["trace_links"][0]["source_trace_id"] == results[task]["source_trace_id"]
    assert (out / "report.html").stat().st_size > 5000


@pytest.mark.docker
def test_resume_skips_finished_tasks(example_run, tmp_path):
    out, _ = example_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "tasks" / "list-accounts.json").unlink()
    again = run_eval(str(EXAMPLES / "suite.yaml"), "--out", str(copy), "--resume")
    assert again.returncode == 1
    assert "resuming: 5 tasks already finished" in again.stderr
    assert "list-accounts: finished" in again.stderr and "refund-a42: finished" not in again.stderr
    assert len((copy / "results.jsonl").read_text().splitlines()) == 6


@pytest.mark.docker
def test_exit_codes_all_pass_and_usage_error(tmp_path, docker_engine):
    suite = tmp_path / "ok.yaml"
    suite.write_text("tasks:\n  - id: one\n    actions:\n      - {type: terminate, output: done}\n    assert:\n      - {type: equals, value: done}\n")
    assert run_eval(str(suite), "--out", str(tmp_path / "o")).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks:\n  - id: one\n    actions: []\n    policy: x:y\n")
    done = run_eval(str(bad), "--out", str(tmp_path / "b"))
    assert done.returncode == 2 and "bad.yaml:2: tasks.0" in done.stderr


@pytest.mark.docker
def test_an_interrupted_run_removes_its_containers_and_writes_partial_results(tmp_path, docker_engine):
    suite = tmp_path / "slow.yaml"
    tasks = "".join(
        f"  - id: slow-{i}\n    actions:\n      - {{type: tool, name: shell.exec, args: {{command: 'sleep {60 if i else 0}'}}}}\n"
        f"      - {{type: terminate, output: done}}\n"
        for i in range(4)
    )
    suite.write_text(f"concurrency: 2\nlimits: {{tool_timeout_s: 120}}\ntasks:\n{tasks}")
    out = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-m", "softprobe.gym.cli", "eval", str(suite), "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def running() -> list[str]:
        return owned_by_process(child.pid)[0]

    deadline = time.monotonic() + 120
    while not (out / "tasks" / "slow-0.json").exists() or len(running()) < 2:  # bounded poll on state
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, stderr
    assert running() == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["ran"] == 1 and summary["planned"] == 4





@pytest.mark.docker
def test_the_report_in_a_real_headless_browser(example_run, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium (bash .ci/setup test installs it)", pytrace=False)
        pytest.skip("chromium is not installed (apt-get install chromium)")
    out, _ = example_run
    url = (out / "report.html").as_uri()
    profile = tmp_path / "profile"
    dump = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", url], capture_output=True, text=True, timeout=120)
    dom = dump.stdout
    assert 'id="tasks" data-ready="1"' in dom  # our script ran under the page's CSP
    console = [line for line in dump.stderr.splitlines() if "CONSOLE" in line or "Refused to" in line]
    assert console == [], console
    assert "<title>support-desk examples" in dom and "pwned" not in dom.split("<body")[0]
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom  # agent text stays text
    for task in ("refund-a42", "no-refund-a7", "list-accounts", "note-from-seed", "wrong-account-fails",
                 "billing-refund-inv1001"):
        assert task in dom
    assert "Expected output to contain \"A-42\"" in dom or "Expected output to contain &quot;A-42&quot;" in dom
    # The plots, measured by the page's own script as the browser laid them out: the score
    # histogram (6 graded tasks in 10 bins), a reward-per-step sparkline per task in the table
    # (one point per step), and the components chart of the 4 tasks with checks.
    assert 'data-plots="11/11"' in dom
    (hist,) = re.findall(r'<svg class="plot" data-plot="histogram"[^>]*data-rendered="(\d+)x(\d+)"', dom)
    assert int(hist[0]) >= 360 and int(hist[1]) >= 150 and dom.count('class="bar"') == 10
    sparklines = re.findall(r'class="reward">([\d.]+) <svg class="plot" data-plot="sparkline"[^>]*'
                            r'data-rendered="[1-9]\d*x[1-9]\d*"><line[^>]*></line><polyline[^>]*points="([^"]*)"', dom)
    assert len(sparklines) == 6 and all(len(points.split()) in (2, 3) for _, points in sparklines)
    assert ("5", 3) in [(total, len(points.split())) for total, points in sparklines]  # refund-a42
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                    "--window-size={},{}".format(*SCREENSHOT_SIZE), f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000 and png_size(shot) == SCREENSHOT_SIZE
    if os.environ.get("SOFTPROBE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["SOFTPROBE_SCREENSHOT"])






@pytest.mark.docker
def test_preflight_refuses_a_suite_that_cannot_run_before_writing_anything(tmp_path, docker_engine):
    suite = tmp_path / "broken.yaml"
    suite.write_text(
        "name: broken\n"
        "image: softprobe/absent:never\n"
        "seed: ./no-such-folder\n"
        "tasks:\n"
        "  - id: a\n"
        "    seed: ./also-missing\n"
        "    actions: [{type: terminate}]\n"
        "  - id: b\n"
        "    policy: no_such_policy_module:act\n"
    )
    out = tmp_path / "out"
    done = run_eval(str(suite), "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert f"{suite}:2: image: 'softprobe/absent:never' is not on this Docker engine" in done.stderr
    assert f"{suite}:3: seed: the seed folder {tmp_path / 'no-such-folder'} does not exist" in done.stderr
    assert f"{suite}:6: tasks.0.seed: the seed folder {tmp_path / 'also-missing'} does not exist" in done.stderr
    assert f"{suite}:9: tasks.1.policy:" in done.stderr and "no_such_policy_module" in done.stderr
    assert "seed_root" not in done.stderr
    assert not out.exists()  # not even empty runs/ or tasks/ folders
