"""Attack: a small .tar.gz whose GNU long-name (or pax) header claims tens of megabytes. tarfile
reads such a header whole into memory before any size check, so a 100 KB upload would make the
console (and every agent extracting it) allocate what the header claims. Refused, with memory
bounded: the peak allocation while checking is measured with tracemalloc."""

from __future__ import annotations

import gzip
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from workers.bundles import MAX_HEADER_BYTES, BundleError, check_archive, extract_bundle

CLAIMED = 48 * 1024 * 1024  # what the bomb's header claims (and holds: zeros compress ~1000x)
BOUND = 8 * 1024 * 1024  # the peak allocation allowed while refusing it


def header_bomb(path: Path, kind: bytes) -> Path:
    """A gzipped tar: one ``kind`` header (GNU long name, or pax) of CLAIMED bytes, then a file."""
    header = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "pax")
    header.type = kind
    header.size = CLAIMED
    chunk = b"a" * (1 << 20)
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(header.tobuf(format=tarfile.USTAR_FORMAT))
        if kind == tarfile.XHDTYPE:  # a well-formed pax record, with an enormous value
            record_head = f"{CLAIMED} path=".encode()
            out.write(record_head)
            left = CLAIMED - len(record_head) - 1
        else:
            left = CLAIMED
        while left > 0:
            out.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        if kind == tarfile.XHDTYPE:
            out.write(b"\n")
        out.write(b"\0" * (-CLAIMED % 512))
        payload = b"print(1)\n"
        member = tarfile.TarInfo("train.py")
        member.size = len(payload)
        out.write(member.tobuf(format=tarfile.USTAR_FORMAT) + payload + b"\0" * (512 - len(payload)))
        out.write(b"\0" * 1024)
    return path


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE], ids=["gnu-longname", "pax"])
def test_a_header_bomb_is_refused_with_bounded_memory(tmp_path: Path, kind: bytes) -> None:
    bomb = header_bomb(tmp_path / "bomb.tar.gz", kind)
    assert bomb.stat().st_size < 1024 * 1024  # small on the wire
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="header bomb"):
            check_archive(bomb, 100 * 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with pytest.raises(BundleError, match="header bomb"):
            extract_bundle(bomb, tmp_path / "out")
        _, extract_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < BOUND and extract_peak < BOUND, (peak, extract_peak)
    assert not (tmp_path / "out").exists()


def test_ordinary_long_names_still_work(tmp_path: Path) -> None:
    """A real long path (GNU and pax formats) is far below the bound and extracts."""
    deep = "/".join(["d" * 100] * 20) + "/train.py"  # 2 KB path
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        archive = tmp_path / f"long-{fmt}.tar.gz"
        with tarfile.open(archive, "w:gz", format=fmt) as tar:
            source = tmp_path / "train.py"
            source.write_text("print(1)\n")
            tar.add(source, arcname=deep)
        check_archive(archive, 1 << 20)
        extract_bundle(archive, tmp_path / f"out-{fmt}")
        assert (tmp_path / f"out-{fmt}" / deep).read_text() == "print(1)\n"
    assert len(deep) < MAX_HEADER_BYTES
