"""``trainyard``: the console from a terminal, over the REST API (no Django needed).

    trainyard login --url http://console:8000 --username olivia      # asks for the password
    trainyard logout                                                  # revokes the token
    trainyard submit job.yaml [--set nproc_per_node=2] [--bundle ./src]
    trainyard ls [--state RUNNING]      trainyard show 12
    trainyard scale 12 3                trainyard restart 12       trainyard stop 12
    trainyard scale 12 4 --role worker  (a parameter_server job: resize its worker or ps role)
    trainyard logs 12 [--rank 0] [-f]   trainyard metrics 12 [--name loss] [--follow]
    trainyard nodes                     trainyard top

The job spec file (YAML or JSON) has the API's fields: name, workload or entrypoint + args
(+ bundle or workdir), nnodes ("2" or "2:4"), nproc_per_node, gpus_per_proc, strategy,
precision, grad_accum_steps, max_restarts, priority, env, hyperparameters, and for
``strategy: parameter_server`` its roles: ``roles: {ps: {count: 2}, worker: {count: 3, min: 1, max: 8}}``.

Credentials live in ~/.config/trainyard/config.json (mode 600); TRAINYARD_URL and
TRAINYARD_TOKEN override them.
"""

from __future__ import annotations

import argparse
import getpass
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import requests
import yaml

CONFIG = Path(os.environ.get("TRAINYARD_CONFIG", Path.home() / ".config" / "trainyard" / "config.json"))
TIMEOUT = 30
FOLLOW_INTERVAL = 1.0
# What the CLI's token may do (the user's role still decides what is allowed).
CLI_SCOPES = ["read", "jobs:write", "nodes:write"]


class CliError(Exception):
    """A failure the user can act on; printed without a traceback."""


# --- talking to the console ---------------------------------------------------------------------


class Console:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    def from_config(cls) -> Console:
        saved: dict[str, str] = {}
        if CONFIG.exists():
            saved = json.loads(CONFIG.read_text())
        url = os.environ.get("TRAINYARD_URL") or saved.get("url")
        token = os.environ.get("TRAINYARD_TOKEN") or saved.get("token")
        if not url or not token:
            raise CliError(
                "Not logged in: run `trainyard login --url URL` (or set TRAINYARD_URL and TRAINYARD_TOKEN)."
            )
        return cls(url, token)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.session.request(method, f"{self.url}/api/v1/{path}", timeout=TIMEOUT, **kwargs)
        except requests.RequestException as exc:
            raise CliError(f"Cannot reach the console at {self.url}: {exc}") from None
        if response.status_code >= 400:
            raise CliError(describe_error(response))
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def get_all(self, path: str, limit: int | None = None, **params: Any) -> list[Any]:
        """Every result of a cursor-paginated list (up to ``limit``), following its next links."""
        body = self.get(path, **params)
        results: list[Any] = list(body["results"])
        while body.get("next") and (limit is None or len(results) < limit):
            try:
                response = self.session.get(body["next"], timeout=TIMEOUT)
            except requests.RequestException as exc:
                raise CliError(f"Cannot reach the console at {self.url}: {exc}") from None
            if response.status_code >= 400:
                raise CliError(describe_error(response))
            body = response.json()
            results.extend(body["results"])
        return results[:limit] if limit is not None else results

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return (
            self.call("POST", path, json=body, **kwargs)
            if body is not None
            else self.call("POST", path, **kwargs)
        )


