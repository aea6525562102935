"""The console's REST API over httpx: saved credentials, errors mapped to exit codes, and
cursor-paginated lists read page by page through their ``next`` links."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from workers.cli.errors import CliError, Exit, exit_for_status

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# Uploads: no read deadline while the console stores and checks a large archive.
UPLOAD_TIMEOUT = httpx.Timeout(30.0, connect=10.0, read=600.0, write=600.0)
# What the CLI's token may do (the user's role still decides what is allowed).
CLI_SCOPES = ["read", "jobs:write", "nodes:write"]
MAX_PAGE_SIZE = 500


def config_path() -> Path:
    return Path(os.environ.get("TRAINYARD_CONFIG") or Path.home() / ".config" / "trainyard" / "config.json")


def token_name() -> str:
    """The name of this host's CLI token (token names allow letters, digits, '.', '-', '_')."""
    host = "".join(c if c.isalnum() or c in ".-_" else "-" for c in socket.gethostname())
    return f"cli-{host}"[:64]


def read_config() -> dict[str, Any]:
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"Cannot read {path}: {exc.strerror}") from None
    try:
        saved = json.loads(text)
    except ValueError:
        raise CliError(f"{path} is not valid JSON; fix it or delete it and run `trainyard login`.") from None
    if not isinstance(saved, dict):
        raise CliError(f"{path} should hold a JSON object; delete it and run `trainyard login`.")
    return saved


def write_config(values: dict[str, Any]) -> Path:
    path = config_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created with mode 600 (never readable by others, not even for a moment).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(values, out)
        path.chmod(0o600)
    except OSError as exc:
        raise CliError(f"Cannot write {path}: {exc.strerror}") from None
    return path


def forget_config() -> None:
    config_path().unlink(missing_ok=True)


def describe_error(response: httpx.Response) -> str:
    """The console's error in one line: its ``detail`` and any per-field messages."""
    try:
        body = response.json()
    except ValueError:
        text = " ".join(response.text.split())[:200]
        return f"HTTP {response.status_code} {response.reason_phrase}" + (f": {text}" if text else "")
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}: {str(body)[:200]}"
    message = str(body.get("detail") or f"HTTP {response.status_code} {response.reason_phrase}")
    errors = body.get("errors")
    if isinstance(errors, dict):
        parts = []
        for field, messages in errors.items():
            text = " ".join(map(str, messages if isinstance(messages, list) else [messages]))
            if text and text != message:
                parts.append(f"{field}: {text}")
        if parts:
            message = f"{message} ({'; '.join(parts)})"
    return f"{message} [HTTP {response.status_code}]"


def check(response: httpx.Response) -> httpx.Response:
    if response.is_redirect:
        target = response.headers.get("Location", "?")
        raise CliError(
            f"The console answered with a redirect to {target}; log in with the URL it redirects to.",
            Exit.ERROR,
        )
    if response.status_code >= 400:
        message = describe_error(response)
        if response.status_code == 401:
            message += " — run `trainyard login` again"
        elif response.status_code == 429 and response.headers.get("Retry-After"):
            message += f"; retry in {response.headers['Retry-After']} s"
        raise CliError(message, exit_for_status(response.status_code))
    return response


def unreachable(url: str, exc: Exception) -> CliError:
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        reason = f"no answer in time ({type(exc).__name__})"
    return CliError(f"Cannot reach the console at {url}: {reason}", Exit.UNREACHABLE)


@dataclass
class Console:
    url: str
    token: str | None = None

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise CliError(f"The console URL must start with http:// or https://: {self.url!r}", Exit.USAGE)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(headers=headers, timeout=TIMEOUT, follow_redirects=False)

    @classmethod
    def from_config(cls) -> Console:
        saved = read_config()
        url = os.environ.get("TRAINYARD_URL") or saved.get("url")
        token = os.environ.get("TRAINYARD_TOKEN") or saved.get("token")
        if not url or not token:
            raise CliError(
                "Not logged in: run `trainyard login --url URL` (or set TRAINYARD_URL and TRAINYARD_TOKEN).",
                Exit.AUTH,
            )
        return cls(str(url), str(token))

    def api(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            # A ``next`` link: the console builds it from the Host it saw, which behind a proxy
            # may not be the address this CLI uses; keep the path and query, use our address.
            given, base = httpx.URL(path), httpx.URL(self.url)
            return str(given.copy_with(scheme=base.scheme, host=base.host, port=base.port))
        return f"{self.url}/api/v1/{path}"

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return check(self.http.request(method, self.api(path), **kwargs))
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc) from None
        except httpx.InvalidURL as exc:
            raise CliError(f"Bad console URL {self.url!r}: {exc}", Exit.USAGE) from None

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"The console answered {path} with something that is not JSON; is {self.url} a Trainyard console?",
                Exit.UNREACHABLE,
            ) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=clean(params))

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body) if body is not None else self.call("POST", path)

    def pages(self, path: str, limit: int | None = None, **params: Any) -> Iterator[dict[str, Any]]:
        """The results of a cursor-paginated list, every page (or the first ``limit`` results),
        following each page's ``next`` link."""
        return follow_pages(
            lambda url, query: self.call("GET", url, params=query),
            path,
            limit,
            clean(params),
        )

    def all(self, path: str, limit: int | None = None, **params: Any) -> list[dict[str, Any]]:
        return list(self.pages(path, limit, **params))

    def stream_events(self, path: str, params: dict[str, Any]) -> Iterator[tuple[str, str, str | None]]:
        """The Server-Sent Events of ``path`` as they arrive (the console sends a keep-alive
        every 15 s, so a minute of silence means the connection is lost)."""
        try:
            with self.http.stream(
                "GET", self.api(path), params=clean(params), timeout=httpx.Timeout(30.0, read=60.0)
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    check(response)
                yield from sse_events(response.iter_lines())
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc) from None

    def close(self) -> None:
        self.http.close()


def clean(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def follow_pages(
    fetch: Callable[[str, dict[str, Any] | None], Any],
    path: str,
    limit: int | None,
    params: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """Yields the results of ``path`` page after page. ``fetch(url, params)`` returns a page
    (``{"results": [...], "next": url-or-None}``); the first call gets ``params`` (with a page
    size fitted to ``limit``), the next ones the ``next`` URL as it is."""
    if limit is not None and limit <= 0:
        return
    query = dict(params)
    query.setdefault("page_size", min(limit or MAX_PAGE_SIZE, MAX_PAGE_SIZE))
    page = fetch(path, query)
    given = 0
    seen: set[str] = set()
    while True:
        if not isinstance(page, dict) or not isinstance(page.get("results"), list):
            raise CliError(f"The console's answer to {path} is not a list page.", Exit.ERROR)
        for item in page["results"]:
            yield item
            given += 1
            if limit is not None and given >= limit:
                return
        following = page.get("next")
        if not following or following in seen:
            return
        seen.add(following)
        page = fetch(following, None)


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str, str, str | None]]:
    """(event, data, id) for each Server-Sent Event in a stream's lines (comments skipped)."""
    event, event_id = "message", None
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data), event_id
            event, data, event_id = "message", [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value
    if data:
        yield event, "\n".join(data), event_id
