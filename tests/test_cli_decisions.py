"""Decisions of the ``trainyard`` CLI, in process: what a bundle leaves out, which exit code an
answer becomes, how list pages are followed, how a spec is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from workers.cli.app import load_spec
from workers.cli.bundle import build_bundle
from workers.cli.client import Console, check, follow_pages, sse_events
from workers.cli.errors import CliError, Exit, exit_for_status
from workers.net import free_port


def write(root: Path, relative: str, text: str = "x") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def members(directory: Path, excludes: list[str] | None = None) -> set[str]:
    bundle = build_bundle(directory, excludes or [])
    try:
        with tarfile.open(bundle.path) as archive:
            names = {m.name for m in archive.getmembers()}
        assert bundle.files == len(names)
        return names
    finally:
        bundle.path.unlink()


def test_bundle_leaves_out_vcs_virtualenvs_caches_and_ignored_paths(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for kept in ("train.py", "pkg/model.py", "pkg/data.yaml", "logs/keep.log", "sub/other.txt"):
        write(src, kept)
    for dropped in (
        ".git/HEAD",
        ".venv/lib/site.py",
        "venv/bin/python",
        "myenv/pyvenv.cfg",  # a virtualenv by any name
        "myenv/lib/big.so",
        "pkg/__pycache__/model.cpython-311.pyc",
        "pkg/stray.pyc",
        "web/node_modules/left-pad/index.js",
        "data/train.bin",  # .gitignore: data/
        "logs/run.log",  # .gitignore: *.log (but !keep.log)
        "sub/secret.txt",  # sub/.gitignore: secret.txt
        "weights.pt",  # .trainyardignore
        "notes/todo.md",  # --exclude
    ):
        write(src, dropped)
    write(src, ".gitignore", "# comment\ndata/\n*.log\n!keep.log\n")
    write(src, "sub/.gitignore", "secret.txt\n")
    write(src, ".trainyardignore", "*.pt\n")
    (src / "link.py").symlink_to(src / "train.py")

    assert members(src, ["notes/"]) == {
        ".gitignore",
        ".trainyardignore",
        "train.py",
        "pkg/model.py",
        "pkg/data.yaml",
        "logs/keep.log",
        "sub/.gitignore",
        "sub/other.txt",
    }


def test_bundle_dry_run_lists_what_would_go_up_without_a_console(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src, "train.py")
    write(src, "data/x.bin")
    write(src, "env/pyvenv.cfg")
    write(src, ".gitignore", "data/\n")
    shown = run_trainyard(tmp_path, "bundle", str(src), "--dry-run", "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["files"] == [".gitignore", "train.py"] and summary["skipped"] == ["data/", "env/"]
    assert summary["unpacked_bytes"] == len("data/\n") + 1


def test_bundle_nested_gitignore_is_relative_to_its_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src, "a/build/out.o")
    write(src, "build/keep.txt")  # /build in a/.gitignore names a/build only
    write(src, "a/.gitignore", "/build\n")
    assert members(src) == {"a/.gitignore", "build/keep.txt"}


def test_bad_patterns_are_skipped_in_files_and_refused_on_the_command_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src, "a.py")
    write(src, "b.log")
    write(src, ".gitignore", "!\n*.log\n")  # "!" alone is not a pattern; git skips it
    assert members(src) == {".gitignore", "a.py"}
    with pytest.raises(CliError) as error:
        build_bundle(src, ["!"])
    assert error.value.code == Exit.USAGE and "--exclude" in str(error.value)


def test_bundle_refuses_a_missing_directory_and_too_many_bytes(tmp_path: Path) -> None:
    with pytest.raises(CliError) as missing:
        build_bundle(tmp_path / "nope")
    assert missing.value.code == Exit.USAGE
    write(tmp_path / "big", "blob.bin", "y" * 5000)
    with pytest.raises(CliError) as big:
        build_bundle(tmp_path / "big", max_unpacked_bytes=1000)
    assert big.value.code == Exit.INVALID and "limit" in str(big.value)
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("trainyard-bundle-*big*"))


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, Exit.INVALID),
        (409, Exit.INVALID),
        (422, Exit.INVALID),
        (401, Exit.AUTH),
        (403, Exit.AUTH),
        (404, Exit.NOT_FOUND),
        (429, Exit.ERROR),
        (500, Exit.UNREACHABLE),
        (502, Exit.UNREACHABLE),
    ],
)
def test_http_errors_map_to_distinct_exit_codes(status: int, code: Exit) -> None:
    response = httpx.Response(
        status,
        json={"detail": "Nope.", "errors": {"nodes": ["outside 2..4"]}},
        request=httpx.Request("GET", "http://console/api/v1/jobs/1/"),
    )
    with pytest.raises(CliError) as error:
        check(response)
    assert error.value.code == code == exit_for_status(status)
    assert str(error.value).startswith("Nope. (nodes: outside 2..4)") and "\n" not in str(error.value)


def test_a_non_json_error_page_is_one_line() -> None:
    response = httpx.Response(
        502, text="<html>\n<b>Bad gateway</b>\n</html>", request=httpx.Request("GET", "http://c/")
    )
    with pytest.raises(CliError) as error:
        check(response)
    assert error.value.code == Exit.UNREACHABLE and "\n" not in str(error.value) and "502" in str(error.value)


def test_a_redirect_is_an_error_naming_where_to() -> None:
    response = httpx.Response(
        301,
        headers={"Location": "https://console/api/v1/jobs/"},
        request=httpx.Request("GET", "http://console/"),
    )
    with pytest.raises(CliError) as error:
        check(response)
    assert error.value.code == Exit.ERROR and "https://console/api/v1/jobs/" in str(error.value)


def test_next_links_are_followed_on_the_address_the_cli_uses() -> None:
    """Behind a proxy the console may build ``next`` from its own Host; path and query are kept."""
    console = Console("https://yard.example.com:8443/")
    assert console.api("jobs/") == "https://yard.example.com:8443/api/v1/jobs/"
    assert console.api("http://10.0.0.5:8000/api/v1/jobs/?cursor=abc&page_size=500") == (
        "https://yard.example.com:8443/api/v1/jobs/?cursor=abc&page_size=500"
    )
    with pytest.raises(CliError) as error:
        Console("yard.example.com")
    assert error.value.code == Exit.USAGE


def pages_of(items: list[int], size: int) -> dict[str, Any]:
    """A console's pages of ``items``: URL -> page, linked by ``next``."""
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    return {
        ("jobs/" if n == 0 else f"http://console/api/v1/jobs/?cursor=c{n}"): {
            "results": chunk,
            "next": f"http://console/api/v1/jobs/?cursor=c{n + 1}" if n + 1 < len(chunks) else None,
        }
        for n, chunk in enumerate(chunks)
    }


