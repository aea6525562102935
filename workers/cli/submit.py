"""``trainyard submit`` and ``bundle``: job specs (YAML) and the code bundle uploaded with them."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from workers.cli import bundle as bundles
from workers.cli.base import (
    JsonOption,
    OutputOption,
    app,
    console,
    wants_json,
)
from workers.cli.client import (
    UPLOAD_TIMEOUT,
    Console,
)
from workers.cli.errors import CliError, Exit
from workers.cli.output import err, out, print_json


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


def secrets_from_environment(names: list[str]) -> dict[str, str]:
    """``--secret-env NAME``: NAME's value from the caller's environment (a value never goes on
    a command line, which every user of the host can read)."""
    found: dict[str, str] = {}
    for name in names:
        if "=" in name:
            raise CliError(
                f"--secret-env {name.split('=')[0]}: give the name only; the value is read from "
                "your environment (a command line is readable by every user of the host).",
                Exit.USAGE,
            )
        if name not in os.environ:
            raise CliError(f"--secret-env {name}: {name} is not set in your environment.", Exit.USAGE)
        found[name] = os.environ[name]
    return found


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
    secret_env: Annotated[
        list[str] | None,
        typer.Option(
            "--secret-env",
            metavar="NAME",
            help="Hand the ranks this variable of your environment, write-only: the console shows "
            "its name, never its value (repeatable).",
        ),
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
    if secret_env:
        spec["secret_env"] = {**(spec.get("secret_env") or {}), **secrets_from_environment(secret_env)}
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
