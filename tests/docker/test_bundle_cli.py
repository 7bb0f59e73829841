"""``softprobe-gym bundle build|inspect|run`` against the real engine: the printed digest is the
library's, the store finds it, and a Compose ``build:`` service is built, labelled and (by this
test) removed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import docker
import docker.errors
import pytest
from bundle_fixtures import write_bundle_folder

from softprobe.gym import labels as L
from softprobe.gym.bundles import load_bundle, resolve_bundle
from softprobe.gym.providers.docker.provider import DockerProvider


def run_cli(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SOFTPROBE_GYM_BUNDLE_STORE": str(store)}
    return subprocess.run([sys.executable, "-m", "softprobe.gym.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def library_digest(folder: Path) -> str:
    async def resolve() -> str:
        provider = DockerProvider()
        try:
            return (await resolve_bundle(load_bundle(folder), provider)).digest
        finally:
            await provider.close()

    return asyncio.run(resolve())


def write_tiny(folder: Path, name: str, *, compose: bool, image: str | None = None) -> Path:
    files = {"seed/README.md": "Support desk: refunds go in refund-note.md.\n"}
    lines = ["schema: softprobe.environment-bundle/v1", f"name: {name}", "image: softprobe/support-desk:latest",
             "seed: seed", "episode: {max_steps: 5}", "assertions: [{type: contains, value: A-42}]",
             "demo:", "  - {type: tool, name: crm.get_account, args: {id: A-42}}",
             "  - {type: terminate, output: A-42 looked up}"]
    if compose:
        lines.append("compose: compose.yaml")
        files["svc/Dockerfile"] = f"FROM softprobe/base:latest\nENV BUNDLE_TEST_MARKER={name}\n"
        files["compose.yaml"] = (
            "services:\n  svc:\n    build: ./svc\n    command: python3 -m http.server 8080\n"
            "    healthcheck: {test: [CMD, 'true'], interval: 200ms}\n" + (f"    image: {image}\n" if image else "")
        )
    return write_bundle_folder(folder, "\n".join(lines) + "\n", files)


@pytest.mark.docker
def test_build_prints_the_library_digest_and_inspect_finds_it_by_digest(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny", f"t-{secrets.token_hex(4)}", compose=False)
    store = tmp_path / "store"
    built = run_cli("bundle", "build", str(folder), store=store)
    assert built.returncode == 0, built.stderr
    digest = built.stdout.strip()
    assert digest == library_digest(folder)
    assert (store / f"{digest.removeprefix('sha256:')}.json").is_file()
    for key in (digest, digest[7:20]):
        shown = run_cli("bundle", "inspect", key, store=store)
        assert shown.returncode == 0, shown.stderr
        entry = json.loads(shown.stdout)
        assert entry["digest"] == digest and entry["source"] == str(folder.resolve())
        assert entry["manifest"]["image"] == entry["images"]["softprobe/support-desk:latest"]
    from_folder = json.loads(run_cli("bundle", "inspect", str(folder), store=store).stdout)
    assert from_folder["digest"] == digest and from_folder["manifest"] == entry["manifest"]
    missing = run_cli("bundle", "inspect", "sha256:" + "0" * 64, store=store)
    assert missing.returncode == 1 and "no bundle" in missing.stderr


@pytest.mark.docker
def test_a_compose_build_service_is_built_labelled_and_pinned_in_the_digest(tmp_path: Path) -> None:
    name = f"t-{secrets.token_hex(4)}"
    folder = write_tiny(tmp_path / "composed", name, compose=True)
    tag = load_bundle(folder).world.services[0].image
    assert tag.startswith(f"softprobe-bundle/{name}-svc:")
    client = docker.from_env()
    try:
        built = run_cli("bundle", "build", str(folder), store=tmp_path / "store")
        assert built.returncode == 0, built.stderr
        image = client.images.get(tag)
        assert image.labels[L.MANAGED] == "true" and image.labels[L.BUILD_HASH]
        entry = json.loads(run_cli("bundle", "inspect", built.stdout.strip(), store=tmp_path / "store").stdout)
        assert entry["manifest"]["services"][0]["image"] == image.id
        again = run_cli("bundle", "build", str(folder), store=tmp_path / "store")
        assert again.returncode == 0 and "up to date" in again.stderr
        assert again.stdout == built.stdout
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
    try:  # checked after the cleanup, outside it: a failure above is not masked
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(tag)
    finally:
        client.close()


@pytest.mark.docker
def test_run_is_the_demo_of_a_bundle(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path / "tiny", f"t-{secrets.token_hex(4)}", compose=False)
    done = run_cli("bundle", "run", str(folder), "--run-root", str(tmp_path / "run"), store=tmp_path / "store")
    assert done.returncode == 0, done.stderr
    for expected in ["fs.list", "README.md", "crm.get_account", "Acme", "terminate", "artifacts:"]:
        assert expected in done.stdout
    (episode,) = (tmp_path / "run" / "episodes").iterdir()
    assert re.fullmatch(r"t-[0-9a-f]{8}-\d{8}-\d{6}-[0-9a-f]{6}", episode.name)  # unique per run
    digest = library_digest(folder)
    assert json.loads((episode / "result.json").read_text())["bundle_digest"] == digest
    assert json.loads((episode / "episode.json").read_text())["bundle_digest"] == digest
    # `run` stored it: `inspect DIGEST` finds the digest its result records, without `build`.
    shown = run_cli("bundle", "inspect", digest, store=tmp_path / "store")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["digest"] == digest


def _remove_tags(client: docker.DockerClient, tags: list[str]) -> None:
    """Untag each (the image goes with its last tag, unless something else holds it)."""
    for tag in tags:
        try:
            client.images.remove(tag, force=False)
        except docker.errors.ImageNotFound:
            pass


@pytest.mark.docker
def test_a_bundle_never_moves_a_tag_it_did_not_create(tmp_path: Path) -> None:
    """Attack: a Compose ``build:`` service with ``image: <an existing tag>`` once made `bundle
    build` retag that name to the bundle's image (``softprobe/base:latest`` included: a later
    ``create_host_environment(image=...)`` then ran the hostile image). The tag here is the
    test's own: a second name for ``softprobe/base:latest``'s image (that tag is not touched)."""
    client = docker.from_env()
    token = secrets.token_hex(4)
    victim = f"softprobe-test/victim-{token}:latest"
    own = f"softprobe-test/own-{token}:v1"
    client.images.get("softprobe/base:latest").tag(f"softprobe-test/victim-{token}", "latest")
    held = client.images.get(victim).id
    hostile = write_tiny(tmp_path / "hostile", f"h-{token}", compose=True, image=victim)
    honest = write_tiny(tmp_path / "honest", f"o-{token}", compose=True, image=own)
    squatter = write_tiny(tmp_path / "squatter", f"s-{token}", compose=True, image=own)
    made: list[str] = [victim, own]
    try:
        content_tag = load_bundle(hostile).world.services[0].image
        made.append(content_tag)
        refused = run_cli("bundle", "build", str(hostile), store=tmp_path / "store")
        assert refused.returncode == 1 and refused.stdout == ""
        assert "never moves a tag it did not create" in refused.stderr and victim in refused.stderr
        assert client.images.get(victim).id == held  # the tag did not move
        with pytest.raises(docker.errors.ImageNotFound):  # refused before anything was built
            client.images.get(content_tag)

        # A free tag is given to the build; that bundle's service may move it with its next
        # build, another bundle may not.
        first = run_cli("bundle", "build", str(honest), store=tmp_path / "store")
        assert first.returncode == 0, first.stderr
        first_tag = load_bundle(honest).world.services[0].image
        made.append(first_tag)
        assert client.images.get(own).id == client.images.get(first_tag).id
        taken = run_cli("bundle", "build", str(squatter), store=tmp_path / "store")
        made.append(load_bundle(squatter).world.services[0].image)
        assert taken.returncode == 1 and own in taken.stderr
        assert client.images.get(own).id == client.images.get(first_tag).id
        (honest / "svc" / "Dockerfile").write_text("FROM softprobe/base:latest\nENV BUNDLE_TEST_MARKER=changed\n")
        second_tag = load_bundle(honest).world.services[0].image
        made.append(second_tag)
        assert second_tag != first_tag
        again = run_cli("bundle", "build", str(honest), store=tmp_path / "store")
        assert again.returncode == 0, again.stderr
        assert client.images.get(own).id == client.images.get(second_tag).id != client.images.get(first_tag).id
    finally:
        _remove_tags(client, made)
    try:  # checked after the cleanup: nothing of the test's is left, softprobe/base keeps its id
        for tag in made:
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(tag)
        assert client.images.get("softprobe/base:latest").id == held
    finally:
        client.close()
