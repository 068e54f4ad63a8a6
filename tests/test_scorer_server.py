"""The shipped scorer service under hostile clients: bad bodies get 4xx, slow clients hold no
worker, 200 concurrent requests all get answers (issues 16 and 17). Real HTTP on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from evolm.task.scorer.server import Limits, ScorerHTTPServer, parse_args

OK_BODY = json.dumps({"prompts": ["p"], "completions": ["a b a"]}).encode()


@pytest.fixture
def server() -> Iterator[ScorerHTTPServer]:
    """The service in this process (so its threads can be counted), on a free port."""
    srv = ScorerHTTPServer(
        ("127.0.0.1", 0), limits=Limits(channel_timeout_s=2, max_body_bytes=4096)
    )
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.server_close()
    thread.join(timeout=5)


def post(srv: ScorerHTTPServer, body: bytes, timeout: float = 10) -> tuple[int, str]:
    """``(status, body text)``: the service answers JSON, waitress's own 413 plain text."""
    conn = http.client.HTTPConnection(*srv.server_address, timeout=timeout)
    try:
        conn.request("POST", "/score", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_binds_localhost_by_default() -> None:
    assert parse_args([]).host == "127.0.0.1"
    srv = ScorerHTTPServer(("127.0.0.1", 0))
    try:
        assert srv.server_address[0] == "127.0.0.1"
    finally:
        srv.server_close()


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"not json", 400, "not valid JSON"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, 413, "exceeds"),  # over this server's 4 KiB limit
        (b"[" * 2000 + b"]" * 2000, 400, "nested too deeply"),
        (b"[[1]]", 400, "must be an object"),
        (b'{"prompts": "p", "completions": ["a"]}', 400, "list of strings"),
        (b'{"prompts": [1], "completions": ["a"]}', 400, "list of strings"),
        (b'{"prompts": ["a"], "completions": [null]}', 400, "list of strings"),
        (b'{"prompts": ["a", "b"], "completions": ["a"]}', 400, "2 prompts but 1"),
        (b"x" * 5000, 413, "exceeds"),
    ],
    ids=[
        "text",
        "bytes",
        "deep-oversized",
        "deep-array",
        "array",
        "str",
        "int",
        "null",
        "lengths",
        "big",
    ],
)
def test_bad_bodies_get_4xx(server: ScorerHTTPServer, body: bytes, status: int, error: str) -> None:
    got, answer = post(server, body)
    assert got == status and error in answer
    assert post(server, OK_BODY)[0] == 200  # and the service is still up


def test_a_number_of_5000_digits_is_a_400() -> None:
    """Before: json's bare ValueError (Exceeds the limit (4300 digits)) escaped the handler."""
    srv = ScorerHTTPServer(("127.0.0.1", 0), limits=Limits(max_body_bytes=1 << 20))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        body = b'{"prompts": ["a"], "completions": ["b"], "n": ' + b"9" * 5000 + b"}"
        status, answer = post(srv, body)
        assert status == 400 and "number Python cannot read" in json.loads(answer)["error"]
        assert post(srv, OK_BODY)[0] == 200
    finally:
        srv.server_close()


def test_deeply_nested_json_is_a_400_not_a_dropped_connection() -> None:
    srv = ScorerHTTPServer(("127.0.0.1", 0), limits=Limits(max_body_bytes=1 << 20))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        status, answer = post(srv, b"[" * 100_000 + b"]" * 100_000)
        assert status == 400 and "nested too deeply" in json.loads(answer)["error"]
    finally:
        srv.server_close()


def test_200_concurrent_requests_all_answered(server: ScorerHTTPServer) -> None:
    barrier = threading.Barrier(200)

    def one(_: int) -> int:
        barrier.wait(timeout=30)
        return post(server, OK_BODY, timeout=60)[0]

    with ThreadPoolExecutor(max_workers=200) as pool:
        statuses = list(pool.map(one, range(200)))
    assert statuses == [200] * 200


def test_slow_clients_hold_no_worker_and_are_timed_out(server: ScorerHTTPServer) -> None:
    before = threading.active_count()
    slow = []
    for _ in range(50):
        s = socket.create_connection(server.server_address, timeout=10)
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")  # stalls
        slow.append(s)
    try:
        assert post(server, OK_BODY, timeout=5)[0] == 200  # others are still served
        # the workers (Limits.threads) start on first use; no thread per connection
        assert threading.active_count() <= before + Limits().threads
        deadline = time.monotonic() + 15
        for s in slow:  # closed by the server once idle for channel_timeout_s (2 s here)
            s.settimeout(max(0.1, deadline - time.monotonic()))
            while s.recv(1024):  # waitress may answer (400) before it closes: read to EOF
                pass
    finally:
        for s in slow:
            s.close()
