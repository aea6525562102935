"""How one rank process is made: its command, its environment (torchrun's contract plus
TRAINYARD_*), its files, and the Popen wrapper from torch.distributed.elastic.

A script that runs under ``torchrun`` runs unchanged here: every variable torchrun's local agent
sets for a worker is set the same way, and rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT
(the controller hands every round a fresh port, so no round reuses another's store).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from workers import protocol
from workers.agent import runner, stacks
from workers.agent.config import AgentConfig
from workers.agent.environment import rank_environment
from workers.agent.network import transport_env
from workers.agent.warmpool import WarmPool, must_start_cold, parse_python_command, send_request, warm_request
from workers.protocol import RoundSpec
from workers.ps import contract as ps_contract
from workers.sdk.elastic_control import Control, write_control

logger = logging.getLogger(__name__)

DOWNLOAD_CHUNK_BYTES = 1 << 20
DOWNLOAD_TIMEOUT_SECONDS = 60.0  # between bytes
DOWNLOAD_CONNECT_TIMEOUT_SECONDS = 10.0
DOWNLOAD_ATTEMPTS = 4
DOWNLOAD_BACKOFF_SECONDS = 1.0
RUNNER_PATH = os.path.realpath(runner.__file__)


class LaunchError(Exception):
    """The round cannot start on this host (bad bundle, missing entrypoint)."""


@dataclass(frozen=True)
class RankFiles:
    directory: Path
    stdout: Path
    stderr: Path
    error_file: Path
    telemetry: Path
    end_file: Path  # how the rank's Python code ended, before its interpreter's teardown (runner.py)
    control: Path  # the round the rank is in, for sdk.elastic; the SDK's state is beside it
    progress: Path  # the SDK's step cell (workers/sdk/progress_cell.py)

    @classmethod
    def for_rank(cls, config: AgentConfig, spec: RoundSpec, local_rank: int) -> RankFiles:
        directory = (
            config.rounds_dir / f"job-{spec['job_id']}" / f"round-{spec['round']}" / f"rank-{local_rank}"
        )
        return cls(
            directory=directory,
            stdout=directory / "stdout.log",
            stderr=directory / "stderr.log",
            error_file=directory / "error.json",
            telemetry=directory / "telemetry.jsonl",
            end_file=directory / "ended.json",
            control=directory / "control.json",
            progress=directory / "progress",
        )

    def prepare(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except FileNotFoundError:
            # The job's empty directory was pruned (retention.py) while this one was being made.
            self.directory.mkdir(parents=True, exist_ok=True)
        # A redelivered start of the same round must not read the previous attempt's files.
        self.error_file.unlink(missing_ok=True)
        self.end_file.unlink(missing_ok=True)
        self.progress.unlink(missing_ok=True)


def global_rank(spec: RoundSpec, local_rank: int) -> int:
    if "ps" in spec:
        return spec["ps"]["processes"][local_rank]["rank"]
    return spec["node_rank"] * spec["nproc_per_node"] + local_rank


def ps_role(spec: RoundSpec, local_rank: int) -> str:
    """The parameter-server role of a local rank ("coordinator", "ps", "worker"), "" otherwise."""
    return spec["ps"]["processes"][local_rank]["role"] if "ps" in spec else ""


def survivable(spec: RoundSpec, local_rank: int) -> bool:
    """Whether the rest of the round keeps running when this rank fails: a parameter-server
    worker's shard is re-queued by the coordinator on lease expiry, so its loss costs the PS and
    the other workers nothing (the controller decides what it costs the job)."""
    return ps_role(spec, local_rank) == ps_contract.Role.WORKER


def removed(spec: RoundSpec, local_rank: int) -> bool:
    """A parameter-server worker the controller took out of the round (its role shrank)."""
    processes = spec["ps"]["processes"] if "ps" in spec else []
    return local_rank < len(processes) and bool(processes[local_rank].get("removed"))


def regroup(spec: RoundSpec, started: set[int]) -> tuple[list[int], set[int]]:
    """For a round whose local ranks ``started`` were started, given its updated spec: the local
    ranks to start (workers added) and those to stop (workers removed)."""
    processes = spec["ps"]["processes"] if "ps" in spec else []
    start = [i for i, p in enumerate(processes) if i not in started and not p.get("removed")]
    stop = {i for i in started if i < len(processes) and processes[i].get("removed")}
    return start, stop


def ps_env(config: AgentConfig, spec: RoundSpec, local_rank: int) -> dict[str, str]:
    """workers/ps/contract.py's variables for a parameter-server rank. Tunables the job sets
    (TRAINYARD_PS_LEASE_S ...) stay; the process's place comes from the round."""
    layout = spec["ps"]
    process = layout["processes"][local_rank]
    env = {
        ps_contract.ENV_ROLE: process["role"],
        ps_contract.ENV_INDEX: str(process["index"]),
        ps_contract.ENV_PS_COUNT: str(len(layout["addresses"])),
        ps_contract.ENV_WORKER_COUNT: str(layout["worker_count"]),
        ps_contract.ENV_ADDRESSES: ",".join(layout["addresses"]),
        ps_contract.ENV_COORDINATOR: layout["coordinator"],
        ps_contract.ENV_MODE: layout["mode"],
        # Always from the round, never the job's env: without it the servers refuse to start.
        ps_contract.ENV_SECRET: layout.get("secret", ""),
        # The processes of a PS job form no torch.distributed group, but a hybrid job's workers
        # (below): their dense group, of the workers started together.
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "ROLE_NAME": process["role"],
        "ROLE_RANK": str(process["index"]),
    }
    if not spec["env"].get(ps_contract.ENV_CHECKPOINT_DIR):
        # Per job and host: a PS restarted on this host (a failure round) resumes from it.
        env[ps_contract.ENV_CHECKPOINT_DIR] = str(config.checkpoint_dir(spec["run_id"]) / "ps")
    if "dense_rank" in process:
        host, _, port = process["dense_master"].rpartition(":")
        env.update(
            {
                "RANK": str(process["dense_rank"]),
                "WORLD_SIZE": str(process["dense_world"]),
                "MASTER_ADDR": host,
                "MASTER_PORT": port,
            }
        )
    if process["role"] == ps_contract.Role.WORKER:
        env[ps_contract.ENV_WORKER_ID] = f"worker-{process['index']}-r{spec['round']}-{config.name}"
    return env


