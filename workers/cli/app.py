"""The ``trainyard`` commands (typer); see workers/cli/__init__.py for an overview."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from workers.cli import bundle as bundles
from workers.cli.client import (
    CLI_SCOPES,
    UPLOAD_TIMEOUT,
    Console,
    check,
    forget_config,
    read_config,
    token_name,
    unreachable,
    write_config,
)
from workers.cli.errors import EXIT_CODES_HELP, CliError, Exit
from workers.cli.live import LiveUnavailable, follow_job
from workers.cli.output import JOB_HEADER, NODE_HEADER, err, job_rows, node_rows, out, print_json, table, when

FOLLOW_INTERVAL = 1.0
FINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")

app = typer.Typer(
    name="trainyard",
    help=(
        "The Trainyard console from a terminal, over its REST API.\n\n"
        "Credentials live in ~/.config/trainyard/config.json (mode 600; TRAINYARD_CONFIG moves it); "
        "TRAINYARD_URL and TRAINYARD_TOKEN override them.\n\n" + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of a table.")]
OutputOption = Annotated[
    str | None, typer.Option("--output", "-o", help="'json' is the same as --json; 'table' is the default.")
]
JobId = Annotated[int, typer.Argument(help="The job's id.", min=1)]
LimitOption = Annotated[
    int | None, typer.Option("--limit", min=1, help="At most this many (default: every page).")
]


def wants_json(flag: bool, output: str | None) -> bool:
    if output not in (None, "json", "table"):
        raise CliError(f"--output must be 'json' or 'table', not {output!r}", Exit.USAGE)
    return flag or output == "json"


def console() -> Console:
    return Console.from_config()


# --- login, logout, tokens --------------------------------------------------------------------


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


# --- jobs ----------------------------------------------------------------------------------------


class SpecLoader(yaml.SafeLoader):
    """YAML as people write job specs: ``nnodes: 2:4`` is the string "2:4" (YAML 1.1 reads it as
    the base-60 number 124) and ``lr: 1e-3`` is a number (YAML 1.1 wants a dot: "1.0e-3")."""


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)
SpecLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=SpecLoader)


def load_spec(path: str, overrides: list[str]) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"Cannot read {path}: {exc.strerror}", Exit.USAGE) from None
    try:
        spec = parse_yaml(text)
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise CliError(f"{path} is not valid YAML: {problem}", Exit.INVALID) from None
    if not isinstance(spec, dict):
        raise CliError(f"{path} must hold a mapping of job spec fields.", Exit.INVALID)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set {item!r}: use key=value", Exit.USAGE)
        target = spec
        *parents, leaf = key.split(".")
        for part in parents:
            child = target.setdefault(part, {})
            if not isinstance(child, dict):
                raise CliError(f"--set {item!r}: {part} is not a mapping", Exit.USAGE)
            target = child
        target[leaf] = parse_yaml(value)
    return spec


class Counting:
    """A binary file that reports how much has been read (httpx streams it in 64 KB chunks)."""

    def __init__(self, file: Any, advance: Callable[[int], None]) -> None:
        self.file = file
        self.advance = advance

    def read(self, size: int = -1) -> bytes:
        chunk: bytes = self.file.read(size)
        self.advance(len(chunk))
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.file.seek(offset, whence))

    def tell(self) -> int:
        return int(self.file.tell())

    def fileno(self) -> int:
        return int(self.file.fileno())


def upload_bundle(
    session: Console, directory: Path, excludes: list[str], quiet: bool = False
) -> dict[str, Any]:
    """Builds ``directory``'s bundle on disk, checks it against the console's limits, then
    streams it up with a progress bar (on a terminal). Returns the console's bundle."""
    try:
        limits = session.get("bundles/limits/")
    except CliError as error:
        if error.code != Exit.NOT_FOUND:  # an older console without the endpoint: let it judge
            raise
        limits = {}
    max_bytes = limits.get("max_bytes")
    built = bundles.build_bundle(directory, excludes, max_unpacked_bytes=limits.get("max_unpacked_bytes"))
    try:
        size = built.size
        summary = (
            f"Bundle of {directory}: {built.files} files, {bundles.human(built.unpacked_bytes)} "
            f"({bundles.human(size)} compressed); {bundles.skipped_summary(built.skipped)}"
        )
        if not quiet:
            err.print(summary, highlight=False)
        if max_bytes is not None and size > max_bytes:
            raise CliError(
                f"The bundle is {bundles.human(size)}, over the console's limit of {bundles.human(max_bytes)}; "
                "leave out data with .gitignore, .trainyardignore or --exclude.",
                Exit.INVALID,
            )
        progress = Progress(
            TextColumn("Uploading"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=quiet or not err.is_terminal,
        )
        with progress, built.path.open("rb") as file:
            task = progress.add_task("upload", total=size)
            stream = Counting(file, lambda n: progress.advance(task, n))
            uploaded: dict[str, Any] = session.call(
                "POST",
                "bundles/",
                files={
                    "file": (f"{directory.resolve().name or 'bundle'}.tar.gz", stream, "application/gzip")
                },
                timeout=UPLOAD_TIMEOUT,
            )
    finally:
        built.path.unlink(missing_ok=True)
    return uploaded


ExcludeOption = Annotated[
    list[str] | None,
    typer.Option("--exclude", "-x", help="Leave out paths matching this gitignore pattern (repeatable)."),
]


@app.command()
def submit(
    spec_file: Annotated[
        str, typer.Argument(metavar="SPEC", help="A YAML/JSON job spec file ('-' for stdin).")
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Override a field (dots for nesting)."),
    ] = None,
    bundle: Annotated[
        Path | None,
        typer.Option("--bundle", "--workdir", metavar="DIR", help="Upload DIR as the job's code bundle."),
    ] = None,
    exclude: ExcludeOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Submit a job; with --bundle DIR, upload DIR's code first.

    The bundle leaves out .git, virtualenvs, __pycache__, node_modules, and what DIR's
    .gitignore files, its .trainyardignore and --exclude patterns name.
    """
    as_json = wants_json(json_flag, output)
    spec = load_spec(spec_file, set_ or [])
    session = console()
    if bundle is not None:
        uploaded = upload_bundle(session, bundle, exclude or [], quiet=as_json)
        spec["bundle"] = uploaded["id"]
        if not as_json:
            err.print(
                f"Uploaded bundle {uploaded['id']} ({uploaded['sha256'][:12]}, {uploaded['size_bytes']} bytes)"
            )
    job = session.post("jobs/", spec)
    if as_json:
        print_json(job)
    else:
        out.print(f"Submitted job {job['id']} ({job['name']}): {job['state']}", highlight=False)


@app.command("bundle")
def bundle_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="The directory to upload.")],
    exclude: ExcludeOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would go into the bundle; upload nothing.")
    ] = False,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Upload DIR as a code bundle (as submit --bundle does) and print its id."""
    as_json = wants_json(json_flag, output)
    if dry_run:
        names: list[str] = []
        built = bundles.build_bundle(directory, exclude or [], on_file=lambda name, size: names.append(name))
        try:
            compressed = built.size
        finally:
            built.path.unlink(missing_ok=True)
        summary = {
            "files": names,
            "unpacked_bytes": built.unpacked_bytes,
            "compressed_bytes": compressed,
            "skipped": built.skipped,
        }
        if as_json:
            print_json(summary)
        else:
            for name in names:
                sys.stdout.write(name + "\n")
            err.print(
                f"{len(names)} files, {bundles.human(built.unpacked_bytes)} "
                f"({bundles.human(compressed)} compressed); {bundles.skipped_summary(built.skipped)}",
                highlight=False,
            )
        return
    uploaded = upload_bundle(console(), directory, exclude or [], quiet=as_json)
    if as_json:
        print_json(uploaded)
    else:
        out.print(f"Bundle {uploaded['id']} ({uploaded['sha256'][:12]}, {uploaded['size_bytes']} bytes)")


@app.command("ls")
def list_jobs(
    state: Annotated[str | None, typer.Option(help="e.g. RUNNING or PENDING,RUNNING")] = None,
    owner: Annotated[str | None, typer.Option(help="Submitted by this username.")] = None,
    name: Annotated[str | None, typer.Option(help="Names starting with this.")] = None,
    created_after: Annotated[str | None, typer.Option(help="Submitted at or after (ISO 8601).")] = None,
    created_before: Annotated[str | None, typer.Option(help="Submitted before (ISO 8601).")] = None,
    sort: Annotated[
        str | None, typer.Option(help="e.g. -created_at, name, priority ('-': descending).")
    ] = None,
    limit: LimitOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """List jobs (every page, or --limit)."""
    as_json = wants_json(json_flag, output)
    jobs = console().all(
        "jobs/",
        limit,
        state=state,
        owner=owner,
        name=name,
        created_after=created_after,
        created_before=created_before,
        sort=sort,
    )
    if as_json:
        print_json(jobs)
    else:
        out.print(table(job_rows(jobs), JOB_HEADER))


@app.command()
def show(job: JobId, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """One job with its recent rounds."""
    detail = console().get(f"jobs/{job}/")
    if wants_json(json_flag, output):
        print_json(detail)
        return
    out.print(table(job_rows([detail]), JOB_HEADER))
    failure = detail.get("failure")
    if failure:
        out.print(
            f"\nFailed: rank {failure.get('rank')} on {failure.get('node')} "
            f"(exit {failure.get('exit_code')}, signal {failure.get('signal')})",
            highlight=False,
        )
        out.print(failure.get("error", ""), markup=False, highlight=False)
    rounds = [
        [
            r.get("number"),
            r.get("reason"),
            r.get("world_size"),
            " ".join(a["node"] for a in r.get("allocations", [])),
            r.get("outcome"),
        ]
        for r in detail.get("rounds", [])
    ]
    out.print()
    out.print(table(rounds, ["ROUND", "REASON", "WORLD", "NODES", "OUTCOME"], title="Rounds"))


def job_line(job: dict[str, Any]) -> str:
    return (
        f"Job {job['id']}: {job['state']}, round {job.get('round')}, world {job.get('world_size')} "
        f"on {','.join(job.get('nodes') or []) or '-'}"
    )


def job_action(path: str, body: Any, as_json: bool) -> None:
    job = console().post(path, body)
    if as_json:
        print_json(job)
    else:
        out.print(job_line(job), highlight=False)


@app.command()
def scale(
    job: JobId,
    nodes: Annotated[int, typer.Argument(help="The number of nodes wanted (with --role: processes).", min=1)],
    role: Annotated[
        str | None,
        typer.Option(
            "--role", help="Resize this role of a parameter_server job: worker or ps.", show_default=False
        ),
    ] = None,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Resize a job to NODES nodes (within its MIN:MAX), or a parameter_server job's role to NODES
    processes (--role worker: in place; --role ps: a new round)."""
    body = {"role": role, "count": nodes} if role else {"nodes": nodes}
    job_action(f"jobs/{job}/resize/", body, wants_json(json_flag, output))


@app.command()
def restart(job: JobId, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Restart a running job's ranks (a new round)."""
    job_action(f"jobs/{job}/restart/", None, wants_json(json_flag, output))


@app.command()
def stop(job: JobId, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Stop a job."""
    job_action(f"jobs/{job}/stop/", None, wants_json(json_flag, output))


@app.command()
def logs(
    job: JobId,
    rank: Annotated[int | None, typer.Option(help="Only this rank.", min=0)] = None,
    grep: Annotated[str | None, typer.Option(help="Only lines containing this text.")] = None,
    tail: Annotated[int, typer.Option(help="Start with the last N lines.", min=1, max=5000)] = 200,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C ends).")
    ] = False,
    json_flag: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    output: OutputOption = None,
) -> None:
    """A job's log lines; with -f, new ones as they come until the job ends (a live stream)."""
    session = console()
    as_json = wants_json(json_flag, output)

    def emit(line: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(line) + "\n" if as_json else f"[{line['rank']}] {line['text']}\n")

    if not follow_:
        for line in session.get(f"jobs/{job}/logs/", rank=rank, q=grep, limit=tail)["lines"]:
            emit(line)
        sys.stdout.flush()
        return
    after: int | None = None
    while True:
        query = {"rank": rank, "q": grep, "after": after, "tail": tail if after is None else None}
        for event, data, _ in session.stream_events(f"jobs/{job}/logs/stream/", query):
            body = json.loads(data)
            if event == "line":
                emit(body)
                after = body["id"]
                sys.stdout.flush()
            elif event == "end":
                after = body.get("last_id", after)
                if body.get("reason") == "finished":
                    return
            elif event == "error":
                raise CliError(str(body.get("detail") or body), Exit.ERROR)
        # The stream ended without the job finishing (its timeout, a dropped connection): resume.
        time.sleep(FOLLOW_INTERVAL)


@app.command()
def events(
    job: JobId, limit: LimitOption = None, json_flag: JsonOption = False, output: OutputOption = None
) -> None:
    """A job's events, oldest first (every page, or --limit)."""
    items = console().all(f"jobs/{job}/events/", limit)
    if wants_json(json_flag, output):
        print_json(items)
        return
    rows = [
        [
            e.get("seq"),
            when(e.get("at")),
            e.get("severity"),
            e.get("kind"),
            e.get("round"),
            e.get("node"),
            e.get("message"),
        ]
        for e in items
    ]
    out.print(table(rows, ["SEQ", "AT", "SEVERITY", "KIND", "ROUND", "NODE", "MESSAGE"]))


@app.command()
def checkpoints(
    job: JobId, limit: LimitOption = None, json_flag: JsonOption = False, output: OutputOption = None
) -> None:
    """A job's checkpoints, newest step first (every page, or --limit)."""
    items = console().all(f"jobs/{job}/checkpoints/", limit)
    if wants_json(json_flag, output):
        print_json(items)
        return
    rows = [
        [
            c.get("round"),
            c.get("step"),
            bundles.human(c.get("size_bytes") or 0),
            c.get("blocking_ms"),
            when(c.get("created_at")),
            c.get("path"),
        ]
        for c in items
    ]
    out.print(table(rows, ["ROUND", "STEP", "SIZE", "BLOCKING MS", "AT", "PATH"]))


@app.command()
def metrics(
    job: JobId,
    name: Annotated[str | None, typer.Option(help="Comma-separated series names (default: all).")] = None,
    points: Annotated[int, typer.Option(help="Buckets per series.", min=1)] = 20,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep a live table until the job ends.")
    ] = False,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """A job's metric series, bucketed; with --follow, live until the job ends: the history's
    buckets, then each new point as the job's websocket brings it (a table of the latest values
    on a terminal, lines otherwise, JSON lines with --json; a live point is a bucket of one).
    Polls the API every second instead when the websocket cannot be opened."""
    session = console()
    as_json = wants_json(json_flag, output)

    def fetch() -> tuple[dict[str, list[dict[str, Any]]], str]:
        body = session.get(f"jobs/{job}/metrics/", name=name, points=points)
        return body["series"], session.get(f"jobs/{job}/")["state"]

    def bucket_row(series: str, bucket: dict[str, Any]) -> list[Any]:
        steps = f"{bucket.get('step')}-{bucket.get('last_step')}"
        return [series, steps, bucket.get("mean"), bucket.get("min"), bucket.get("max"), bucket.get("count")]

    header = ["SERIES", "STEPS", "MEAN", "MIN", "MAX", "N"]
    series, state = fetch()
    if not follow_:
        if as_json:
            print_json({"job": job, "state": state, "series": series})
        else:
            rows = [bucket_row(n, b) for n, buckets in sorted(series.items()) for b in buckets]
            out.print(table(rows, header, title=f"job {job} — {state}"))
        return
    names = set(name.split(",")) if name else None
    lines = as_json or not out.is_terminal
    shown: dict[str, int] = {}  # the last step printed (or tabled) per series
    latest: dict[str, list[Any]] = {}  # series -> [step, value, min, max] for the live table

    def take(n: str, bucket: dict[str, Any]) -> None:
        if bucket["last_step"] <= shown.get(n, -1):
            return
        shown[n] = bucket["last_step"]
        row = latest.get(n)
        low, high = bucket.get("min"), bucket.get("max")
        if row is not None:
            low = min((v for v in (low, row[2]) if v is not None), default=None)
            high = max((v for v in (high, row[3]) if v is not None), default=None)
        latest[n] = [bucket["last_step"], bucket.get("mean"), low, high]
        if as_json:
            sys.stdout.write(json.dumps({"series": n, **bucket}) + "\n")
        elif lines:
            sys.stdout.write("  ".join(str(c) for c in bucket_row(n, bucket)) + "\n")

    def take_all(fetched: dict[str, list[dict[str, Any]]]) -> None:
        for n, buckets in sorted(fetched.items()):
            for bucket in buckets:
                take(n, bucket)
        sys.stdout.flush()

    def view() -> Any:
        rows = [[n, *row] for n, row in sorted(latest.items())]
        title = f"job {job} — {state} — {time.strftime('%H:%M:%S')}"
        return table(rows, ["SERIES", "STEP", "VALUE", "MIN", "MAX"], title=title)

    with contextlib.ExitStack() as stack:
        live = None if lines else stack.enter_context(Live(view(), console=out, refresh_per_second=4))

        def refresh() -> None:
            if live is not None:
                live.update(view())

        take_all(series)
        refresh()
        if state in FINAL_STATES:
            return
        # Live frames over the job's websocket; polling the REST API when it cannot be had.
        try:
            assert session.token is not None
            for message in follow_job(session.url, session.token, job):
                kind = message.get("type") if message is not None else None
                if message is not None and kind == "metrics":
                    for n, live_points in sorted(message["series"].items()):
                        if names is None or n in names:
                            for step, value in live_points:
                                take(n, point_bucket(step, value))
                    sys.stdout.flush()
                elif message is not None and kind == "state":
                    state = message["job"]["state"]
                refresh()
                if state in FINAL_STATES:
                    return
        except LiveUnavailable as exc:
            err.print(f"Live updates unavailable ({exc}); polling every {FOLLOW_INTERVAL:g} s.")
        while state not in FINAL_STATES:
            time.sleep(FOLLOW_INTERVAL)
            series, state = fetch()
            take_all(series)
            refresh()


def point_bucket(step: int, value: float | None) -> dict[str, Any]:
    """A live point in the shape of a metrics bucket (of one point), so --json lines have one shape."""
    return {"step": step, "last_step": step, "mean": value, "min": value, "max": value, "count": 1}


# --- nodes ---------------------------------------------------------------------------------------


@app.command()
def nodes(json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Cluster nodes (every page)."""
    items = console().all("nodes/")
    if wants_json(json_flag, output):
        print_json(items)
    else:
        out.print(table(node_rows(items), NODE_HEADER))


def node_id(session: Console, node: str) -> int:
    if node.isdigit():
        return int(node)
    for item in session.pages("nodes/"):
        if item.get("name") == node:
            return int(item["id"])
    raise CliError(f"No node named {node!r}.", Exit.NOT_FOUND)


def node_action(node: str, action: str, as_json: bool) -> None:
    session = console()
    item = session.post(f"nodes/{node_id(session, node)}/{action}/")
    if as_json:
        print_json(item)
    else:
        out.print(f"Node {item['name']}: {item['state']}", highlight=False)


NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="The node's name or id.")]


@app.command()
def drain(node: NodeArg, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Drain a node: its jobs move off it and nothing new is placed there."""
    node_action(node, "drain", wants_json(json_flag, output))


@app.command()
def undrain(node: NodeArg, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Put a drained node back in service."""
    node_action(node, "undrain", wants_json(json_flag, output))


@app.command()
def top(
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and end.")] = False,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Live view of nodes, running and pending jobs."""
    session = console()
    as_json = wants_json(json_flag, output)

    def snapshot() -> dict[str, Any]:
        return {
            "nodes": session.all("nodes/"),
            "running": session.all("jobs/", 50, state="RUNNING"),
            "pending": session.all("jobs/", 50, state="PENDING"),
        }

    def render(data: dict[str, Any]) -> Group:
        gpus = sum(len(n.get("gpus") or []) for n in data["nodes"])
        return Group(
            f"trainyard top — {session.url} — {time.strftime('%H:%M:%S')} — {len(data['nodes'])} nodes, {gpus} GPUs",
            table(node_rows(data["nodes"]), NODE_HEADER, title="Nodes"),
            table(job_rows(data["running"]), JOB_HEADER, title="Running"),
            table(job_rows(data["pending"]), JOB_HEADER, title="Pending"),
        )

    if as_json:
        print_json(snapshot())
        return
    if once or not out.is_terminal:
        out.print(render(snapshot()))
        return
    with Live(render(snapshot()), console=out, refresh_per_second=2, screen=True) as live:
        while True:
            time.sleep(2 * FOLLOW_INTERVAL)
            live.update(render(snapshot()))
