"""Regenerates the gRPC modules from ``workers/ps/ps.proto``: ``python -m workers.ps.generate``.

The generated ``ps_pb2.py``, ``ps_pb2.pyi`` and ``ps_pb2_grpc.py`` are committed (hosts run
without grpcio-tools); ``tests/test_ps_proto_generated.py`` fails when they disagree with the
.proto. ``--out DIR`` writes elsewhere (the test compares such a fresh copy with the committed one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("workers/ps/ps.proto")
GENERATED = ("ps_pb2.py", "ps_pb2.pyi", "ps_pb2_grpc.py")


def generate(out: Path) -> list[Path]:
    """Runs protoc (from grpcio-tools) with the repository root as include path, so the modules
    import each other as ``workers.ps.ps_pb2``; returns the generated files under ``out``."""
    from grpc_tools import protoc  # test/dev dependency only

    out.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(ROOT / PROTO),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")
    return [out / PROTO.parent / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.ps.generate", description=__doc__)
    parser.add_argument("--out", type=Path, help="write the modules under this directory instead")
    args = parser.parse_args(argv)
    if args.out is not None:
        for path in generate(args.out):
            print(path)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        for path in generate(Path(scratch)):
            target = ROOT / PROTO.parent / path.name
            target.write_bytes(path.read_bytes())
            print(target.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