def rank_env(config: AgentConfig, spec: RoundSpec, local_rank: int, files: RankFiles) -> dict[str, str]:
    rank = global_rank(spec, local_rank)
    env = dict(spec["env"])
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(spec["world_size"]),
            "LOCAL_WORLD_SIZE": str(spec["nproc_per_node"]),
            "GROUP_RANK": str(spec["node_rank"]),
            "GROUP_WORLD_SIZE": str(spec["nnodes"]),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(spec["world_size"]),
            "ROLE_NAME": "default",
            "MASTER_ADDR": spec["master_addr"],
            "MASTER_PORT": str(spec["master_port"]),
            "TORCHELASTIC_RESTART_COUNT": str(spec["restart_count"]),
            "TORCHELASTIC_MAX_RESTARTS": str(spec["max_restarts"]),
            "TORCHELASTIC_RUN_ID": spec["run_id"],
            # Rank 0 hosts the store itself (env:// init), as with a static torchrun rendezvous.
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCHELASTIC_ERROR_FILE": str(files.error_file),
            runner.END_FILE_ENV: str(files.end_file),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": spec["env"].get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "OMP_NUM_THREADS": spec["env"].get("OMP_NUM_THREADS", "1"),
            "CUDA_VISIBLE_DEVICES": ",".join(str(index) for index in spec["gpu_indices"]),
            protocol.ENV_JOB_ID: str(spec["job_id"]),
            protocol.ENV_ROUND: str(spec["round"]),
            protocol.ENV_NODE: config.name,
            protocol.ENV_CONTROL: str(files.control),
            protocol.ENV_PROGRESS: str(files.progress),
            protocol.ENV_CHECKPOINT_DIR: str(config.checkpoint_dir(spec["run_id"])),
            protocol.ENV_TELEMETRY: str(files.telemetry),
            protocol.ENV_HYPERPARAMETERS: json.dumps(spec["hyperparameters"]),
            protocol.ENV_PRECISION: spec["precision"],
            protocol.ENV_GRAD_ACCUM: str(spec["grad_accum_steps"]),
            protocol.ENV_STRATEGY: spec["strategy"],
        }
    )
    # gloo, NCCL and TensorPipe on the interface the host registered with, not the one its host
    # name resolves to (loopback on a default install): unless the job says otherwise.
    env.update(transport_env(spec.get("interface", ""), spec["env"]))
    if "ps" in spec:
        env.update(ps_env(config, spec, local_rank))
    if spec["gpu_indices"]:
        env.update(flight_recorder_env(spec, files))
    if not spec["env"].get(protocol.ENV_TENSORBOARD_DIR):
        env[protocol.ENV_TENSORBOARD_DIR] = str(tensorboard_dir(config, spec, rank))
    return env


