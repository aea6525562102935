"""``trainyard login``, ``logout`` and ``tokens``: the CLI's own API token."""

from __future__ import annotations

import getpass
import os
from typing import Annotated

import httpx
import typer

from workers.cli.base import (
    JsonOption,
    OutputOption,
    app,
    console,
    wants_json,
)
from workers.cli.client import (
    CLI_SCOPES,
    Console,
    check,
    forget_config,
    read_config,
    token_name,
    unreachable,
    write_config,
)
from workers.cli.errors import CliError, Exit
from workers.cli.output import err, out, print_json, table, when


def token_from_password(url: str, username: str, password: str, name: str | None = None) -> str:
    """Exchanges a password for this host's CLI token. The console replaces a live token of the
    same name, so logging in again does not pile tokens up."""
    base = url.rstrip("/")
    try:
        response = httpx.post(
            f"{base}/api/v1/auth/token/",
            json={
                "username": username,
                "password": password,
                "name": name or token_name(),
                "scopes": CLI_SCOPES,
                "replace": True,
            },
            timeout=30,
        )
    except httpx.TransportError as exc:
        raise unreachable(base, exc) from None
    except httpx.InvalidURL as exc:
        raise CliError(f"Bad console URL {url!r}: {exc}", Exit.USAGE) from None
    if response.status_code == 401:
        raise CliError("Login failed: wrong username or password.", Exit.AUTH)
    if response.status_code == 404:
        raise CliError(f"{base} has no Trainyard API (HTTP 404 on /api/v1/auth/token/).", Exit.NOT_FOUND)
    token: str = check(response).json()["token"]
    return token


def revoke_quietly(url: str, token: str) -> bool:
    """Revokes ``token`` on the console if it is still live; False when it could not be (already
    revoked, expired, or the console is away)."""
    try:
        Console(url, token).call("DELETE", "tokens/current/")
    except CliError:
        return False
    return True


@app.command()
def login(
    url: Annotated[str, typer.Option(help="The console, e.g. http://console:8000.", envvar="TRAINYARD_URL")],
    username: Annotated[
        str | None, typer.Option(help="Sign in as this user (asks for the password).")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="Use this API token instead of a password (made on the Tokens page).",
            envvar="TRAINYARD_TOKEN",
        ),
    ] = None,
) -> None:
    """Sign in: get this host's CLI token (replacing the one an earlier login made) and save it.

    The password is asked for, or read from TRAINYARD_PASSWORD.
    """
    url = url.rstrip("/")
    try:
        saved = read_config()
    except CliError:  # a damaged config file: logging in writes a good one
        saved = {}
    if token is None:
        user = username or typer.prompt("Username")
        password = os.environ.get("TRAINYARD_PASSWORD") or getpass.getpass("Password: ")
        token = token_from_password(url, user, password)
        own = True
    else:
        own = False
    session = Console(url, token)
    current = session.get("tokens/current/")  # proves the token works
    old_url, old_token = saved.get("url"), saved.get("token")
    revoked_old = False
    if old_token and old_token != token and saved.get("own", True) and isinstance(old_url, str):
        # The token an earlier login here made (for another user or console, or not replaced by
        # name): revoke it rather than leave it live and forgotten.
        revoked_old = revoke_quietly(old_url, str(old_token))
    path = write_config({"url": url, "token": token, "own": own, "token_name": current.get("name")})
    note = " (the previous CLI token is revoked)" if revoked_old else ""
    err.print(f"Logged in to {url} with token {current.get('name')!r}{note}; saved in {path}")


@app.command()
def logout() -> None:
    """Revoke this CLI's token on the console and forget it here."""
    saved = read_config()
    if not saved.get("token"):
        raise CliError("Not logged in (nothing saved); nothing to do.", Exit.AUTH)
    session = Console(str(saved.get("url")), str(saved["token"]))
    try:
        session.call("DELETE", "tokens/current/")
    except CliError as error:
        if error.code != Exit.AUTH:  # a token already revoked or expired: forget it all the same
            raise
    forget_config()
    err.print(f"Logged out of {session.url}; the token is revoked and forgotten.")


@app.command()
def tokens(json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Your live API tokens."""
    items = console().all("tokens/")
    if wants_json(json_flag, output):
        print_json(items)
        return
    rows = [
        [
            t["id"],
            t["name"],
            t["prefix"],
            ",".join(t["scopes"]),
            when(t["created_at"]),
            when(t["expires_at"]) or "never",
            when(t["last_used_at"]),
        ]
        for t in items
    ]
    out.print(table(rows, ["ID", "NAME", "PREFIX", "SCOPES", "CREATED", "EXPIRES", "LAST USED"]))
