"""The test session's own brokers, on a throwaway PostgreSQL, on loopback.

``fairway postgres --ephemeral`` runs a private PostgreSQL for as long as a small holder
process lives; each broker is a ``fairway serve`` of its own on a free 127.0.0.1 port, so that
a test can stop, kill and start one again on its port (``Broker.restart``, ``Broker.kill``,
``Broker.start``) while the database stays. The binary comes
from ``FAIRWAY_BIN``, else the repository's ``target/release/fairway``, else
``target/debug/fairway``. Without one the tests are skipped, unless
``FAIRWAY_REQUIRE_TOOLS=1`` (``make test``), which makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
REQUIRE_TOOLS = os.environ.get("FAIRWAY_REQUIRE_TOOLS") == "1"
START_TIMEOUT = 90.0


def fairway_binary() -> Path | None:
    configured = os.environ.get("FAIRWAY_BIN")
    if configured:
        return Path(configured).resolve()
    for profile in ("release", "debug"):
        candidate = REPO_ROOT / "target" / profile / "fairway"
        if candidate.exists():
            return candidate
    return None


def missing_tool(reason: str) -> None:
    """Skips the test, or fails it under FAIRWAY_REQUIRE_TOOLS=1."""
    if REQUIRE_TOOLS:
        pytest.fail(f"{reason} (FAIRWAY_REQUIRE_TOOLS=1)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def unique(name: str) -> str:
    """A service or user name no other test uses, so that tests sharing a database never see
    each other's work."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls ``condition`` until it holds; fails the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Postgres:
    """A private PostgreSQL that lives while ``fairway postgres`` runs its holder command."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.workdir = workdir
        url_file = workdir / "database-url"
        self.log = workdir / "postgres-wrapper.log"
        holder = (
            "import os, sys\n"
            "open(sys.argv[1], 'w').write(os.environ['DATABASE_URL'])\n"
            "sys.stdin.read()\n"  # until the test session closes the pipe (or dies)
        )
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(binary),
                    "postgres",
                    "--data-dir",
                    str(workdir / "pgdata"),
                    "--ephemeral",
                    "--",
                    sys.executable,
                    "-c",
                    holder,
                    str(url_file),
                ],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not (url_file.exists() and url_file.read_text()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"fairway postgres did not start:\n{tail(self.log)}", pytrace=False)
            time.sleep(0.05)
        self.url = url_file.read_text()

    def stop(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            self.process.wait(timeout=30)


class Broker:
    """One ``fairway serve`` on a free loopback port; ``restart`` keeps the port."""

    def __init__(
        self,
        binary: Path,
        database_url: str,
        workdir: Path,
        *args: str,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        """``verify`` is for a broker that ``args`` make serve HTTPS: the trust its certificate
        is checked with, and the URL is then ``https://``."""
        self.binary = binary
        self.database_url = database_url
        self.args = args
        self.verify: ssl.SSLContext | bool = True if verify is None else verify
        self.port = free_port()
        self.url = f"{'http' if verify is None else 'https'}://127.0.0.1:{self.port}"
        self.log = workdir / f"broker-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        env = dict(os.environ, DATABASE_URL=self.database_url, RUST_LOG="warn")
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    "serve",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--shutdown-timeout",
                    "2s",
                    *self.args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(
                    f"fairway serve exited with {self.process.returncode}:\n{tail(self.log)}",
                    pytrace=False,
                )
            with contextlib.suppress(httpx.HTTPError):
                response = httpx.get(f"{self.url}/readyz", timeout=2, verify=self.verify)
                if response.status_code == 200:
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"fairway serve never became ready:\n{tail(self.log)}", pytrace=False)
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        """Ends the broker at once, as a crash would (SIGKILL: no drain, every connection
        dropped); ``start`` brings it back on the same port."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait()
        self.process = None


def make_certificates(directory: Path) -> None:
    """A private CA (``ca.pem``) and a certificate it signed for 127.0.0.1 (``server.pem``,
    ``server.key``), with the extensions Python's strict verification asks for."""
    openssl = shutil.which("openssl")
    if openssl is None:
        missing_tool("no openssl to make a private CA with")
    assert openssl is not None
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (directory / "server.ext").write_text(
        "subjectAltName = IP:127.0.0.1\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid\n"
    )

    def run(*arguments: str) -> None:
        subprocess.run([openssl, *arguments], cwd=directory, check=True, capture_output=True)

    # fmt: off
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=fairway test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    # fmt: on