def flight_recorder_env(spec: RoundSpec, files: RankFiles) -> dict[str, str]:
    """NCCL's Flight Recorder for ranks with GPUs (unverified here: no GPU): each keeps a trace of
    its last collectives and dumps it when one times out, into the rank's directory, where the hang
    watcher finds it (stacks.flight_recorder_dump). The job's own env wins."""
    wanted = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(files.directory / stacks.FLIGHT_RECORDER_PREFIX),
    }
    return {name: spec["env"].get(name, value) for name, value in wanted.items()}


def tensorboard_dir(config: AgentConfig, spec: RoundSpec, rank: int) -> Path:
    """The rank's own TensorBoard directory: the job's checkpoint directory (shared storage on a
    cluster) holds every rank of every round, so ``tensorboard --logdir`` on it shows them all."""
    return config.checkpoint_dir(spec["run_id"]) / "tensorboard" / f"round-{spec['round']}" / f"rank-{rank}"


def write_rank_control(path: Path, spec: RoundSpec, local_rank: int) -> None:
    """Tells the rank (sdk.elastic) which round it is in; a survivor of an in-place round gets
    the new round this way, at its next step boundary."""
    write_control(
        path,
        Control(
            job_id=str(spec["job_id"]),
            round=spec["round"],
            rank=global_rank(spec, local_rank),
            local_rank=local_rank,
            world_size=spec["world_size"],
            master_addr=spec["master_addr"],
            master_port=spec["master_port"],
            joiners=joiners(spec),
        ),
    )


def joiners(spec: RoundSpec) -> int:
    """How many ranks of an in-place round start afresh (its survivors wait for them)."""
    carried = carried_ranks(spec)
    return 0 if carried is None else spec["world_size"] - len(carried)


def carried_ranks(spec: RoundSpec) -> dict[int, int] | None:
    """An in-place round's survivors, old global rank -> new global rank (None: not in place)."""
    carry = spec.get("carry_over")
    if carry is None:
        return None
    return {int(old): int(new) for old, new in carry["ranks"].items()}


@dataclass(frozen=True)
class Command:
    entrypoint: str
    args: tuple[str, ...]
    cwd: Path | None


def rank_command(spec: RoundSpec, bundle_dir: Path | None, local_rank: int = 0) -> Command:
    cwd = bundle_dir or (Path(spec["workdir"]) if spec["workdir"] else None)
    role = ps_role(spec, local_rank)
    if role in (ps_contract.Role.COORDINATOR, ps_contract.Role.PS):
        # The PS runtime's own servers; the job's workload or entrypoint is the worker's code.
        module = "workers.ps.coordinator" if role == ps_contract.Role.COORDINATOR else "workers.ps.server"
        return Command(sys.executable, ("-m", module), cwd)
    args = tuple(str(arg) for arg in spec["args"])
    if spec["workload"]:
        return Command(sys.executable, ("-m", "workers.workloads", spec["workload"], *args), cwd)
    entrypoint = spec["entrypoint"]
    if not entrypoint:
        raise LaunchError("the round names neither a workload nor an entrypoint")
    if entrypoint.endswith(".py"):
        script = (cwd / entrypoint) if cwd is not None else Path(entrypoint)
        if not script.is_file():
            raise LaunchError(f"entrypoint {entrypoint!r} not found in {cwd or Path.cwd()}")
        return Command(sys.executable, (entrypoint, *args), cwd)
    return Command(entrypoint, args, cwd)


def cold_command(args: tuple[str, ...]) -> tuple[str, ...]:
    """The command line that starts a rank in a fresh process: a Python script or module runs
    under workers.agent.runner (as a warm rank's does), which records how the code ended, so a
    crash in the interpreter's teardown is told from a failure of the code. Anything else (a
    binary, interpreter options) runs as given. The runner goes by its path, not ``-m``: a
    ``workers`` package in the job's directory or PYTHONPATH cannot shadow it."""
    python = parse_python_command(args[0], tuple(args[1:]))
    if python is None:
        return args
    mode, target, rest = python
    return (sys.executable, RUNNER_PATH, mode, target, *rest)


