"""Reaching the Ray head at ``--address`` within a time limit, and naming what answers instead."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from bench.engine.messages import shown

#: how long ``--address`` may take to connect, to answer, to be joined, each (``--connect-timeout-s``)
CONNECT_S = 30.0
#: the HTTP/2 preface and an empty SETTINGS frame (RFC 7540 3.5): a gRPC server answers with its own
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04  # frame type
_RAY_TLS = "RAY_USE_TLS"
#: Ray's switch for token authentication (``token`` or ``disabled``)
AUTH_MODE = "RAY_AUTH_MODE"


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped (``""``: none)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def check_reachable(address: str, timeout_s: float = CONNECT_S) -> None:
    """``ValueError`` naming what answers at ``address`` unless gRPC does within ``timeout_s`` (Ray retries forever)."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address: expected HOST:PORT of a Ray head node (e.g. "
                         f"10.0.0.1:6379); got {shown(address)}")
    where = f"--address {shown(address)}"
    start = "start one with 'ray start --head --port=6379'"
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except OSError as err:
        raise ValueError(f"{where}: no Ray head answers there ({err.strerror or err}); "
                         f"{start}") from None
    with sock:
        if os.environ.get(_RAY_TLS, "").lower() in ("1", "true"):
            return
        first = _first_answer(sock, timeout_s)
    if first is None:
        raise ValueError(f"{where}: something accepts connections there but says nothing in "
                         f"{timeout_s:g} s; a Ray head answers at once (is this the head's GCS "
                         f"port, 6379 by default?)")
    if len(first) >= 9 and first[3] == _H2_SETTINGS:
        return  # an HTTP/2 server: gRPC, as a Ray head speaks
    raise ValueError(f"{where}: {_what_answers(first)}, not a Ray head; {start}, or give the "
                     "head's address")


def _first_answer(sock: socket.socket, timeout_s: float) -> bytes | None:
    """The first bytes (9 or more) answering the HTTP/2 preface; ``None``: silent for ``timeout_s``; ``b""``: closed."""
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        sock.sendall(_H2_HELLO)
        while len(data) < 9:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return data or None
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(256)
            except TimeoutError:
                continue
            if not chunk:
                return data
            data += chunk
            if data[0] != 0:  # not the length of a SETTINGS frame: no HTTP/2, no need to wait
                return data
    except OSError:
        return data
    return data


def _what_answers(first: bytes) -> str:
    """What kind of server sent ``first`` in answer to the HTTP/2 preface, in words."""
    if not first:
        return "something accepts connections there but closes them without answering"
    if first.startswith(b"HTTP/"):
        line = first.split(b"\r\n", 1)[0].decode("latin-1")
        return f"an HTTP/1 server answers there ({shown(line)})"
    if first.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return "an HTTP server answers there (it sent an HTML page)"
    if first[0] in (0x15, 0x16):
        return (f"a TLS server answers there (set {_RAY_TLS}=1 if the Ray cluster uses TLS)")
    return f"a server that does not speak gRPC answers there (it said {shown(first[:40])})"


def connect_error(address: str, err: BaseException) -> str:
    """One line saying why connecting to the Ray at ``address`` failed, and what to do."""
    chain, seen = [], err
    while seen is not None and len(chain) < 5:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    said = f"{type(err).__name__}: {first_line(str(err))}"
    if any("AuthenticationError" in type(e).__name__ or "InvalidAuthToken" in str(e) for e in chain):
        return (f"--address {address!r}: the Ray cluster there wants its authentication token "
                f"({said}); set {AUTH_MODE}=token and give this machine the head's token "
                "(~/.ray/auth_token, or RAY_AUTH_TOKEN)")
    return (f"--address {address!r}: cannot connect to a Ray cluster there ({said}); start one "
            "with 'ray start --head --port=6379'")


class ConnectTimeoutError(ValueError):
    """Joining the Ray cluster at ``--address`` took longer than its limit."""


def init_within(ray: Any, timeout_s: float, address: str, **options: Any) -> None:
    """``ray.init`` within ``timeout_s``, else :class:`ConnectTimeoutError` (its thread holds no process open)."""
    outcome: dict[str, BaseException] = {}

    def join() -> None:
        try:
            ray.init(address=address, **options)
        except BaseException as err:  # handed to the caller
            outcome["error"] = err

    thread = threading.Thread(target=join, daemon=True, name="ray-connect")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ConnectTimeoutError(f"--address {shown(address)}: a gRPC server answers there, but no Ray "
                         f"cluster was joined within {timeout_s:g} s (--connect-timeout-s); is it "
                         "a Ray head of the same Ray version?")
    if "error" in outcome:
        raise outcome["error"]