def test_pages_are_followed_to_the_end_or_to_the_limit() -> None:
    pages = pages_of(list(range(12)), 5)
    calls: list[tuple[str, Any]] = []

    def fetch(url: str, params: dict[str, Any] | None) -> Any:
        calls.append((url, params))
        return pages[url]

    assert list(follow_pages(fetch, "jobs/", None, {"state": "RUNNING"})) == list(range(12))
    assert calls[0] == ("jobs/", {"state": "RUNNING", "page_size": 500})
    assert [url for url, _ in calls[1:]] == [
        "http://console/api/v1/jobs/?cursor=c1",
        "http://console/api/v1/jobs/?cursor=c2",
    ]
    assert all(params is None for _, params in calls[1:])  # the next link carries them

    calls.clear()
    assert list(follow_pages(fetch, "jobs/", 7, {})) == list(range(7))
    assert calls[0][1] == {"page_size": 7} and len(calls) == 2  # stops once it has enough
    calls.clear()
    assert list(follow_pages(fetch, "jobs/", 5, {})) == list(range(5)) and len(calls) == 1


def test_a_next_link_that_loops_ends_the_listing() -> None:
    page = {"results": [1], "next": "http://console/api/v1/jobs/?cursor=same"}
    assert list(follow_pages(lambda url, params: page, "jobs/", None, {})) == [1, 1]


