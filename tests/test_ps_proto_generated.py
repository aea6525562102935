"""The committed gRPC modules are exactly what workers/ps/ps.proto generates."""

from __future__ import annotations

from pathlib import Path

from workers.ps import generate


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    # Given the .proto and the committed modules, when they are generated afresh
    fresh = generate.generate(tmp_path)
    # then each is byte for byte the committed one (else: python -m workers.ps.generate).
    for path in fresh:
        committed = generate.ROOT / generate.PROTO.parent / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed.name} is out of date with ps.proto: run python -m workers.ps.generate"
        )
    assert {path.name for path in fresh} == set(generate.GENERATED)