def describe_error(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    message = body.get("detail", f"HTTP {response.status_code}") if isinstance(body, dict) else str(body)
    errors = body.get("errors") if isinstance(body, dict) else None
    if isinstance(errors, dict):
        lines = [
            f"  {field}: {' '.join(map(str, msgs if isinstance(msgs, list) else [msgs]))}"
            for field, msgs in errors.items()
        ]
        message += "\n" + "\n".join(lines)
    return f"{message} (HTTP {response.status_code})"


# --- output -------------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def progress_text(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    step, total = progress.get("step"), progress.get("total")
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


def job_rows(jobs: Iterable[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            j["id"],
            j["name"],
            j["state"],
            j["nnodes"],
            j["world_size"],
            j["round"],
            f"{j['restarts']}/{j['max_restarts']}",
            progress_text(j),
            ",".join(j["nodes"]) or "-",
        ]
        for j in jobs
    ]


JOB_HEADER = ["ID", "NAME", "STATE", "NODES", "WORLD", "ROUND", "RESTARTS", "STEP", "ON"]


def node_rows(nodes: Iterable[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            n["name"],
            n["state"],
            n["address"],
            n["slots"],
            len(n["gpus"]),
            f"{n['cpu_percent']:.0f}%",
            f"{n['memory_percent']:.0f}%",
            n["last_heartbeat"] or "-",
        ]
        for n in nodes
    ]


NODE_HEADER = ["NAME", "STATE", "ADDRESS", "SLOTS", "GPUS", "CPU", "MEM", "LAST HEARTBEAT"]


# --- commands -----------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> None:
    url = args.url.rstrip("/")
    token = args.token or os.environ.get("TRAINYARD_TOKEN")
    if not token:
        username = args.username or input("Username: ")
        password = os.environ.get("TRAINYARD_PASSWORD") or getpass.getpass("Password: ")
        token = token_from_password(url, username, password)
    Console(url, token).get("jobs/", page_size=1)  # proves the token works
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(json.dumps({"url": url, "token": token}))
    CONFIG.chmod(0o600)
    print(f"Logged in to {url}; credentials saved in {CONFIG}")


def token_from_password(url: str, username: str, password: str) -> str:
    """Exchange the password for this CLI's personal API token. The token is named after this
    host and replaces the one an earlier login here made, so logins do not pile tokens up."""
    try:
        response = requests.post(
            f"{url}/api/v1/auth/token/",
            json={
                "username": username,
                "password": password,
                "name": f"cli-{os.uname().nodename}"[:64],
                "scopes": CLI_SCOPES,
                "replace": True,
            },
            timeout=TIMEOUT,
        )
    except requests.RequestException as exc:
        raise CliError(f"Cannot reach the console at {url}: {exc}") from None
    if response.status_code == 401:
        raise CliError("Login failed: wrong username or password.")
    if response.status_code != 201:
        raise CliError(describe_error(response))
    token: str = response.json()["token"]
    return token


def cmd_logout(args: argparse.Namespace) -> None:
    """Revoke this CLI's token on the console and forget it here."""
    console = Console.from_config()
    console.call("DELETE", "tokens/current/")
    if CONFIG.exists():
        CONFIG.unlink()
    print(f"Logged out of {console.url}; the token is revoked.")


def load_spec(path: str, overrides: Sequence[str]) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"Cannot read {path}: {exc}") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(spec, dict):
        raise CliError(f"{path} must hold a mapping of job spec fields.")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--set {item!r}: use key=value")
        target = spec
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = yaml.safe_load(value)
    return spec