def test_spec_overrides_and_bad_specs(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\nnnodes: 1:3\nhyperparameters: {lr: 0.1, wd: 1e-4, steps: 0x10}\n")
    assert load_spec(str(spec), []) == {
        "name": "x",
        "nnodes": "1:3",  # not 63, as YAML 1.1's base 60 would have it
        "hyperparameters": {"lr": 0.1, "wd": 1e-4, "steps": 16},
    }
    assert load_spec(str(spec), ["hyperparameters.lr=0.5", "nnodes=2:4", "priority=3", "env.A=x"]) == {
        "name": "x",
        "nnodes": "2:4",
        "hyperparameters": {"lr": 0.5, "wd": 1e-4, "steps": 16},
        "priority": 3,
        "env": {"A": "x"},
    }
    cases = [
        (str(tmp_path / "missing.yaml"), [], Exit.USAGE),
        (str(spec), ["novalue"], Exit.USAGE),
        (str(spec), ["name.sub=1"], Exit.USAGE),
    ]
    (tmp_path / "list.yaml").write_text("- a\n")
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    cases += [
        (str(tmp_path / "list.yaml"), [], Exit.INVALID),
        (str(tmp_path / "broken.yaml"), [], Exit.INVALID),
    ]
    for path, overrides, code in cases:
        with pytest.raises(CliError) as error:
            load_spec(path, overrides)
        assert error.value.code == code, (path, overrides)


def run_trainyard(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    trainyard = Path(sys.executable).parent / "trainyard"
    return subprocess.run(
        [str(trainyard), *args],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
            "TRAINYARD_CONFIG": str(tmp_path / "config.json"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unreachable_console_bad_config_and_usage_exit_without_traceback(tmp_path: Path) -> None:
    """The installed ``trainyard`` command: one line on stderr and the documented code."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    down = run_trainyard(tmp_path, "ls", "--json", TRAINYARD_URL=url, TRAINYARD_TOKEN="t")
    assert down.returncode == 6 and down.stdout == ""
    assert (
        down.stderr.startswith(f"trainyard: Cannot reach the console at {url}")
        and down.stderr.count("\n") == 1
    )
    login = run_trainyard(tmp_path, "login", "--url", url, "--token", "t")
    assert login.returncode == 6 and "Traceback" not in login.stderr
    assert not (tmp_path / "config.json").exists()

    (tmp_path / "config.json").write_text("{not json")
    broken = run_trainyard(tmp_path, "nodes")
    assert broken.returncode == 1 and "not valid JSON" in broken.stderr and "Traceback" not in broken.stderr
    relogin = run_trainyard(tmp_path, "login", "--url", url, "--token", "t")  # not stuck on the bad file
    assert relogin.returncode == 6 and "Cannot reach" in relogin.stderr

    usage = run_trainyard(tmp_path, "show", "not-a-number")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    helped = run_trainyard(tmp_path, "--help")
    assert (
        helped.returncode == 0 and "3 not found" in helped.stdout and "6 console unreachable" in helped.stdout
    )


def test_server_sent_events_are_parsed_line_by_line() -> None:
    stream = [
        ": stream of job 3's log lines",
        "",
        "id: 7",
        "event: line",
        'data: {"id": 7}',
        "",
        ": keep-alive",
        "",
        "event: end",
        'data: {"reason": "finished",',
        'data:  "last_id": 7}',
        "",
    ]
    assert list(sse_events(stream)) == [
        ("line", '{"id": 7}', "7"),
        ("end", '{"reason": "finished",\n "last_id": 7}', None),
    ]
