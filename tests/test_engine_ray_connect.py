"""Every network wait has a limit: ``--address`` must answer in Ray's protocol within the
connect timeout, and what answers instead (an HTTP server, a server that says nothing, a
gRPC server that is not Ray) is one line saying what was found there. Loopback only."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from bench.engine.executors.ray_connect import check_reachable

ROOT = Path(__file__).resolve().parents[1]
SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty HTTP/2 SETTINGS frame


@contextmanager
def _listener(answer: bytes | None) -> Iterator[str]:
    """A loopback server that sends ``answer`` to every connection (None: says nothing) and
    keeps it open; yields its ``HOST:PORT``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop, conns = threading.Event(), []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conns.append(conn)
            if answer:
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in conns:
            conn.close()
        server.close()


@contextmanager
def _http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_server_at_the_address_is_named_within_the_limit():
    with _http_server() as address:
        start = time.monotonic()
        with pytest.raises(ValueError, match=rf"--address '{address}': an HTTP server answers "
                                             r"there .*, not a Ray head"):
            check_reachable(address, timeout_s=5)
        assert time.monotonic() - start < 5


@pytest.mark.parametrize(("answer", "said"), [
    (None, "something accepts connections there but says nothing in 1 s"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", r"an HTTP/1 server answers there \('HTTP/1.1 400 Bad Request'\)"),
    (b"\x15\x03\x01\x00\x02\x02\x46", "a TLS server answers there"),
    (b"-ERR unknown command 'PRI'\r\n", "a server that does not speak gRPC answers there"),
])
def test_what_answers_instead_of_a_ray_head_is_said(answer, said):
    with _listener(answer) as address:
        start = time.monotonic()
        with pytest.raises(ValueError, match=said):
            check_reachable(address, timeout_s=1)
        assert time.monotonic() - start < 3


def test_a_grpc_server_that_never_becomes_a_ray_cluster_ends_within_the_limit(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({"name": "ray", "passes": ["fwd"], "seq_len": [16],
                                      "heads": 1, "head_dim": 8,
                                      "variants": [{"name": "full"}]}))
    with _listener(SETTINGS_FRAME) as address:
        check_reachable(address, timeout_s=2)  # it speaks HTTP/2, as a Ray head does
        start = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "bench.cli", "sweep", str(config), "--out", str(tmp_path / "out"),
             "--executor", "ray", "--address", address, "--connect-timeout-s", "3", "--no-plots"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --address '{address}': a gRPC server answers there, but no Ray "
                      "cluster was joined within 3 s (--connect-timeout-s); is it a Ray head of "
                      "the same Ray version? (--debug shows the traceback)"]
    assert time.monotonic() - start < 60


def test_the_connect_timeout_goes_only_with_an_address():
    from typer.testing import CliRunner

    from bench.cli import app

    result = CliRunner().invoke(app, ["sweep", "quick", "--connect-timeout-s", "5", "--dry-run"])
    assert result.exit_code == 2 and "--connect-timeout-s: only with --executor ray" in result.output


@pytest.mark.slow
def test_a_real_ray_head_passes_the_check():
    ray = pytest.importorskip("ray")
    from bench.engine.executors.ray import RayExecutor

    starter = RayExecutor("cpu", num_cpus=1)
    try:
        check_reachable(ray.get_runtime_context().gcs_address, timeout_s=5)
    finally:
        starter.shutdown()
