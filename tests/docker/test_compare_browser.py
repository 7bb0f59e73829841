"""`softprobe-gym compare` on two real eval runs of the example suite (the second with one
passing task changed to fail), its exit code, and its page in headless Chromium: the
regressions section names the task, the plots are laid out at a non-zero size, nothing is
refused by the page's CSP. The compare logic itself is tested in tests/unit/test_compare.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLES, SCREENSHOT_SIZE, png_size

pytestmark = pytest.mark.docker

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ANSWER = '{type: terminate, output: "Refunded $120 to account A-42 (ticket T-1001)."}'


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softprobe.gym.cli", *args], capture_output=True, text=True,
                          timeout=600)


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium (bash .ci/setup test installs it)", pytrace=False)
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, docker_engine) -> tuple[Path, Path]:
    """The example suite as it is (A) and with refund-a42's answer no longer naming A-42 (B)."""
    root = tmp_path_factory.mktemp("compare")
    changed = root / "suite-b"
    changed.mkdir()
    text = (EXAMPLES / "suite.yaml").read_text()
    assert text.count(ANSWER) == 1, "the example suite changed: update ANSWER"
    text = text.replace("bundle: ../../support-desk-billing", f"bundle: {EXAMPLES.parents[1] / 'support-desk-billing'}")
    (changed / "suite.yaml").write_text(text.replace(ANSWER, '{type: terminate, output: "Refunded $120 (T-1001)."}'))
    shutil.copyfile(EXAMPLES / "policies.py", changed / "policies.py")
    for suite, out in ((EXAMPLES / "suite.yaml", root / "a"), (changed / "suite.yaml", root / "b")):
        done = cli("eval", str(suite), "--out", str(out))
        assert done.returncode == 1, done.stderr  # wrong-account-fails fails on purpose in both
    return root / "a", root / "b"


def test_compare_flags_the_regression_and_exits_1(two_runs, tmp_path):
    a, b = two_runs
    done = cli("compare", str(a), str(b), "--out", str(tmp_path))
    assert done.returncode == 1, done.stderr
    rows = done.stdout.splitlines()
    assert re.match(r"refund-a42 +pass +1\.000 +FAIL +0\.500 +regressed \(-0\.500\)", rows[2]), rows[2]
    assert "refund-a42: step 3, action differs" in done.stdout
    assert "pass rate 83% -> 67% (-17 pts) over 6 paired tasks" in done.stdout
    assert "gate FAILED: 1 of 6 tasks (16.7%) went from pass to fail, error or missing" in done.stdout
    assert cli("compare", str(a), str(a)).returncode == 0
    assert cli("compare", str(a), str(b), "--threshold", "0.2").returncode == 0  # 16.7% is not more than 20%
    assert cli("compare", str(b), str(a)).returncode == 0  # B fixes A: no gate failure
    assert (tmp_path / "compare.html").stat().st_size > 5000


def test_the_compare_page_in_a_real_headless_browser(two_runs, tmp_path):
    browser = chromium()
    a, b = two_runs
    assert cli("compare", str(a), str(b), "--out", str(tmp_path)).returncode == 1
    url = (tmp_path / "compare.html").as_uri()
    profile = tmp_path / "profile"
    dump = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", url], capture_output=True, text=True, timeout=120)
    dom = dump.stdout
    console = [line for line in dump.stderr.splitlines() if "CONSOLE" in line or "Refused to" in line]
    assert console == [], console
    regressions = dom[dom.index('<section id="regressions">'):dom.index('<section id="fixes">')]
    assert "Regressions (1)" in regressions and 'data-task="refund-a42"' in regressions
    assert "First difference at step 3: <b>action</b>" in regressions
    unchanged = dom[dom.index('<section id="unchanged">'):]
    for task in ("list-accounts", "no-refund-a7", "note-from-seed", "wrong-account-fails"):
        assert f'data-task="{task}"' in unchanged and f'data-task="{task}"' not in regressions
    # Our script ran under the page's CSP and measured every plot as laid out by the browser:
    # the histogram, a sparkline per task in the tables and one in the regression's details.
    assert 'data-plots="8/8"' in dom
    (hist,) = re.findall(r'<svg class="plot" data-plot="histogram"[^>]*data-rendered="(\d+)x(\d+)"', dom)
    assert int(hist[0]) >= 360 and int(hist[1]) >= 150  # its size, plus the border
    sparklines = re.findall(r'<svg class="plot" data-plot="sparkline"[^>]*data-rendered="(\d+)x(\d+)"', dom)
    assert len(sparklines) == 7 and all(int(w) > 0 and int(h) > 0 for w, h in sparklines)
    assert dom.count('class="bar"') == 20  # 10 bins, A and B
    shot = tmp_path / "compare.png"
    subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                    "--window-size={},{}".format(*SCREENSHOT_SIZE), f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000 and png_size(shot) == SCREENSHOT_SIZE  # not a blank page
    if os.environ.get("SOFTPROBE_COMPARE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["SOFTPROBE_COMPARE_SCREENSHOT"])
