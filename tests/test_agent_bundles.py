"""Code bundles: the agent downloads the round's bundle with its node token, verifies the
sha256, extracts it once (cached by digest) and runs the entrypoint inside it."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    round_spec,
    start_registered,
)
from workers import protocol

__all__ = ["agent_procs", "control_queue"]

TRAIN_PY = b"""
import json, os, sys
with open(os.path.join(os.environ["OUT"], "bundle-run-" + os.environ["TRAINYARD_JOB_ID"] + "-" + os.environ["RANK"]), "w") as fh:
    json.dump({"cwd": os.getcwd(), "args": sys.argv[1:]}, fh)
"""


def make_bundle() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("train.py")
        info.size = len(TRAIN_PY)
        info.mode = 0o644
        archive.addfile(info, io.BytesIO(TRAIN_PY))
    return buffer.getvalue()


class BundleServer:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.requests: list[str] = []  # the Authorization header of each request
        self.answers: list[int] = []  # statuses for the next requests (then 200); 0 = cut the body short
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.headers.get("Authorization", ""))
                status = server.answers.pop(0) if server.answers else 200
                if status == 0:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(server.payload)))
                    self.end_headers()
                    self.wfile.write(server.payload[: len(server.payload) // 2])
                    self.close_connection = True
                    return
                if status != 200:
                    self.send_error(status)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.payload)))
                self.end_headers()
                self.wfile.write(server.payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/bundle.tar.gz"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def bundle_server() -> Iterator[BundleServer]:
    server = BundleServer(make_bundle())
    yield server
    server.close()


def bundle_round(job_id: int, url: str, sha256: str, out: Path) -> protocol.RoundSpec:
    spec = round_spec(
        job_id=job_id,
        round_=1,
        node_rank=0,
        nnodes=1,
        nproc_per_node=1,
        master_port=29_998,
        entrypoint="train.py",
        args=["--lr", "0.1"],
        env={"OUT": str(out)},
    )
    spec["bundle"] = {"sha256": sha256, "url": url}
    spec["workdir"] = ""
    return spec


def test_rounds_run_from_a_verified_cached_bundle(
    agent_procs: AgentProcs, control_queue: ControlQueue, bundle_server: BundleServer, tmp_path: Path
) -> None:
    agent, _ = start_registered(agent_procs, control_queue, "host-b")
    sha256 = hashlib.sha256(bundle_server.payload).hexdigest()

    # When two jobs run from the same bundle
    for job_id in (91, 92):
        control_queue.send(
            agent.name,
            protocol.AGENT_START_ROUND,
            spec=bundle_round(job_id, bundle_server.url, sha256, tmp_path),
        )
        ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, node=agent.name, job_id=job_id)
        assert ended.kwargs["outcome"] == "succeeded", ended.kwargs

    # Then the entrypoint ran inside the extracted bundle with its args, and the bundle was
    # fetched once, with the node token
    extracted = agent.data_dir / "bundles" / sha256
    for job_id in (91, 92):
        run = json.loads((tmp_path / f"bundle-run-{job_id}-0").read_text())
        assert run == {"cwd": str(extracted), "args": ["--lr", "0.1"]}
    assert bundle_server.requests == [f"Bearer {agent_procs.token}"]

    # When a bundle's content does not match its digest
    control_queue.send(
        agent.name, protocol.AGENT_START_ROUND, spec=bundle_round(93, bundle_server.url, "0" * 64, tmp_path)
    )

    # Then the round fails without running anything, saying why
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, node=agent.name, job_id=93)
    assert ended.kwargs["outcome"] == "failed"
    assert "sha256 mismatch" in ended.kwargs["failures"][0]["error"]
    assert ended.kwargs["failures"][0]["launch"] is True  # the console's launch failure, not a crash
    assert not (tmp_path / "bundle-run-93-0").exists()
    assert not (agent.data_dir / "bundles" / ("0" * 64)).exists()


def test_a_download_that_fails_for_a_moment_is_tried_again_and_a_refusal_is_final(
    agent_procs: AgentProcs, control_queue: ControlQueue, bundle_server: BundleServer, tmp_path: Path
) -> None:
    agent, _ = start_registered(agent_procs, control_queue, "host-b-retry")
    sha256 = hashlib.sha256(bundle_server.payload).hexdigest()

    # When the console answers 503, then cuts the body short, then serves the bundle
    bundle_server.answers = [503, 0]
    control_queue.send(
        agent.name, protocol.AGENT_START_ROUND, spec=bundle_round(94, bundle_server.url, sha256, tmp_path)
    )

    # Then the third attempt runs the round
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 60, node=agent.name, job_id=94)
    assert ended.kwargs["outcome"] == "succeeded", ended.kwargs
    assert len(bundle_server.requests) == 3
    assert (tmp_path / "bundle-run-94-0").exists()

    # When another bundle's URL is refused (403)
    bundle_server.answers = [403]
    other = bundle_round(95, bundle_server.url + "?other", "1" * 64, tmp_path)
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=other)

    # Then the round fails at once, after one request, saying why
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, node=agent.name, job_id=95)
    assert ended.kwargs["outcome"] == "failed"
    assert "403" in ended.kwargs["failures"][0]["error"]
    assert len(bundle_server.requests) == 4