class TlsBroker(Broker):
    """A broker that serves HTTPS itself, with the certificate ``make_certificates`` made in
    ``certificates``; ``ca`` is the path of the CA's certificate, for ``verify=``."""

    def __init__(self, binary: Path, database_url: str, workdir: Path, certificates: Path) -> None:
        self.ca = str(certificates / "ca.pem")
        super().__init__(
            binary,
            database_url,
            workdir,
            "--tls-cert",
            str(certificates / "server.pem"),
            "--tls-key",
            str(certificates / "server.key"),
            verify=ssl.create_default_context(cafile=self.ca),
        )


@pytest.fixture(scope="session")
def fairway_bin() -> Path:
    binary = fairway_binary()
    if binary is None or not os.access(binary, os.X_OK):
        missing_tool(
            f"no fairway binary (FAIRWAY_BIN, or {REPO_ROOT}/target/{{release,debug}}/fairway); "
            "build it with `cargo build --bin fairway`"
        )
    assert binary is not None
    return binary


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    # Readable by the `postgres` user that `fairway postgres` runs the server as, under root.
    path = Path(tempfile.mkdtemp(prefix="fairway-pyclient-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres(fairway_bin: Path, workdir: Path) -> Iterator[Postgres]:
    server = Postgres(fairway_bin, workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def broker(fairway_bin: Path, postgres: Postgres, workdir: Path) -> Iterator[Broker]:
    """A broker with the default lease (5 minutes)."""
    server = Broker(fairway_bin, postgres.url, workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tls_broker(fairway_bin: Path, postgres: Postgres, workdir: Path) -> Iterator[TlsBroker]:
    """A second broker on the same database, serving HTTPS with a certificate of a private CA."""
    certificates = workdir / "tls"
    certificates.mkdir(exist_ok=True)
    make_certificates(certificates)
    server = TlsBroker(fairway_bin, postgres.url, workdir, certificates)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def short_lease_broker(fairway_bin: Path, postgres: Postgres, workdir: Path) -> Iterator[Broker]:
    """A broker whose leases last 2 s: an item whose worker stops heartbeating is back soon."""
    server = Broker(fairway_bin, postgres.url, workdir, "--lease", "2s", "--reap-interval", "500ms")
    yield server
    server.stop()


@pytest.fixture
def broker_factory(
    fairway_bin: Path, postgres: Postgres, workdir: Path
) -> Iterator[Callable[..., Broker]]:
    """Brokers of the test's own, stopped when it ends (for a test that restarts one)."""
    started: list[Broker] = []

    def start(*args: str) -> Broker:
        server = Broker(fairway_bin, postgres.url, workdir, *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


Responder = Callable[[BaseHTTPRequestHandler, bytes], None]


class StandIn:
    """An HTTP server standing in for a broker, or a proxy in front of one, on a thread of its
    own: ``respond(request, body)`` answers every GET and POST, ``url`` is where it listens."""

    def __init__(self, respond: Responder) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.respond()

            def do_POST(self) -> None:
                self.respond()

            def respond(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                respond(self, self.rfile.read(length) if length else b"")

        class Server(ThreadingHTTPServer):
            request_queue_size = 64  # a worker's first requests connect at once
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answer(
    request: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    """Writes a JSON answer (none for a 204) with ``headers`` besides."""
    request.send_response(status)
    if status != 204:
        request.send_header("content-type", "application/json")
        request.send_header("content-length", str(len(body)))
    for name, value in (headers or {}).items():
        request.send_header(name, value)
    request.end_headers()
    request.wfile.write(body)


def forward(request: BaseHTTPRequestHandler, broker_url: str, body: bytes) -> httpx.Response:
    """Sends ``request`` on to the broker at ``broker_url``; answers the broker's answer."""
    headers = {"content-type": request.headers.get("content-type") or "application/json"}
    return httpx.request(
        request.command, broker_url + request.path, content=body, headers=headers, timeout=90
    )
