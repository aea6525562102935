"""The committed browser bundles are built from the committed sources with the pinned uPlot.

Each bundle in frontend/public/js starts with a banner written by frontend/build.mjs: the uPlot
version it bundled and a digest of frontend/src. Given the lock file and the sources, when the
banners are read, then both must match: a bundle built from other sources, or with a uPlot other
than package-lock.json pins, fails here (rebuild: cd frontend && npm ci && npm run build).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

FRONTEND = Path(__file__).resolve().parent.parent / "frontend"
BUNDLES = ["job", "dashboard", "node", "submit", "apidocs"]
BANNER = re.compile(
    r"^/\* trainyard frontend; uplot (?P<version>[\w.\-]+); sources (?P<digest>[0-9a-f]{16}) \*/"
)


def source_digest() -> str:
    """The digest build.mjs writes: every .js under src/ by its path relative to src/ (folders
    too: the job page's modules are in src/job/), each as path NUL bytes NUL."""
    digest = hashlib.sha256()
    src = FRONTEND / "src"
    for path in sorted(src.rglob("*.js"), key=lambda p: p.relative_to(src).as_posix()):
        digest.update(path.relative_to(src).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def pinned(package: str) -> str:
    lock = json.loads((FRONTEND / "package-lock.json").read_text())
    version: str = lock["packages"][f"node_modules/{package}"]["version"]
    return version


def test_package_json_pins_exactly_what_the_lock_file_holds() -> None:
    manifest = json.loads((FRONTEND / "package.json").read_text())
    assert manifest["dependencies"]["uplot"] == pinned("uplot")
    assert manifest["devDependencies"]["esbuild"] == pinned("esbuild")


@pytest.mark.parametrize("name", BUNDLES)
def test_bundle_matches_pinned_uplot_and_sources(name: str) -> None:
    bundle = (FRONTEND / "public" / "js" / f"{name}.js").read_text()
    match = BANNER.match(bundle)
    assert match, f"{name}.js has no build banner: build it with frontend/build.mjs"
    assert match["version"] == pinned("uplot"), f"{name}.js bundles uPlot {match['version']}"
    assert match["digest"] == source_digest(), f"{name}.js is stale: rebuild after editing frontend/src"


def test_uplot_stylesheet_is_the_pinned_one() -> None:
    css = (FRONTEND / "public" / "css" / "uplot.min.css").read_text()
    assert css.startswith(f"/* trainyard uplot stylesheet; uplot {pinned('uplot')};")
    assert ".uplot" in css


def test_job_bundle_contains_uplot_itself() -> None:
    # uPlot's own code (not a stub): its class names and the join() used to align series.
    bundle = (FRONTEND / "public" / "js" / "job.js").read_text()
    assert "u-over" in bundle and "u-legend" in bundle
