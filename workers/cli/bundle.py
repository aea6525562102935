"""Building a code bundle from a directory: a tar.gz written to a temporary file on disk (never
held in memory), without version-control data, virtualenvs, caches, node_modules, or anything
the directory's ``.gitignore`` files, its ``.trainyardignore`` or ``--exclude`` patterns name.

Patterns are gitignore patterns (the ``pathspec`` library): each ``.gitignore`` applies to its own
directory and below, a deeper file's match (``!`` re-includes) wins over a shallower one, and
``.trainyardignore`` then ``--exclude`` (both relative to the bundle's root) win over all of
them. As in git, nothing inside an excluded directory can be re-included.
"""

from __future__ import annotations

import gzip
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from workers.cli.errors import CliError, Exit

# Never worth uploading, whatever the ignore files say.
ALWAYS_SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        "__pycache__",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
    }
)
ALWAYS_SKIPPED_SUFFIXES = (".pyc", ".pyo")
IGNORE_FILE = ".trainyardignore"


@dataclass
class Bundle:
    """A built archive (``path``, a temporary file the caller removes) and what went into it."""

    path: Path
    files: int = 0
    unpacked_bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # top-most skipped paths, relative, dirs end in /

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def _spec(lines: Iterable[str], source: str | None = None) -> pathspec.PathSpec | None:
    """The patterns of ``lines``. A pattern that is not valid gitignore syntax is an error naming
    ``source`` when given (the user typed it), else skipped, as git skips it."""
    patterns = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except ValueError:
            if source is not None:
                raise CliError(f"{source}: {line!r} is not a gitignore pattern", Exit.USAGE) from None
            continue
        patterns.append(line)
    return pathspec.GitIgnoreSpec.from_lines(patterns) if patterns else None


def _read_spec(path: Path) -> pathspec.PathSpec | None:
    try:
        return _spec(path.read_text(errors="replace").splitlines())
    except OSError:
        return None


class Ignore:
    """Decides whether a path (relative to the root, '/'-separated, dirs ending in '/') is left out."""

    def __init__(self, root: Path, excludes: Sequence[str] = ()) -> None:
        self.root = root
        self.gitignores: dict[str, pathspec.PathSpec] = {}  # "" or "sub/dir/" -> its .gitignore
        own = root / IGNORE_FILE
        lines = own.read_text(errors="replace").splitlines() if own.is_file() else []
        _spec(excludes, source="--exclude")  # refuses a bad pattern the user typed
        self.overrides = _spec([*lines, *excludes])

    def enter(self, directory: str) -> None:
        """Reads ``directory``'s .gitignore (``directory`` is "" or "a/b/")."""
        spec = _read_spec(self.root / directory / ".gitignore")
        if spec is not None:
            self.gitignores[directory] = spec

    def skipped(self, relative: str, is_dir: bool, on_disk: Path) -> bool:
        name = relative.rstrip("/").rsplit("/", 1)[-1]
        if is_dir and (name in ALWAYS_SKIPPED_DIRS or (on_disk / "pyvenv.cfg").exists()):
            return True
        if not is_dir and name.endswith(ALWAYS_SKIPPED_SUFFIXES):
            return True
        decision: bool | None = None
        # Shallow to deep: the deepest .gitignore that has an opinion decides.
        for base in sorted(self.gitignores, key=len):
            if relative.startswith(base):
                result = self.gitignores[base].check_file(relative[len(base) :])
                if result.include is not None:
                    decision = result.include
        if self.overrides is not None:
            result = self.overrides.check_file(relative)
            if result.include is not None:
                decision = result.include
        return bool(decision)


def build_bundle(
    directory: Path,
    excludes: Sequence[str] = (),
    max_unpacked_bytes: int | None = None,
    on_file: Callable[[str, int], None] | None = None,
) -> Bundle:
    """Writes ``directory`` as a tar.gz into a temporary file and returns it. Symbolic links are
    left out (the console refuses links that leave the bundle). Raises CliError when the
    directory is missing or its files add up to more than ``max_unpacked_bytes``."""
    root = directory.resolve()
    if not root.is_dir():
        raise CliError(f"{directory} is not a directory", Exit.USAGE)
    ignore = Ignore(root, excludes)
    fd, name = tempfile.mkstemp(prefix="trainyard-bundle-", suffix=".tar.gz")
    os.close(fd)
    bundle = Bundle(Path(name))
    try:
        # gzip header without a time or a name, members in sorted order, owners cleared: the
        # same files make the same bytes, which the console stores once (content-addressed).
        with (
            bundle.path.open("wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed,
            tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as archive,
        ):
            for current, dirs, files in os.walk(root):
                here = Path(current)
                prefix = here.relative_to(root).as_posix()
                prefix = "" if prefix == "." else prefix + "/"
                ignore.enter(prefix)
                kept = []
                for sub in sorted(dirs):
                    relative = f"{prefix}{sub}/"
                    if (here / sub).is_symlink() or ignore.skipped(relative, True, here / sub):
                        bundle.skipped.append(relative)
                    else:
                        kept.append(sub)
                dirs[:] = kept  # os.walk descends only into these
                for sub in sorted(files):
                    relative = prefix + sub
                    path = here / sub
                    if path.is_symlink() or not path.is_file() or ignore.skipped(relative, False, path):
                        bundle.skipped.append(relative)
                        continue
                    size = path.stat().st_size
                    bundle.files += 1
                    bundle.unpacked_bytes += size
                    if max_unpacked_bytes is not None and bundle.unpacked_bytes > max_unpacked_bytes:
                        raise CliError(
                            f"{directory} holds more than the console's limit of {human(max_unpacked_bytes)} "
                            "unpacked; leave out data with .gitignore, .trainyardignore or --exclude.",
                            Exit.INVALID,
                        )
                    try:
                        archive.add(path, arcname=relative, recursive=False, filter=anonymous)
                    except PermissionError:
                        raise CliError(
                            f"Cannot read {path}; leave it out with --exclude {relative!r}", Exit.USAGE
                        ) from None
                    if on_file is not None:
                        on_file(relative, size)
    except BaseException:
        bundle.path.unlink(missing_ok=True)
        raise
    return bundle


def anonymous(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def human(size: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def skipped_summary(skipped: Sequence[str], shown: int = 6) -> str:
    if not skipped:
        return "nothing skipped"
    names = ", ".join(skipped[:shown])
    more = f" and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return f"skipped {names}{more}"
