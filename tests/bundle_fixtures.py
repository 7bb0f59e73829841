"""Bundle folders for the tests: :func:`write_bundle_folder` writes any bundle, :func:`write_bundle`
a small one (the bundle unit tests' world, pure logic: no engine, with a fake image resolver)."""

from __future__ import annotations

import textwrap
from pathlib import Path

BUNDLE_YAML = """\
schema: softprobe.environment-bundle/v1
name: tiny
description: a tiny world
image: softprobe/support-desk:latest
seed: seed
overlay:
  files: tools
  tools:
    - name: billing.get_invoice
      description: Look up an invoice
      args: {type: object, required: [id], properties: {id: {type: string}}, additionalProperties: false}
      command: [python3, "${SOFTPROBE_OVERLAY}/billing_tool.py", get_invoice]
      output: json
      timeout_s: 10
services:
  - name: billing
    image: softprobe/billing-service:latest
    command: [python3, /opt/billing/service.py]
    environment: {BILLING_PORT: "8080"}
    healthcheck: {test: [CMD, python3, /opt/billing/health.py], interval_s: 0.2, retries: 100}
network: {mode: services}
limits: {memory: 512m, cpus: 1.0, pids_limit: 256}
capabilities: {environment_checkpoint: true, deterministic_prefix_reexecution: true, subject_state_import: false}
episode: {max_steps: 20, tool_timeout_s: 30, max_tool_timeout_s: 120}
assertions:
  - {type: contains, value: refund}
tape: null
"""

IMAGES = {
    "softprobe/support-desk:latest": "sha256:" + "a" * 64,
    "softprobe/billing-service:latest": "sha256:" + "b" * 64,
    "softprobe/base:latest": "sha256:" + "c" * 64,
}


def fake_resolver(images: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    table = dict(IMAGES if images is None else images)
    return table.get


def write_bundle_folder(folder: Path, manifest: str, files: dict[str, str] | None = None) -> Path:
    """A bundle folder (made with its parents if missing): ``bundle.yaml`` holding ``manifest``,
    then each of ``files`` (a path relative to the folder: its text), its folders made as needed."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bundle.yaml").write_text(manifest)
    for name, text in (files or {}).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


#: The tiny bundle's files besides its ``bundle.yaml``: a seed and an overlay tool.
TINY_FILES = {
    "seed/README.md": "Support desk: refunds go in refund-note.md.\n",
    "seed/docs/policy.md": "Refund within 30 days.\n",
    "tools/billing_tool.py": "import sys, json\nprint(json.dumps({'ok': True}))\n",
}


def write_bundle(folder: Path, manifest: str = BUNDLE_YAML, *, extra: dict[str, str] | None = None) -> Path:
    """The tiny bundle in ``folder``: ``bundle.yaml`` (``manifest``), a seed and an overlay
    (``extra``: more files, or other text for these)."""
    write_bundle_folder(folder, textwrap.dedent(manifest), {**TINY_FILES, **(extra or {})})
    (folder / "tools" / "billing_tool.py").chmod(0o755)
    return folder
