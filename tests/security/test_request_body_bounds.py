"""Attack: send the web server a huge request body without being signed in. Daphne (Twisted) used
to spool any body to disk before the console saw the request, so anyone who could reach the port
could fill the disk. Now (console/webserver.py) a too-large Content-Length is answered 413 before
a byte of the body is read, an unauthenticated body is cut off at ANONYMOUS_BODY_MAX_BYTES as it
streams, a forged credential counts as none, and a malformed multipart body gets a JSON error.

Run against the real web server (the ``console_url`` fixture) over raw sockets."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlsplit

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User

from console.api.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)

ATTEMPT = 64 * 1024 * 1024  # what the attacker tries to send
BOUND = 8 * 1024 * 1024  # what the server may take in before it refuses (socket buffers included)


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    return sock


def read_response(sock: socket.socket, within: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    data = b""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if _ and b"content-length:" in head.lower():
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(body) >= length:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines and lines[0].startswith("HTTP/1."), data[:200]
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def head(path: str, extra: str = "", **fields: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in fields.items())]
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def stream_until_refused(sock: socket.socket) -> tuple[int, bytes | None]:
    """Send a chunked body of up to ATTEMPT bytes; returns (bytes sent, response if one came)."""
    chunk = b"x" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    sock.settimeout(5)
    try:
        while sent < ATTEMPT:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            sock.sendall(framed)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    try:
        status, _, body = read_response(sock, within=10)
        return sent, body if status == 413 else None
    except (AssertionError, OSError):
        return sent, None


def test_bodies_without_a_valid_credential_are_refused_before_they_are_spooled(console_url: str) -> None:
    # A huge Content-Length: 413 at once, not after a body that never comes.
    sock = connect(console_url)
    sock.sendall(head("/api/v1/bundles/", **{"Content-Length": str(10 * 1024**3), "Content-Type": "x/y"}))
    started = time.monotonic()
    status, headers, body = read_response(sock)
    assert status == 413 and headers["content-type"] == "application/json", body
    assert "larger than the limit" in json.loads(body)["detail"]
    assert time.monotonic() - started < 10

    # Just over the anonymous limit, announced, to an endpoint anyone may call.
    sock = connect(console_url)
    size = settings.ANONYMOUS_BODY_MAX_BYTES + 1
    sock.sendall(
        head("/api/v1/auth/token/", **{"Content-Length": str(size), "Content-Type": "application/json"})
    )
    status, _, body = read_response(sock)
    assert status == 413 and "needs a valid API token or session" in json.loads(body)["detail"]

    # Streamed (chunked, no length) with no credential, a forged token, a forged session.
    for credential in ("none", "forged token", "forged session"):
        fields = {"Transfer-Encoding": "chunked", "Content-Type": "application/octet-stream"}
        if credential == "forged token":
            fields["Authorization"] = "Bearer ty_forged-0123456789abcdefghijklmnop"
        elif credential == "forged session":
            fields["Cookie"] = "sessionid=abcdefghijklmnopqrstuvwxyz012345"
        sock = connect(console_url)
        sock.sendall(head("/api/v1/bundles/", **fields))
        sent, refusal = stream_until_refused(sock)
        assert sent < BOUND, f"{credential}: the server took {sent} bytes of an unauthenticated body"
        assert refusal is not None and b"needs a valid API token or session" in refusal, credential


def test_a_valid_credential_may_send_a_large_body_and_bad_multipart_is_json(
    console_url: str, operator: User
) -> None:
    """2 MB (over the anonymous limit) reaches the console and is stored (zeros: an empty tar)."""
    _, raw = ApiToken.issue(operator, "upload", ["read", "jobs:write"])
    answer = requests.post(
        f"{console_url}/api/v1/bundles/",
        files={"file": ("b.tar.gz", b"\0" * (2 * 1024 * 1024), "application/gzip")},
        headers={"Authorization": f"Bearer {raw}"},
        timeout=60,
    )
    assert answer.status_code == 201 and answer.json()["size_bytes"] == 2 * 1024 * 1024, answer.text
    # A signed-in session too (the browser's upload form).
    session = requests.Session()
    login = session.get(f"{console_url}/accounts/login/", timeout=60)
    form = {
        "username": "olivia",
        "password": "pw-operator-1",
        "csrfmiddlewaretoken": login.cookies["csrftoken"],
    }
    session.post(f"{console_url}/accounts/login/", data=form, headers={"Referer": login.url}, timeout=60)
    big = session.post(
        f"{console_url}/api/v1/bundles/",
        files={"file": ("c.tar.gz", b"\0" * (3 * 1024 * 1024), "application/gzip")},
        headers={"X-CSRFToken": session.cookies["csrftoken"]},
        timeout=60,
    )
    assert big.status_code == 201, big.text

    # Twisted parsed multipart bodies itself and answered one it could not parse with a bare 400.
    for content_type in ("multipart/form-data", "multipart/form-data; boundary=zzz"):
        answer = requests.post(
            f"{console_url}/api/v1/jobs/",
            data=b"not a multipart body",
            headers={"Authorization": f"Bearer {raw}", "Content-Type": content_type},
            timeout=60,
        )
        assert answer.status_code == 400, (content_type, answer.status_code)
        assert answer.headers.get("Content-Type", "").startswith("application/json"), (
            content_type,
            answer.headers,
            answer.content[:300],
        )
        assert answer.json()["detail"]
