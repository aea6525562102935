"""Code bundles: checking and extracting user archives (.tar, .tar.gz/.tgz, .zip) safely.

Used by the console when a bundle is uploaded (``check_archive``) and by agents before they run
it (``extract_bundle``). The format is told by content, not by name. Refused: absolute paths,
``..`` components, links that point outside the bundle, device files and FIFOs, more than
``MAX_MEMBERS`` entries, and a total uncompressed size above the bound (zip bombs).

Extraction never writes outside ``dest``: members are written by this module itself (never by
``tarfile.extractall``) into a fresh temporary directory beside ``dest``; regular files and
directories first, symbolic links last (so no write can pass through a link from the archive),
then every link is resolved for real and must stay inside; only then is the directory renamed
to ``dest``.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MAX_MEMBERS = 20_000
# Uncompressed bound as a multiple of the archive bound: source trees compress 3-10x, a zip bomb
# by thousands.
UNPACKED_FACTOR = 10
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
_CHUNK = 1 << 20
# A GNU long name/link or a pax header is read whole into memory by tarfile: its size is checked
# first (BoundedTarInfo). Linux paths stop at 4 KiB; pax headers with a few xattrs fit easily.
MAX_HEADER_BYTES = 64 * 1024


class BundleError(Exception):
    """The archive is refused; the message is meant for the person who uploaded it."""


@dataclass(frozen=True)
class Member:
    name: str  # normalised relative POSIX path
    kind: str  # "file" | "dir" | "symlink" | "hardlink"
    size: int
    mode: int
    target: str  # link target ("" for files and directories)


def _normalise(raw: str) -> str:
    name = raw.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"archive member {raw!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BundleError(f"archive member {raw!r} contains '..'")
    if any("\x00" in p for p in parts):
        raise BundleError(f"archive member {raw!r} has a NUL byte in its name")
    return "/".join(parts)


def _link_inside(name: str, target: str) -> bool:
    """Whether symlink ``name`` → ``target`` resolves inside the bundle, judged on the text."""
    if not target or target.startswith("/") or "\\" in target:
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return resolved != ".." and not resolved.startswith("../") and not resolved.startswith("/")


def _detect(path: Path) -> str:
    with open(path, "rb") as handle:
        head = handle.read(512)
    if head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head[:6] == b"\xfd7zXZ\x00":
        return "tar"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    try:
        with tarfile.open(path, tarinfo=BoundedTarInfo):
            return "tar"
    except (tarfile.TarError, OSError, EOFError):
        pass
    raise BundleError("the bundle is not a tar, tar.gz or zip archive")


_LONG_HEADERS = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


def _sparse_refused(name: str) -> BundleError:
    return BundleError(f"archive member {name!r} is a sparse file")


class BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member header, refusing before it reads them: a GNU long name or link, or a pax
    header, larger than MAX_HEADER_BYTES (tarfile reads such a header whole into memory, so a
    small compressed archive could claim gigabytes), and GNU sparse members (a bundle has no use
    for them, and their maps are read unbounded too)."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.type in _LONG_HEADERS and self.size > MAX_HEADER_BYTES:
            raise BundleError(
                f"the bundle has a {self.size}-byte archive header (more than {MAX_HEADER_BYTES}); "
                "refused as a possible header bomb"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _sparse_refused(self.name)
        return super()._proc_member(archive)  # type: ignore[misc, no-any-return]

    # Sparse members described in pax headers (GNU formats 0.0, 0.1, 1.0).
    def _proc_gnusparse_00(self, *args: object) -> None:
        raise _sparse_refused(self.name)

    def _proc_gnusparse_01(self, *args: object) -> None:
        raise _sparse_refused(self.name)

    def _proc_gnusparse_10(self, *args: object) -> None:
        raise _sparse_refused(self.name)


def _tar_members(archive: tarfile.TarFile) -> Iterator[tuple[Member, tarfile.TarInfo]]:
    for info in archive:
        name = _normalise(info.name)
        if info.isdir():
            kind = "dir"
        elif info.isreg():
            kind = "file"
        elif info.issym():
            kind = "symlink"
        elif info.islnk():
            kind = "hardlink"
        else:
            raise BundleError(f"archive member {info.name!r} is a device, FIFO or other special file")
        target = info.linkname if kind in ("symlink", "hardlink") else ""
        yield Member(name, kind, info.size if kind == "file" else 0, info.mode, target), info


def _zip_kind(info: zipfile.ZipInfo) -> tuple[str, int]:
    mode = (info.external_attr >> 16) & 0xFFFF
    if info.is_dir():
        return "dir", mode
    if mode and stat.S_ISLNK(mode):
        return "symlink", mode
    if mode and not stat.S_ISREG(mode) and stat.S_IFMT(mode) != 0:
        return "special", mode
    return "file", mode


Entry = tarfile.TarInfo | zipfile.ZipInfo


def _members(path: Path, archive: tarfile.TarFile | zipfile.ZipFile) -> Iterator[tuple[Member, Entry]]:
    if isinstance(archive, tarfile.TarFile):
        yield from _tar_members(archive)
        return
    for info in archive.infolist():
        name = _normalise(info.filename)
        kind, mode = _zip_kind(info)
        if kind == "special":
            raise BundleError(f"archive member {info.filename!r} is a device, FIFO or other special file")
        target = ""
        if kind == "symlink":
            if info.file_size > 4096:
                raise BundleError(f"archive member {info.filename!r} is a link with an oversized target")
            target = archive.read(info).decode("utf-8", errors="replace")
        yield Member(name, kind, info.file_size if kind == "file" else 0, mode, target), info


def _open(path: Path) -> tarfile.TarFile | zipfile.ZipFile:
    kind = _detect(path)
    try:
        if kind == "zip":
            return zipfile.ZipFile(path)
        return tarfile.open(path, mode="r:*", tarinfo=BoundedTarInfo)
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as error:
        raise BundleError(f"the bundle is not a readable {kind} archive: {error}") from None


def _validate(
    path: Path, archive: tarfile.TarFile | zipfile.ZipFile, max_unpacked: int
) -> list[tuple[Member, Entry]]:
    members: list[tuple[Member, Entry]] = []
    total = 0
    files: dict[str, int] = {}
    try:
        for member, entry in _members(path, archive):
            members.append((member, entry))
            if len(members) > MAX_MEMBERS:
                raise BundleError(f"the bundle has more than {MAX_MEMBERS} entries")
            total += member.size
            if member.kind == "symlink" and not _link_inside(member.name, member.target):
                raise BundleError(f"link {member.name!r} -> {member.target!r} points outside the bundle")
            if member.kind == "hardlink":
                try:
                    target = _normalise(member.target)
                except BundleError:
                    target = ""
                if target not in files:
                    raise BundleError(
                        f"hard link {member.name!r} -> {member.target!r} does not name a file in the bundle"
                    )
                # Extracted as a copy, so it weighs as much as its target.
                total += files[target]
            if member.kind == "file":
                files[member.name] = member.size
            if total > max_unpacked:
                raise BundleError(
                    f"the bundle unpacks to more than {max_unpacked // (1024 * 1024)} MB "
                    "(refused as a possible archive bomb)"
                )
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as error:
        raise BundleError(f"the bundle archive is damaged: {error}") from None
    return members


def check_archive(path: Path, max_bytes: int, max_unpacked_bytes: int | None = None) -> None:
    """Raises BundleError unless ``path`` is an acceptable bundle of at most ``max_bytes``.

    The uncompressed total may be ``max_unpacked_bytes`` (default ``UNPACKED_FACTOR`` times
    ``max_bytes``).
    """
    size = path.stat().st_size
    if size > max_bytes:
        raise BundleError(f"the bundle is {size} bytes, larger than the limit of {max_bytes} bytes")
    with _open(path) as archive:
        _validate(path, archive, max_unpacked_bytes or max_bytes * UNPACKED_FACTOR)


def _copy_limited(source: IO[bytes], target: Path, expected: int, mode: int) -> None:
    written = 0
    # O_EXCL|O_NOFOLLOW: never write through an existing file or link.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > expected:
                raise BundleError(f"archive member {target.name!r} is larger than its header says")
            out.write(chunk)


def _file_mode(mode: int) -> int:
    return 0o755 if mode & 0o111 else 0o644


def _ensure_parent(root: Path, name: str) -> Path:
    target = root / name
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    # A parent that already exists as something else (a file) makes mkdir fail above; a parent
    # reached through a link cannot exist yet because links are created last.
    if not parent.resolve().is_relative_to(root.resolve()):
        raise BundleError(f"archive member {name!r} would be written outside the bundle")
    return target


def extract_bundle(archive: Path, dest: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Checks and extracts ``archive`` to ``dest`` (which must not exist yet).

    If another process finished extracting the same bundle to ``dest`` meanwhile, its copy is
    kept and this one discarded, so concurrent agents can share a cache directory.
    """
    archive = Path(archive)
    dest = Path(dest)
    if dest.exists():
        raise BundleError(f"extraction target {dest} already exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with _open(archive) as opened:
            members = _validate(archive, opened, max_bytes * UNPACKED_FACTOR)
            try:
                _write_members(opened, members, staging)
            except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError) as error:
                raise BundleError(f"the bundle cannot be extracted: {error}") from None
        for member, _ in members:
            if member.kind == "symlink":
                resolved = (staging / member.name).resolve()
                if not resolved.is_relative_to(staging.resolve()):
                    raise BundleError(f"link {member.name!r} resolves outside the bundle")
        try:
            os.rename(staging, dest)
        except OSError:
            if dest.is_dir():
                shutil.rmtree(staging, ignore_errors=True)
                return
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write_members(
    opened: tarfile.TarFile | zipfile.ZipFile, members: list[tuple[Member, Entry]], root: Path
) -> None:
    links: list[Member] = []
    for member, entry in members:
        if not member.name:
            continue
        if member.kind == "dir":
            target = _ensure_parent(root, member.name)
            target.mkdir(exist_ok=True)
        elif member.kind == "file":
            target = _ensure_parent(root, member.name)
            if target.exists() or target.is_symlink():
                target.unlink()
            source: IO[bytes] | None
            if isinstance(opened, tarfile.TarFile):
                assert isinstance(entry, tarfile.TarInfo)
                source = opened.extractfile(entry)
            else:
                assert isinstance(entry, zipfile.ZipInfo)
                source = opened.open(entry)
            if source is None:
                raise BundleError(f"archive member {member.name!r} cannot be read")
            with source:
                _copy_limited(source, target, member.size, _file_mode(member.mode))
        elif member.kind == "hardlink":
            target = _ensure_parent(root, member.name)
            # A copy, not a link: the source is a file of this bundle (checked), so nothing outside
            # can be reached, and later writes to one name do not change the other.
            shutil.copyfile(root / _normalise(member.target), target, follow_symlinks=False)
        else:
            links.append(member)
    for member in links:
        target = _ensure_parent(root, member.name)
        if target.exists() or target.is_symlink():
            raise BundleError(f"link {member.name!r} collides with another entry of the bundle")
        os.symlink(member.target, target)
