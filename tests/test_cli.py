"""The ``trainyard`` CLI against a real console over HTTP: login with a password (which mints
an API token), submit a YAML spec with a code bundle, list every page, show, scale, stop, nodes,
and clear errors with their exit codes."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from console.api.models import ApiToken
from console.cluster.models import Node
from console.core.states import JobState
from console.jobs.bundles import bundle_path
from console.jobs.models import Bundle, Job
from console.telemetry.models import LogLine, Metric

pytestmark = pytest.mark.django_db(transaction=True)

BUNDLE_LIMIT = 256 * 1024


@pytest.fixture
def small_bundle_limit() -> Iterator[None]:
    """The console (started after this fixture) accepts bundles of at most BUNDLE_LIMIT bytes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINYARD_BUNDLE_MAX_BYTES", str(BUNDLE_LIMIT))
        yield


def run_cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINYARD_CONFIG": str(home / "config.json"), "TRAINYARD_PASSWORD": "pw-cli-user-1"}
    env.pop("TRAINYARD_URL", None)
    env.pop("TRAINYARD_TOKEN", None)
    return subprocess.run(
        # The installed console script, as a user runs it.
        [str(Path(sys.executable).parent / "trainyard"), *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_on_terminal(home: Path, *args: str) -> tuple[int, str]:
    """Runs the CLI with its output on a pseudo-terminal; returns its exit code and what it drew."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TRAINYARD_CONFIG": str(home / "config.json"), "COLUMNS": "120", "TERM": "xterm"}
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "trainyard"), *args], env=env, stdout=follower, stderr=follower
    )
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    return process.wait(timeout=60), drawn.decode(errors="replace")


def write(root: Path, relative: str, data: bytes = b"x") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_cli_round_trip(small_bundle_limit: None, console_url: str, tmp_path: Path) -> None:
    user = User.objects.create_user("cli-user", password="pw-cli-user-1")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    Node.objects.create(name="gpu-01", address="10.0.0.1", slots=4, last_heartbeat=timezone.now())

    login = run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user")
    assert login.returncode == 0, login.stderr
    assert ApiToken.objects.filter(user=user, revoked=False).count() == 1
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o600

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: from-cli\nentrypoint: /opt/train.py\nnnodes: '2:4'\nnproc_per_node: 2\nenv:\n  LR: '0.1'\n"
    )
    # A directory with a .gitignored virtualenv and data, a .git and a cache: only code goes up.
    src = tmp_path / "src"
    write(src, "train.py", b"print('hi')\n")
    write(src, "lib/util.py")
    write(src, ".gitignore", b"env/\ndata/\n")
    write(src, "env/pyvenv.cfg")
    write(src, "env/lib/torch.so", os.urandom(2 * BUNDLE_LIMIT))
    write(src, "data/train.bin", os.urandom(2 * BUNDLE_LIMIT))
    write(src, ".git/objects/pack.pack", os.urandom(2 * BUNDLE_LIMIT))
    write(src, "lib/__pycache__/util.cpython-311.pyc")
    write(src, "notes.md")
    submitted = run_cli(
        tmp_path, "submit", str(spec), "--set", "priority=5", "--bundle", str(src), "-x", "*.md"
    )
    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(name="from-cli")
    assert (job.min_nodes, job.max_nodes, job.priority, job.env) == (2, 4, 5, {"LR": "0.1"})
    assert f"Submitted job {job.pk}" in submitted.stdout
    assert "3 files" in submitted.stderr and "skipped .git/" in submitted.stderr
    assert job.bundle is not None
    with tarfile.open(bundle_path(job.bundle)) as archive:
        assert sorted(archive.getnames()) == [".gitignore", "lib/util.py", "train.py"]

    # Past the console's limit: refused here, before any upload, with the sizes.
    write(src, "weights.bin", os.urandom(BUNDLE_LIMIT + 1024))
    bundles_before = Bundle.objects.count()
    too_big = run_cli(tmp_path, "submit", str(spec), "--bundle", str(src))
    assert too_big.returncode == 5, too_big.stderr
    assert "over the console's limit of 256.0 KB" in too_big.stderr and "Traceback" not in too_big.stderr
    assert Bundle.objects.count() == bundles_before and Job.objects.filter(name="from-cli").count() == 1
    as_json = run_cli(
        tmp_path, "submit", str(spec), "--json", "--bundle", str(src), "-x", "weights.bin", "-x", "*.md"
    )
    assert as_json.returncode == 0, as_json.stderr
    assert Job.objects.get(pk=json.loads(as_json.stdout)["id"]).bundle_id == job.bundle_id  # same content
    (src / "weights.bin").unlink()
    write(src, "lib/more.py", os.urandom(64 * 1024))
    code, drawn = run_on_terminal(tmp_path, "bundle", str(src))
    assert code == 0, drawn
    assert "Uploading" in drawn and "KB" in drawn  # the progress bar, on a terminal only
    assert "Uploading" not in run_cli(tmp_path, "bundle", str(src)).stderr

    listing = run_cli(tmp_path, "ls")
    assert listing.returncode == 0 and "from-cli" in listing.stdout and "PENDING" in listing.stdout
    shown = run_cli(tmp_path, "show", str(job.pk))
    assert shown.returncode == 0 and "2:4" in shown.stdout

    scaled = run_cli(tmp_path, "scale", str(job.pk), "3")
    assert scaled.returncode == 0, scaled.stderr
    job.refresh_from_db()
    assert job.desired_nodes == 3
    refused = run_cli(tmp_path, "scale", str(job.pk), "9")
    assert refused.returncode == 5 and "outside 2..4" in refused.stderr

    ps_spec = tmp_path / "ps.yaml"
    ps_spec.write_text(
        "name: ps-from-cli\nentrypoint: /opt/worker.py\nstrategy: parameter_server\n"
        "roles:\n  ps: {count: 2}\n  worker: {count: 3, min: 1, max: 8}\n"
    )
    assert run_cli(tmp_path, "submit", str(ps_spec)).returncode == 0
    ps_job = Job.objects.get(name="ps-from-cli")
    assert ps_job.roles == {"ps": {"count": 2, "mode": "async"}, "worker": {"count": 3, "min": 1, "max": 8}}
    assert run_cli(tmp_path, "scale", str(ps_job.pk), "5", "--role", "worker").returncode == 0
    ps_job.refresh_from_db()
    assert ps_job.role_count("worker") == 5

    # A secret from the caller's environment (never its command line): the job holds it, the
    # CLI's answer only its name
    os.environ["HF_TOKEN"] = "hf_cli-secret-3b7e"
    try:
        secret = run_cli(
            tmp_path,
            "submit",
            str(ps_spec),
            "--set",
            "name=with-secret",
            "--secret-env",
            "HF_TOKEN",
            "--json",
        )
    finally:
        del os.environ["HF_TOKEN"]
    assert secret.returncode == 0, secret.stderr
    assert "hf_cli-secret-3b7e" not in secret.stdout and json.loads(secret.stdout)["secret_env"] == [
        "HF_TOKEN"
    ]
    with_secret = Job.objects.get(name="with-secret")
    assert with_secret.secret_env == {"HF_TOKEN": "hf_cli-secret-3b7e"}
    with_secret.delete()
    by_nodes = run_cli(tmp_path, "scale", str(ps_job.pk), "2")
    assert by_nodes.returncode == 5 and "resize its worker or ps role" in by_nodes.stderr
    ps_job.delete()  # the job counts below are the allreduce job's and the bulk ones

    stopped = run_cli(tmp_path, "stop", str(job.pk))
    assert stopped.returncode == 0 and "STOPPED" in stopped.stdout
    assert Job.objects.get(pk=job.pk).state == JobState.STOPPED

    now = timezone.now()
    LogLine.objects.bulk_create(
        LogLine(job=job, round_number=1, rank=r, stream="stdout", seq=s, text=f"r{r} line {s}", time=now)
        for r in (0, 1)
        for s in range(5)
    )
    tail = run_cli(tmp_path, "logs", str(job.pk), "--rank", "1", "--tail", "2")
    assert tail.returncode == 0 and tail.stdout.splitlines() == ["[1] r1 line 3", "[1] r1 line 4"]
    # Following a finished job's stream prints its lines and ends by itself.
    followed = run_cli(tmp_path, "logs", str(job.pk), "-f", "--json", "--grep", "line 4")
    assert followed.returncode == 0, followed.stderr
    assert [(line["rank"], line["text"]) for line in map(json.loads, followed.stdout.splitlines())] == [
        (0, "r0 line 4"),
        (1, "r1 line 4"),
    ]
    assert run_cli(tmp_path, "logs", "999999", "-f").returncode == 3
    kinds = {e["kind"] for e in json.loads(run_cli(tmp_path, "events", str(job.pk), "--json").stdout)}
    assert "job.submitted" in kinds, kinds
    assert json.loads(run_cli(tmp_path, "checkpoints", str(job.pk), "--json").stdout) == []
    Metric.objects.bulk_create(
        Metric(job=job, round_number=1, rank=0, seq=s, step=s, name="loss", value=1.0 / (s + 1), time=now)
        for s in range(10)
    )
    series = json.loads(
        run_cli(tmp_path, "metrics", str(job.pk), "--name", "loss", "--json", "--points", "2").stdout
    )["series"]
    assert [(b["step"], b["last_step"], b["count"]) for b in series["loss"]] == [(0, 4, 5), (5, 9, 5)]
    followed = run_cli(
        tmp_path, "metrics", str(job.pk), "--name", "loss", "-f", "--json", "--points", "2"
    )  # ends: job stopped
    assert followed.returncode == 0 and [
        json.loads(line)["last_step"] for line in followed.stdout.splitlines()
    ] == [4, 9]

    nodes = run_cli(tmp_path, "nodes")
    assert nodes.returncode == 0 and "gpu-01" in nodes.stdout
    assert [n["name"] for n in json.loads(run_cli(tmp_path, "nodes", "--json").stdout)] == ["gpu-01"]
    assert json.loads(run_cli(tmp_path, "show", str(job.pk), "-o", "json").stdout)["state"] == "STOPPED"
    top = run_cli(tmp_path, "top", "--once")
    assert top.returncode == 0 and "gpu-01" in top.stdout and "Pending" in top.stdout, top.stderr

    # More jobs than a page holds (500): --json lists every one, --limit stops early.
    owner = User.objects.get(username="cli-user")
    Job.objects.bulk_create(
        Job(name=f"bulk-{i:03}", workload="digits-mlp", owner=owner, state=JobState.SUCCEEDED)
        for i in range(510)
    )
    every = run_cli(tmp_path, "ls", "--json")
    assert every.returncode == 0, every.stderr
    listed = [j["id"] for j in json.loads(every.stdout)]
    assert len(listed) == len(set(listed)) == Job.objects.count() == 512
    first = json.loads(run_cli(tmp_path, "ls", "--json", "--limit", "3", "--state", "SUCCEEDED").stdout)
    assert len(first) == 3 and {j["state"] for j in first} == {"SUCCEEDED"}

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nworkload: digits-mlp\nentrypoint: x.py\n")
    invalid = run_cli(tmp_path, "submit", str(bad))
    assert invalid.returncode == 5 and "workload" in invalid.stderr and "Traceback" not in invalid.stderr
    missing = run_cli(tmp_path, "show", "999999")
    assert missing.returncode == 3 and "404" in missing.stderr and "Traceback" not in missing.stderr
    assert missing.stderr.count("\n") == 1
    assert run_cli(tmp_path, "stop", "999999").returncode == 3
    assert run_cli(tmp_path, "drain", "no-such-node").returncode == 3


def test_login_again_replaces_the_token_and_logout_revokes_it(console_url: str, tmp_path: Path) -> None:
    user = User.objects.create_user("cli-user", password="pw-cli-user-1")
    assert run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user").returncode == 0
    first = ApiToken.objects.get(user=user, revoked=False)

    again = run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user")
    assert again.returncode == 0, again.stderr
    second = ApiToken.objects.get(user=user, revoked=False)
    assert second.pk != first.pk and second.name == first.name
    first.refresh_from_db()
    assert first.revoked

    tokens = run_cli(tmp_path, "tokens", "--json")
    assert tokens.returncode == 0 and [t["id"] for t in json.loads(tokens.stdout)] == [second.pk]

    # Signing in here as someone else revokes the token the first login stored (no name clash
    # makes the console replace it).
    User.objects.create_user("other-user", password="pw-cli-user-1")
    other = run_cli(tmp_path, "login", "--url", console_url, "--username", "other-user")
    assert other.returncode == 0 and "previous CLI token is revoked" in other.stderr, other.stderr
    second.refresh_from_db()
    assert second.revoked
    second = ApiToken.objects.get(user__username="other-user", revoked=False)

    out = run_cli(tmp_path, "logout")
    assert out.returncode == 0, out.stderr
    second.refresh_from_db()
    assert second.revoked and not (tmp_path / "config.json").exists()
    after = run_cli(tmp_path, "ls")
    assert after.returncode == 4 and "trainyard login" in after.stderr


def test_cli_without_login_says_how_to_log_in(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "ls")
    assert result.returncode == 4
    assert "trainyard login" in result.stderr


def test_wrong_password_is_refused(console_url: str, tmp_path: Path) -> None:
    User.objects.create_user("cli-user", password="something-else-1")
    result = run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user")
    assert result.returncode == 4 and "wrong username or password" in result.stderr
    assert not (tmp_path / "config.json").exists()