def bundle_directory(directory: Path) -> bytes:
    if not directory.is_dir():
        raise CliError(f"{directory} is not a directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            if "__pycache__" in path.parts or path.is_symlink():
                continue
            archive.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buffer.getvalue()


def cmd_submit(args: argparse.Namespace) -> None:
    console = Console.from_config()
    spec = load_spec(args.spec, args.set or [])
    if args.bundle:
        data = bundle_directory(Path(args.bundle))
        uploaded = console.call(
            "POST", "bundles/", files={"file": ("bundle.tar.gz", data, "application/gzip")}
        )
        spec["bundle"] = uploaded["id"]
        print(f"Uploaded bundle {uploaded['sha256'][:12]} ({len(data)} bytes)")
    job = console.post("jobs/", spec)
    print(f"Submitted job {job['id']} ({job['name']}): {job['state']}")


def cmd_ls(args: argparse.Namespace) -> None:
    jobs = Console.from_config().get_all(
        "jobs/", limit=args.limit, state=args.state, page_size=min(args.limit, 500)
    )
    print(table(job_rows(jobs), JOB_HEADER))


def cmd_show(args: argparse.Namespace) -> None:
    job = Console.from_config().get(f"jobs/{args.job}/")
    if args.json:
        print(json.dumps(job, indent=2))
        return
    print(table(job_rows([job]), JOB_HEADER))
    if job.get("failure"):
        failure = job["failure"]
        print(
            f"\nFailed: rank {failure.get('rank')} on {failure.get('node')} (exit {failure.get('exit_code')}, signal {failure.get('signal')})"
        )
        print(failure.get("error", ""))
    print("\nRounds:")
    rounds = [
        [
            r["number"],
            r["reason"],
            r["world_size"],
            " ".join(a["node"] for a in r["allocations"]),
            r["outcome"] or "-",
        ]
        for r in job.get("rounds", [])
    ]
    print(table(rounds, ["ROUND", "REASON", "WORLD", "NODES", "OUTCOME"]))


def cmd_scale(args: argparse.Namespace) -> None:
    body = {"role": args.role, "count": args.nodes} if args.role else {"nodes": args.nodes}
    job = Console.from_config().post(f"jobs/{args.job}/resize/", body)
    print(
        f"Job {job['id']}: {job['state']}, round {job['round']}, world {job['world_size']} on {','.join(job['nodes']) or '-'}"
    )


def cmd_restart(args: argparse.Namespace) -> None:
    job = Console.from_config().post(f"jobs/{args.job}/restart/")
    print(f"Job {job['id']}: {job['state']}, round {job['round']}")


def cmd_stop(args: argparse.Namespace) -> None:
    job = Console.from_config().post(f"jobs/{args.job}/stop/")
    print(f"Job {job['id']}: {job['state']}")


def follow(fetch: Callable[[], bool], enabled: bool) -> None:
    """Call ``fetch`` once, or until Ctrl-C (or until it returns False) when following."""
    more = fetch()
    while enabled and more:
        time.sleep(FOLLOW_INTERVAL)
        more = fetch()


def cmd_logs(args: argparse.Namespace) -> None:
    console = Console.from_config()
    after: int | None = None

    def fetch() -> bool:
        nonlocal after
        body = console.get(
            f"jobs/{args.job}/logs/",
            rank=args.rank,
            q=args.grep,
            after=after,
            limit=args.tail if after is None else 1000,
        )
        for line in body["lines"]:
            print(f"[{line['rank']}] {line['text']}")
        after = body["last_id"] if body["last_id"] is not None else after
        return True

    follow(fetch, args.follow)


def cmd_metrics(args: argparse.Namespace) -> None:
    console = Console.from_config()
    shown: dict[str, int] = {}

    def fetch() -> bool:
        body = console.get(f"jobs/{args.job}/metrics/", name=args.name, points=args.points)
        for name, buckets in sorted(body["series"].items()):
            for bucket in buckets:
                if bucket["last_step"] <= shown.get(name, -1):
                    continue
                print(f"{name:>16}  step {bucket['last_step']:>8}  {bucket['mean']}")
                shown[name] = bucket["last_step"]
        state = console.get(f"jobs/{args.job}/")["state"]
        return state not in ("SUCCEEDED", "FAILED", "STOPPED")

    follow(fetch, args.follow)


def cmd_nodes(args: argparse.Namespace) -> None:
    nodes = Console.from_config().get_all("nodes/", page_size=500)
    print(table(node_rows(nodes), NODE_HEADER))


def cmd_top(args: argparse.Namespace) -> None:
    console = Console.from_config()

    def fetch() -> bool:
        jobs = console.get("jobs/", page_size=20)["results"]
        nodes = console.get_all("nodes/", page_size=500)
        if sys.stdout.isatty():
            print("\x1b[2J\x1b[H", end="")
        print(f"trainyard top — {console.url} — {time.strftime('%H:%M:%S')}\n")
        print(table(node_rows(nodes), NODE_HEADER))
        print()
        print(table(job_rows(jobs), JOB_HEADER))
        return True

    follow(fetch, not args.once)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainyard", description="Trainyard console from the terminal.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("login", help="save the console URL and an API token")
    p.add_argument("--url", required=True)
    p.add_argument("--token", help="an API token (else sign in with username and password)")
    p.add_argument("--username")
    p.set_defaults(func=cmd_login)

    p = sub.add_parser("logout", help="revoke this CLI's API token and forget it")
    p.set_defaults(func=cmd_logout)

    p = sub.add_parser("submit", help="submit a job from a YAML/JSON spec file ('-' for stdin)")
    p.add_argument("spec")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field (dots for nesting)")
    p.add_argument("--bundle", metavar="DIR", help="upload DIR as the job's code bundle")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("ls", help="list jobs")
    p.add_argument("--state", help="e.g. RUNNING or PENDING,RUNNING")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("show", help="one job with its rounds")
    p.add_argument("job", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("scale", help="resize a job to N nodes (or a parameter_server role to N processes)")
    p.add_argument("job", type=int)
    p.add_argument("nodes", type=int, help="nodes, or with --role the role's process count")
    p.add_argument("--role", choices=["worker", "ps"], help="resize this role of a parameter_server job")
    p.set_defaults(func=cmd_scale)

    for name, func, text in (
        ("restart", cmd_restart, "restart a job's ranks"),
        ("stop", cmd_stop, "stop a job"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("job", type=int)
        p.set_defaults(func=func)

    p = sub.add_parser("logs", help="a job's log lines")
    p.add_argument("job", type=int)
    p.add_argument("--rank", type=int)
    p.add_argument("--grep", help="only lines containing this text")
    p.add_argument("--tail", type=int, default=200)
    p.add_argument("-f", "--follow", action="store_true")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("metrics", help="a job's metric series")
    p.add_argument("job", type=int)
    p.add_argument("--name", help="comma-separated series names (default: all)")
    p.add_argument("--points", type=int, default=20)
    p.add_argument("--follow", action="store_true")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("nodes", help="cluster nodes")
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser("top", help="live view of nodes and jobs")
    p.add_argument("--once", action="store_true")
    p.set_defaults(func=cmd_top)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except CliError as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