class RankHandler(SubprocessHandler):
    """torch's SubprocessHandler (new session per rank, per-rank stdout/stderr files, close() =
    killpg) plus a working directory, which it does not support."""

    def __init__(self, command: Command, env: dict[str, str], files: RankFiles, local_rank: int) -> None:
        self._cwd = command.cwd
        # Not torch's os.environ plus env: the agent's environment holds its secrets (environment.py).
        self._env = rank_environment(os.environ, env)
        self.runs_python = parse_python_command(command.entrypoint, command.args) is not None
        """The process is the Python interpreter running the rank's code (under runner.py), not
        a binary or a shell that may run it as a child: see stop_signal_target."""
        super().__init__(
            entrypoint=command.entrypoint,
            args=command.args,
            env=env,
            stdout=str(files.stdout),
            stderr=str(files.stderr),
            local_rank_id=local_rank,
            numa_options=None,
        )

    def _popen(self, args: tuple, env: dict[str, str]) -> subprocess.Popen:  # type: ignore[type-arg]
        return subprocess.Popen(
            args=cold_command(args),
            env=self._env,
            stdout=self._stdout,
            stderr=self._stderr,
            cwd=self._cwd,
            start_new_session=True,
        )

    def close_files(self) -> None:
        for stream in (self._stdout, self._stderr):
            if stream is not None and not stream.closed:
                stream.close()


def stop_signal_target(handler: RankHandler, signum: signal.Signals) -> Literal["process", "group"]:
    """Whom a signal to a rank goes to: ``"process"`` (its leader alone) or ``"group"``.

    SIGTERM, the request to stop gracefully, goes to a Python rank's interpreter alone, as
    Docker and Kubernetes send it to a container's first process: the code decides what its
    children do, and the group is SIGKILLed once the interpreter has exited (or at the grace
    period's end). Sent to the whole group it also ended a DataLoader's worker processes, whose
    death made the rank raise in its SIGCHLD handler mid-step instead of stopping at a step
    boundary: no snapshot of the last step, and about 2 s of interpreter teardown after the
    error (bench/elastic, a resize of tests/scripts/plain_ddp.py; torchrun does the same). A
    rank that is not a Python interpreter (a binary, a shell script running Python as its
    child) gets it as a group, as every other signal."""
    if signum == signal.SIGTERM and handler.runs_python:
        return "process"
    return "group"


class WarmLaunchError(Exception):
    """The warm process could not be handed the launch; the rank starts cold instead."""


class WarmRankHandler(RankHandler):
    """A RankHandler whose process is a warm-pool interpreter, adopted rather than spawned:
    ``proc`` is still a Popen child of the agent in its own session, so polling, killpg and
    exit reporting are the same as for a cold rank."""

    def __init__(
        self,
        command: Command,
        env: dict[str, str],
        files: RankFiles,
        local_rank: int,
        warm: subprocess.Popen[bytes],
    ) -> None:
        self._warm = warm
        self._files = files
        super().__init__(command, env, files, local_rank)

    def _popen(self, args: tuple, env: dict[str, str]) -> subprocess.Popen:  # type: ignore[type-arg]
        request = warm_request(
            args[0], tuple(args[1:]), self._cwd, self._env, self._files.stdout, self._files.stderr
        )
        try:
            if request is None:
                raise WarmLaunchError(f"not a warm-launchable command: {args!r}")
            send_request(self._warm, request)
        except (OSError, WarmLaunchError) as exc:
            self.close_files()
            raise WarmLaunchError(f"warm process {self._warm.pid} did not take the launch: {exc}") from exc
        return self._warm


