"""The support-desk-billing world without Docker: the billing service's API and state (served
in-process, and once as its own process), the overlay tool ``billing_tool.py`` against it, a step
through the shim that the service refuses, and the bundle's files against the shared models.

Every server listens on an ephemeral loopback port and is stopped by its fixture; subprocesses
are waited for with a bound."""

from __future__ import annotations

import http.client
import importlib.util
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from helpers import REPO, tool

from softprobe.gym import create_host_environment
from softprobe.gym.evals.suite import Task
from softprobe.gym.providers.docker.images import SPECS
from softprobe.gym.providers.local import LocalProvider
from softprobe.gym.worlds import OVERLAY_PLACEHOLDER, HealthCheck, NetworkPolicy, ServiceSpec, ToolDefinition, World

SERVICE_DIR = REPO / "images" / "billing-service"
WORLD_DIR = REPO / "images" / "support-desk-billing"
TOOL = WORLD_DIR / "tools" / "billing_tool.py"
FIXTURE = SERVICE_DIR / "invoices.json"
BOUND_S = 20  # no subprocess of these tests may take longer


def _load_service() -> ModuleType:
    spec = importlib.util.spec_from_file_location("billing_service", SERVICE_DIR / "service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # No __pycache__ in the image's build context (it would be ignored, but is clutter there).
    previous, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = previous
    return module


service = _load_service()


class Served:
    """A billing server on 127.0.0.1:<ephemeral>, serving in a thread until ``stop``."""

    def __init__(self, db: Path) -> None:
        self.server = service.make_server(str(db), str(FIXTURE), "127.0.0.1", 0)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.server.billing.close()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive()

    def request(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """One request; (status, parsed JSON answer)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            connection.request(method, path, body=data, headers=headers or {})
            response = connection.getresponse()
            assert response.getheader("Content-Type") == "application/json"
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def refund(self, invoice_id: str, amount_cents: int, reason: str = "test") -> tuple[int, Any]:
        return self.request("POST", "/refunds", {"invoice_id": invoice_id, "amount_cents": amount_cents, "reason": reason})


@pytest.fixture
def billing(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path / "billing.db")
    try:
        yield served
    finally:
        served.stop()


# -- the service's API ---------------------------------------------------------------------------


def test_a_fresh_database_holds_the_fixture(billing: Served) -> None:
    assert billing.request("GET", "/health") == (200, {"status": "ok", "invoices": 5})
    status, invoice = billing.request("GET", "/invoices/INV-1001")
    assert status == 200
    assert invoice["account_id"] == "A-42" and invoice["amount_cents"] == 12000
    assert (invoice["status"], invoice["refunded_cents"], invoice["refundable_cents"], invoice["refunds"]) == (
        "paid", 0, 12000, []
    )
    # The fixture's own earlier refund counts against what is still refundable.
    status, october = billing.request("GET", "/invoices/INV-3000")
    assert october["refunded_cents"] == 5000 and october["refundable_cents"] == 31050 - 5000
    status, listed = billing.request("GET", "/invoices")
    assert [i["id"] for i in listed] == ["INV-1000", "INV-1001", "INV-2001", "INV-3000", "INV-3001"]


def test_the_fixture_accounts_are_the_crm_accounts() -> None:
    accounts = json.loads((REPO / "images" / "support-desk" / "crm" / "accounts.json").read_text())
    invoices = json.loads(FIXTURE.read_text())["invoices"]
    assert {i["account_id"] for i in invoices} == set(accounts)


def test_refunds_up_to_the_invoice_amount_then_refused(billing: Served) -> None:
    status, first = billing.refund("INV-1001", 5000, " duplicate charge, T-1001 ")
    assert status == 201
    assert first == {
        "id": "R-0002", "invoice_id": "INV-1001", "account_id": "A-42", "amount_cents": 5000, "currency": "usd",
        "reason": "duplicate charge, T-1001", "status": "refunded", "invoice_refundable_cents": 7000,
    }
    status, second = billing.refund("INV-1001", 7000)
    assert (status, second["id"], second["invoice_refundable_cents"]) == (201, "R-0003", 0)
    status, refused = billing.refund("INV-1001", 1)
    assert status == 409
    assert "exceeds the 0 cents ($0.00) still refundable on invoice INV-1001" in refused["error"]
    status, invoice = billing.request("GET", "/invoices/INV-1001")
    assert [r["id"] for r in invoice["refunds"]] == ["R-0002", "R-0003"] and invoice["refundable_cents"] == 0


def test_a_refund_over_the_amount_is_refused_and_records_nothing(billing: Served) -> None:
    status, refused = billing.refund("INV-1001", 24000)
    assert status == 409 and refused["status"] == 409
    assert refused["error"] == (
        "refund of 24000 cents ($240.00) exceeds the 12000 cents ($120.00) still refundable on invoice "
        "INV-1001 (amount 12000 cents ($120.00), refunded 0 cents ($0.00))"
    )
    assert billing.request("GET", "/invoices/INV-1001")[1]["refunds"] == []
    # The refused refund took no id: the next one is still R-0002.
    assert billing.refund("INV-1001", 100)[1]["id"] == "R-0002"


def test_an_unpaid_invoice_cannot_be_refunded(billing: Served) -> None:
    status, refused = billing.refund("INV-3001", 100)
    assert status == 409 and "is open, not paid" in refused["error"]


def test_unknown_invoices_are_404(billing: Served) -> None:
    assert billing.request("GET", "/invoices/INV-9999") == (404, {"error": "no invoice INV-9999", "status": 404})
    assert billing.refund("INV-9999", 100)[0] == 404
    assert billing.request("GET", "/invoices/..%2Fetc")[0] == 404
    assert billing.request("GET", "/nowhere")[0] == 404


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"NaN", 400, "not valid JSON"),
        (b'["INV-1001", 100]', 400, "must be a JSON object"),
        (b'{"invoice_id": "INV-1001", "amount_cents": 100}', 400, "missing field 'reason'"),
        (b'{"invoice_id": "INV-1001", "amount_cents": "100", "reason": "x"}', 400, "'amount_cents' must be an integer"),
        (b'{"invoice_id": "INV-1001", "amount_cents": 1.5, "reason": "x"}', 400, "'amount_cents' must be an integer"),
        (b'{"invoice_id": "INV-1001", "amount_cents": true, "reason": "x"}', 400, "'amount_cents' must be an integer"),
        (b'{"invoice_id": "INV-1001", "amount_cents": 1, "reason": "x", "to": "me"}', 400, "unknown field(s): to"),
        (b'{"invoice_id": "INV-1001", "amount_cents": 0, "reason": "x"}', 422, "positive number of cents"),
        (b'{"invoice_id": "INV-1001", "amount_cents": -500, "reason": "x"}', 422, "positive number of cents"),
        (b'{"invoice_id": "INV-1001", "amount_cents": 100, "reason": "  "}', 422, "needs a reason"),
    ],
)
def test_malformed_refunds_are_refused_with_a_json_error(billing: Served, body: bytes, status: int, message: str) -> None:
    got_status, answer = billing.request("POST", "/refunds", raw=body)
    assert got_status == status and message in answer["error"], answer
    assert billing.request("GET", "/invoices/INV-1001")[1]["refundable_cents"] == 12000


def test_bodies_over_the_limit_or_without_a_length_are_refused(billing: Served) -> None:
    oversize = json.dumps({"invoice_id": "INV-1001", "amount_cents": 1, "reason": "x" * 5000}).encode()
    status, answer = billing.request("POST", "/refunds", raw=oversize)
    assert status == 413 and "at most 4096" in answer["error"]
    # Without a length the service cannot tell where the body ends: it asks for one.
    with socket.create_connection(("127.0.0.1", billing.port), timeout=5) as raw:
        raw.sendall(b"POST /refunds HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.0 411")
    assert billing.request("GET", "/invoices/INV-1001")[1]["refunds"] == []


def test_writes_to_read_only_endpoints_are_405(billing: Served) -> None:
    assert billing.request("POST", "/invoices/INV-1001", {})[0] == 405
    assert billing.request("DELETE", "/invoices/INV-1001")[0] == 405
    assert billing.request("GET", "/refunds")[0] == 405


def test_concurrent_refunds_never_exceed_the_invoice(billing: Served) -> None:
    with ThreadPoolExecutor(max_workers=10) as pool:
        statuses = sorted(status for status, _ in pool.map(lambda _: billing.refund("INV-1001", 2000), range(10)))
    assert statuses == [201] * 6 + [409] * 4
    invoice = billing.request("GET", "/invoices/INV-1001")[1]
    assert invoice["refunded_cents"] == 12000 and len(invoice["refunds"]) == 6


# -- state: kept across restarts, fresh from the fixture ---------------------------------------------


def test_state_survives_a_restart_on_the_same_database(tmp_path: Path) -> None:
    first = Served(tmp_path / "billing.db")
    try:
        assert first.refund("INV-1001", 12000)[0] == 201
    finally:
        first.stop()
    again = Served(tmp_path / "billing.db")
    try:
        invoice = again.request("GET", "/invoices/INV-1001")[1]
        assert invoice["refundable_cents"] == 0 and [r["id"] for r in invoice["refunds"]] == ["R-0002"]
        assert again.refund("INV-1000", 100)[1]["id"] == "R-0003"
    finally:
        again.stop()
    # Another database file starts from the fixture: none of that happened there.
    fresh = Served(tmp_path / "other.db")
    try:
        assert fresh.request("GET", "/invoices/INV-1001")[1]["refundable_cents"] == 12000
    finally:
        fresh.stop()


def test_two_fresh_databases_are_the_same_state(tmp_path: Path) -> None:
    for name in ("a.db", "b.db"):
        assert service.create_database(str(tmp_path / name), str(FIXTURE)) is True
    dumps = []
    for name in ("a.db", "b.db"):
        billing = service.Billing(str(tmp_path / name))
        dumps.append(billing.invoices())
        billing.close()
    assert dumps[0] == dumps[1] and len(dumps[0]) == 5
    assert service.create_database(str(tmp_path / "a.db"), str(FIXTURE)) is False  # kept, not re-created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "b.db"]  # no temporary file left


def test_a_file_that_is_not_a_billing_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / "billing.db").write_text("not sqlite")
    with pytest.raises(RuntimeError, match="is not a billing database .* remove it"):
        service.make_server(str(tmp_path / "billing.db"), str(FIXTURE))


def test_a_malformed_fixture_is_refused(tmp_path: Path) -> None:
    (tmp_path / "fixture.json").write_text('{"invoices": [{"id": "INV-1"}]}')
    with pytest.raises(RuntimeError, match="cannot read the billing fixture"):
        service.create_database(str(tmp_path / "billing.db"), str(tmp_path / "fixture.json"))
    assert not (tmp_path / "billing.db").exists()


def test_the_service_process_serves_answers_its_healthcheck_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {"BILLING_PORT": "0", "BILLING_HOST": "127.0.0.1", "BILLING_DB": str(tmp_path / "billing.db"), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        [sys.executable, "-I", str(SERVICE_DIR / "service.py")], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        first_line: list[str] = []
        reader = threading.Thread(target=lambda: first_line.append(process.stdout.readline() if process.stdout else ""))
        reader.start()
        reader.join(timeout=BOUND_S)
        assert first_line and first_line[0].startswith("billing: listening on 127.0.0.1:"), first_line
        port = first_line[0].split(":")[2].split()[0]

        def health() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-I", str(SERVICE_DIR / "health.py")], env={"BILLING_PORT": port},
                capture_output=True, text=True, timeout=BOUND_S,
            )

        assert health().returncode == 0
        process.terminate()
        assert process.wait(timeout=BOUND_S) == 0  # SIGTERM stops it cleanly, at once
        down = health()
        assert down.returncode == 1 and down.stderr.startswith("billing is not healthy:")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=BOUND_S)
    assert (tmp_path / "billing.db").is_file()


def test_the_service_refuses_a_bad_port_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-I", str(SERVICE_DIR / "service.py")], env={"BILLING_PORT": "http", "BILLING_DB": str(tmp_path / "b.db")},
        capture_output=True, text=True, timeout=BOUND_S,
    )
    assert done.returncode == 2 and done.stderr == "billing: BILLING_PORT must be a port number (0-65535)\n"


# -- the overlay tool ------------------------------------------------------------------------------


def run_tool(url: str, command: str, args: Any) -> subprocess.CompletedProcess[str]:
    stdin = args if isinstance(args, str) else json.dumps(args)
    return subprocess.run(
        [sys.executable, "-I", str(TOOL), command], input=stdin, env={"BILLING_URL": url},
        capture_output=True, text=True, timeout=BOUND_S,
    )


def test_the_tool_gets_an_invoice_and_refunds(billing: Served) -> None:
    got = run_tool(billing.url, "get_invoice", {"id": "INV-1001"})
    assert got.returncode == 0 and got.stderr == ""
    assert json.loads(got.stdout)["refundable_cents"] == 12000
    done = run_tool(billing.url, "refund", {"invoice_id": "INV-1001", "amount_cents": 12000, "reason": "T-1001"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["id"] == "R-0002"


@pytest.mark.parametrize(
    "command, args, line",
    [
        ("refund", {"invoice_id": "INV-1001", "amount_cents": 24000, "reason": "x"},
         "billing refused (HTTP 409): refund of 24000 cents ($240.00) exceeds the 12000 cents ($120.00) still "
         "refundable on invoice INV-1001 (amount 12000 cents ($120.00), refunded 0 cents ($0.00))"),
        ("get_invoice", {"id": "INV-9999"}, "billing refused (HTTP 404): no invoice INV-9999"),
        ("get_invoice", {"id": "../health"}, "billing refused (HTTP 404): no invoice ../health"),
        ("refund", {"invoice_id": "INV-1001", "amount_cents": -1, "reason": "x"},
         "billing refused (HTTP 422): amount_cents must be a positive number of cents (got -1)"),
    ],
)
def test_the_tool_reports_a_refusal_in_one_line(billing: Served, command: str, args: Any, line: str) -> None:
    done = run_tool(billing.url, command, args)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", line + "\n")


def test_the_tool_reports_an_unreachable_service_in_one_line() -> None:
    with socket.socket() as placeholder:  # a port nothing listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
        done = run_tool(f"http://127.0.0.1:{port}", "get_invoice", {"id": "INV-1001"})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"cannot reach the billing service at http://127.0.0.1:{port}: ")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "command, stdin, message",
    [
        ("get_invoice", "{nope", "the arguments on stdin are not JSON"),
        ("get_invoice", "[1]", "the arguments on stdin must be a JSON object"),
        ("get_invoice", "{}", "get_invoice needs an invoice id"),
        ("delete_everything", "{}", "usage: billing_tool.py get_invoice|refund"),
    ],
)
def test_the_tool_refuses_bad_arguments_in_one_line(command: str, stdin: str, message: str) -> None:
    done = run_tool("http://127.0.0.1:9", command, stdin)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1


# -- the bundle's files and a step through the shim -------------------------------------------------


def bundle() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((WORLD_DIR / "bundle.yaml").read_text())
    return data


def _world_of_bundle() -> World:
    """The bundle's tools, services and network as the shared models (what the bundle loader
    compiles; here by hand, so the files are checked before that loader exists)."""
    data = bundle()
    services = []
    for entry in data["services"]:
        entry = dict(entry)
        entry["healthcheck"] = HealthCheck(**entry["healthcheck"])
        services.append(ServiceSpec(**entry))
    return World(
        tools={"tools": [ToolDefinition(**t) for t in data["overlay"]["tools"]], "files_root": WORLD_DIR / data["overlay"]["files"]},
        services=tuple(services),
        network=NetworkPolicy(**data["network"]),
    )


def test_the_bundle_fits_the_world_models_and_its_references_exist() -> None:
    data = bundle()
    assert data["schema"] == "softprobe.environment-bundle/v1" and data["name"] == WORLD_DIR.name
    world = _world_of_bundle()
    assert [t.name for t in world.tools.tools] == ["billing.get_invoice", "billing.refund"]
    for spec in world.tools.tools:
        overlay_files = [part for part in spec.command if OVERLAY_PLACEHOLDER in part]
        assert overlay_files == [f"{OVERLAY_PLACEHOLDER}/billing_tool.py"]
    assert (WORLD_DIR / data["seed"] / "ticket.md").is_file() and (WORLD_DIR / data["seed"] / "refund-policy.md").is_file()
    ours = {spec.tag for spec in SPECS}
    assert data["image"] in ours and all(s.image in ours for s in world.services)
    (billing_service,) = world.services
    assert billing_service.command == ["python3", "-I", "/opt/billing/service.py"]
    # The demo's refund is within the policy: the fixture's INV-1001 has that much refundable.
    refund = next(a for a in data["demo"] if a.get("name") == "billing.refund")
    invoice = next(i for i in json.loads(FIXTURE.read_text())["invoices"] if i["id"] == refund["args"]["invoice_id"])
    assert refund["args"]["amount_cents"] <= invoice["amount_cents"]


def test_the_eval_suite_tasks_are_valid_and_use_the_bundles_tools() -> None:
    suite = yaml.safe_load((WORLD_DIR / "examples" / "suite.yaml").read_text())
    assert (WORLD_DIR / "examples" / suite["bundle"]).resolve() == WORLD_DIR
    tasks = [Task.model_validate(t) for t in suite["tasks"]]
    assert len(tasks) == 3
    known = {t["name"] for t in bundle()["overlay"]["tools"]} | {"crm.get_account", "fs.read", "fs.write"}
    used = {a.name for task in tasks for a in task.actions or [] if a.type == "tool"}
    assert used <= known and {"billing.get_invoice", "billing.refund"} <= used


def overlay_manifest(folder: Path) -> Path:
    """The bundle's overlay tools as a shim manifest that runs the repository's copy of the tool
    (what the overlay install does with ``${SOFTPROBE_OVERLAY}``)."""
    tools = {}
    for spec in _world_of_bundle().tools.tools:
        entry = spec.manifest_entry()
        entry["command"] = [part.replace(OVERLAY_PLACEHOLDER, str(TOOL.parent)) for part in entry["command"]]
        tools[spec.name] = entry
    path = folder / "billing-tools.json"
    path.write_text(json.dumps({"tools": tools}))
    return path


async def test_a_refused_refund_is_a_tool_failed_step_with_the_services_line(tmp_path: Path, billing: Served) -> None:
    provider = LocalProvider(root=tmp_path / "billing-root", manifest=overlay_manifest(tmp_path))
    try:
        async with create_host_environment(
            run_root=tmp_path / "run", provider=provider, tool_timeout_s=20,
            container={"environment": {"BILLING_URL": billing.url}},
        ) as host:
            await host.create_episode(episode_id="ep-1")
            await host.reset(episode_id="ep-1")
            got = await host.step(episode_id="ep-1", action=tool("billing.get_invoice", id="INV-1001"))
            assert got.error is None and got.observation["refundable_cents"] == 12000
            refused = await host.step(
                episode_id="ep-1", action=tool("billing.refund", invoice_id="INV-1001", amount_cents=24000, reason="x")
            )
            assert refused.error is not None and refused.error.type == "tool_failed"
            assert refused.error.message.startswith("billing.refund exited with code 1: billing refused (HTTP 409): ")
            assert "Traceback" not in refused.error.message
            typed = await host.step(
                episode_id="ep-1", action=tool("billing.refund", invoice_id="INV-1001", amount_cents="all", reason="x")
            )
            assert typed.error is not None and typed.error.type == "invalid_arguments"
            done = await host.step(
                episode_id="ep-1", action=tool("billing.refund", invoice_id="INV-1001", amount_cents=12000, reason="T-1001")
            )
            assert done.error is None and done.observation["id"] == "R-0002"
            await host.destroy(episode_id="ep-1")
    finally:
        await provider.close()
