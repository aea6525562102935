"""Checking and extracting code bundles (workers/bundles.py): good archives in, hostile ones out."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from workers import bundles
from workers.bundles import BundleError, check_archive, extract_bundle

LIMIT = 1024 * 1024


def _tar_entry(archive: tarfile.TarFile, name: str, data: bytes = b"", **fields: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    archive.addfile(info, io.BytesIO(data) if data else None)


def make_tar(path: Path, entries: list[tuple[str, bytes, dict[str, object]]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as archive:  # type: ignore[call-overload]
        for name, data, fields in entries:
            _tar_entry(archive, name, data, **fields)
    return path


def good_tar(path: Path) -> Path:
    return make_tar(
        path,
        [
            ("project", b"", {"type": tarfile.DIRTYPE, "mode": 0o755}),
            ("project/train.py", b"print('hello from the bundle')\n", {"mode": 0o755}),
            ("project/lib/util.py", b"VALUE = 42\n", {"mode": 0o644}),
            ("project/util_link.py", b"", {"type": tarfile.SYMTYPE, "linkname": "lib/util.py"}),
            ("project/copy.py", b"", {"type": tarfile.LNKTYPE, "linkname": "project/lib/util.py"}),
        ],
    )


def good_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("train.py", "print('zip bundle')\n")
        archive.writestr("pkg/__init__.py", "")
        archive.writestr("pkg/data.txt", "x" * 1000)
    return path


def absolute_path_tar(path: Path) -> Path:
    return make_tar(path, [("/tmp/trainyard-evil-absolute.txt", b"pwned", {})])


def dotdot_tar(path: Path) -> Path:
    return make_tar(path, [("ok.txt", b"fine", {}), ("../escaped.txt", b"pwned", {})])


def escaping_symlink_tar(path: Path) -> Path:
    return make_tar(path, [("link", b"", {"type": tarfile.SYMTYPE, "linkname": "../../outside"})])


def dotdot_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("../zip-escaped.txt", "pwned")
    return path


def zip_bomb(path: Path, unpacked: int = 40 * LIMIT) -> Path:
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive,
        archive.open("zeros.bin", "w") as member,
    ):
        for _ in range(unpacked // LIMIT):
            member.write(bytes(LIMIT))
    return path


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_good_tar_gz_extracts_with_modes_and_internal_links(tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "bundle.bin")  # the name says nothing: detection is by content
    check_archive(archive, LIMIT)
    dest = tmp_path / "cache" / "abc"
    extract_bundle(archive, dest)
    assert (dest / "project/train.py").read_text() == "print('hello from the bundle')\n"
    assert os.stat(dest / "project/train.py").st_mode & stat.S_IXUSR
    assert (dest / "project/util_link.py").is_symlink()
    assert (dest / "project/util_link.py").read_text() == "VALUE = 42\n"
    copied = dest / "project/copy.py"
    assert copied.read_text() == "VALUE = 42\n" and not copied.is_symlink()
    assert _tree(tmp_path / "cache") == {"abc", *(f"abc/{p}" for p in _tree(dest))}


def test_good_zip_and_plain_tar_extract(tmp_path: Path) -> None:
    extract_bundle(good_zip(tmp_path / "b.zip"), tmp_path / "z")
    assert (tmp_path / "z/train.py").read_text() == "print('zip bundle')\n"
    assert (tmp_path / "z/pkg/data.txt").stat().st_size == 1000
    plain = make_tar(tmp_path / "b.tar", [("a/b.txt", b"plain", {})], mode="w")
    extract_bundle(plain, tmp_path / "t")
    assert (tmp_path / "t/a/b.txt").read_bytes() == b"plain"


@pytest.mark.parametrize(
    ("builder", "message"),
    [
        (absolute_path_tar, "absolute path"),
        (dotdot_tar, "'..'"),
        (dotdot_zip, "'..'"),
        (escaping_symlink_tar, "points outside the bundle"),
        (zip_bomb, "archive bomb"),
    ],
)
def test_hostile_archives_are_refused_and_nothing_is_written(
    tmp_path: Path, builder: object, message: str
) -> None:
    archive = builder(tmp_path / "hostile.bin")  # type: ignore[operator]
    with pytest.raises(BundleError, match=message):
        check_archive(archive, LIMIT)
    cache = tmp_path / "deep" / "cache"
    cache.mkdir(parents=True)
    before = _tree(tmp_path)
    with pytest.raises(BundleError, match=message):
        extract_bundle(archive, cache / "bundle", max_bytes=LIMIT)
    assert _tree(tmp_path) == before
    assert not Path("/tmp/trainyard-evil-absolute.txt").exists()


def test_link_that_escapes_only_when_resolved_is_refused(tmp_path: Path) -> None:
    # "t" -> "s/.." reads as the bundle root, but "s" is itself a link to the root, so "t"
    # really names the bundle's parent: only the check after real resolution catches it.
    archive = make_tar(
        tmp_path / "sneaky.tgz",
        [
            ("s", b"", {"type": tarfile.SYMTYPE, "linkname": "."}),
            ("t", b"", {"type": tarfile.SYMTYPE, "linkname": "s/.."}),
        ],
    )
    check_archive(archive, LIMIT)
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.raises(BundleError, match="resolves outside"):
        extract_bundle(archive, cache / "bundle")
    assert list(cache.iterdir()) == []


def test_device_files_hardlinks_out_and_too_many_members_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = make_tar(tmp_path / "dev.tgz", [("null", b"", {"type": tarfile.CHRTYPE, "devmajor": 1})])
    with pytest.raises(BundleError, match="device"):
        check_archive(device, LIMIT)
    hardlink = make_tar(
        tmp_path / "hl.tgz", [("passwd", b"", {"type": tarfile.LNKTYPE, "linkname": "/etc/passwd"})]
    )
    with pytest.raises(BundleError, match="hard link"):
        check_archive(hardlink, LIMIT)
    monkeypatch.setattr(bundles, "MAX_MEMBERS", 5)
    many = make_tar(tmp_path / "many.tgz", [(f"f{i}.txt", b"x", {}) for i in range(6)])
    with pytest.raises(BundleError, match="more than 5 entries"):
        check_archive(many, LIMIT)


def test_oversize_and_non_archives_are_refused(tmp_path: Path) -> None:
    big = make_tar(tmp_path / "big.tar", [("noise.bin", os.urandom(LIMIT + 10), {})], mode="w")
    with pytest.raises(BundleError, match="larger than the limit"):
        check_archive(big, LIMIT)
    text = tmp_path / "notes.txt"
    text.write_text("just text, not an archive\n" * 40)
    with pytest.raises(BundleError, match="not a tar"):
        check_archive(text, LIMIT)


def test_existing_destination_is_not_overwritten(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(BundleError, match="already exists"):
        extract_bundle(good_zip(tmp_path / "b.zip"), dest)
    assert _tree(dest) == {"keep.txt"}