def start_rank(
    command: Command, env: dict[str, str], files: RankFiles, local_rank: int, pool: WarmPool | None
) -> tuple[RankHandler, str]:
    """The rank's handler and how it started: ``"warm"`` (a pool process became the rank) or
    ``"cold"`` (a fresh Popen: no pool, pool empty, not a Python command, or an environment a
    running interpreter cannot honour)."""
    if pool is None or pool.size == 0:
        return RankHandler(command, env, files, local_rank), "cold"
    full_env = rank_environment(os.environ, env)  # what RankHandler will hand the process
    eligible = warm_request(
        command.entrypoint, command.args, command.cwd, full_env, files.stdout, files.stderr
    ) is not None and not must_start_cold(full_env, pool.start_env)
    warm = pool.take() if eligible else None
    if warm is None:
        return RankHandler(command, env, files, local_rank), "cold"
    try:
        return WarmRankHandler(command, env, files, local_rank, warm), "warm"
    except WarmLaunchError as exc:
        logger.warning("rank %s starts cold: %s", local_rank, exc)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(warm.pid, signal.SIGKILL)
        warm.wait()
        pool.forget(warm.pid)
        return RankHandler(command, env, files, local_rank), "cold"


class TransientDownloadError(Exception):
    """A download that may work if tried again: the connection failed or broke, or the console
    answered 5xx or 429."""


def bundle_url(config: AgentConfig, bundle: protocol.BundleRef) -> str:
    """Where the agent fetches a bundle: at the console URL it enrolled with when it has one (the
    console's own TRAINYARD_PUBLIC_URL may be an address only the console's host reaches), else
    the URL the console sent."""
    if config.console_url:
        return config.console_url.rstrip("/") + protocol.BUNDLE_PATH.format(sha256=bundle["sha256"].lower())
    return bundle["url"]


def fetch_bundle(config: AgentConfig, spec: RoundSpec) -> Path | None:
    """Downloads, verifies and extracts the round's code bundle, cached by sha256. A transient
    failure is tried again (DOWNLOAD_ATTEMPTS in all, backing off from DOWNLOAD_BACKOFF_SECONDS),
    so a console restarting under the agent does not fail the round; a 4xx answer or a digest
    that does not match is final."""
    bundle = spec["bundle"]
    if not bundle:
        return None
    sha256 = bundle["sha256"].lower()
    dest = config.bundles_dir / sha256
    if dest.is_dir():
        return dest
    from workers.agent.credential import warn_if_plain_http
    from workers.bundles import extract_bundle

    warn_if_plain_http(bundle["url"])
    config.bundles_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=config.bundles_dir, prefix=".fetch-") as tmp:
        archive = Path(tmp) / "bundle"
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            try:
                digest = download(bundle_url(config, bundle), config.token, archive)
                break
            except TransientDownloadError as exc:
                if attempt == DOWNLOAD_ATTEMPTS:
                    raise LaunchError(f"bundle download failed after {attempt} attempts: {exc}") from exc
                delay = DOWNLOAD_BACKOFF_SECONDS * 2 ** (attempt - 1)
                logger.warning(
                    "bundle download failed (attempt %s), again in %.1f s: %s", attempt, delay, exc
                )
                time.sleep(delay)
        if digest != sha256:
            raise LaunchError(f"bundle sha256 mismatch: expected {sha256}, got {digest}")
        try:
            # extract_bundle stages and renames into place itself, so agents sharing a cache
            # directory never see a half-extracted bundle.
            extract_bundle(archive, dest)
        except Exception as exc:
            if not dest.is_dir():
                raise LaunchError(f"bundle extraction failed: {exc}") from exc
    return dest


def download(url: str, token: str, archive: Path) -> str:
    """Streams ``url`` into ``archive`` with the node token; returns the sha256 of what came."""
    import requests

    digest = hashlib.sha256()
    try:
        with requests.get(
            url,
            headers={"Authorization": f"Bearer {token}"},
            stream=True,
            timeout=(DOWNLOAD_CONNECT_TIMEOUT_SECONDS, DOWNLOAD_TIMEOUT_SECONDS),
        ) as response:
            if response.status_code >= 500 or response.status_code == 429:
                raise TransientDownloadError(f"HTTP {response.status_code} from {url}")
            if not response.ok:
                raise LaunchError(f"bundle download failed: HTTP {response.status_code} from {url}")
            with archive.open("wb") as fh:
                for chunk in response.iter_content(DOWNLOAD_CHUNK_BYTES):
                    digest.update(chunk)
                    fh.write(chunk)
    except requests.RequestException as exc:
        # Connection refused or reset, a timeout, a body cut short: all worth another try.
        raise TransientDownloadError(str(exc)) from exc
    return digest.hexdigest()
