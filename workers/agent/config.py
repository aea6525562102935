"""Agent settings: command-line flags with environment fallbacks."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from workers.agent.retention import DEFAULT_KEEP_ROUNDS_DAYS
from workers.agent.warmpool import DEFAULT_WARM_POOL

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
DEFAULT_HEARTBEAT_SECONDS = 2.0
# How long a rank's process may take to exit once its Python code has ended (runner.py records
# that moment after the code's threads and atexit handlers are done; what is left is the
# interpreter's teardown, under a second with torch). Past it, the process is killed.
DEFAULT_TEARDOWN_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class AgentConfig:
    name: str
    broker_url: str
    token: str
    address: str  # "" = the source address of the route to the broker (workers/agent/network.py)
    slots: int  # 0 = the CPU count
    heartbeat: float
    data_dir: Path
    checkpoint_root: Path
    warm_pool: int = DEFAULT_WARM_POOL  # pre-started rank interpreters (workers/agent/warmpool.py); 0 = none
    teardown_timeout: float = DEFAULT_TEARDOWN_TIMEOUT_SECONDS
    keep_rounds_days: float = DEFAULT_KEEP_ROUNDS_DAYS  # past rounds' files (retention.py); 0 = forever
    join_token: str = ""  # one-time enrolment (credential.py); unused once the node has its credential
    console_url: str = ""  # the console's web address: enrolment, code bundles
    interface: str = ""  # "" = the interface holding ``address``
    console_key: str = ""  # the console's public Ed25519 key (credential.py: else learnt at enrolment)

    @property
    def rounds_dir(self) -> Path:
        return self.data_dir / "rounds"

    @property
    def bundles_dir(self) -> Path:
        return self.data_dir / "bundles"

    def checkpoint_dir(self, run_id: str) -> Path:
        """One directory per run (a job of one console), the same on every host.

        Keyed by the run id rather than the job id: two consoles (or one whose database was
        reset) both have a job 1, and a new job must never resume an old job's checkpoint.
        """
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id).strip("._") or "run"
        return self.checkpoint_root / safe


def parse_config(argv: list[str] | None = None) -> AgentConfig:
    parser = argparse.ArgumentParser(prog="python -m workers.agent", description="Trainyard node agent")
    parser.add_argument("--name", required=True, help="node name; the agent consumes queue node.<name>")
    parser.add_argument("--broker", default="", help="Redis broker URL (TRAINYARD_BROKER_URL, REDIS_URL)")
    parser.add_argument(
        "--join-token",
        default="",
        help="one-time join token to enrol this node (TRAINYARD_JOIN_TOKEN); the node's own credential "
        "is then kept in <data-dir>/node_credential",
    )
    parser.add_argument("--console", default="", help="console URL to enrol at (TRAINYARD_CONSOLE_URL)")
    parser.add_argument(
        "--token", default="", help="shared node token of a single-machine console (TRAINYARD_NODE_TOKEN)"
    )
    parser.add_argument(
        "--console-key",
        default="",
        help="the console's public command key (TRAINYARD_CONSOLE_KEY; `manage.py commandkey` prints it); "
        "an enrolled agent learns it at enrolment",
    )
    parser.add_argument(
        "--address",
        default="",
        help="address peers reach this host at (TRAINYARD_AGENT_ADDRESS); default: the source address "
        "of the route to the broker",
    )
    parser.add_argument(
        "--interface",
        default="",
        help="network interface the ranks' transports use (TRAINYARD_AGENT_INTERFACE; gloo, NCCL, "
        "TensorPipe); default: the one holding the address",
    )
    parser.add_argument("--slots", type=int, default=0, help="rank slots (default: CPU count)")
    parser.add_argument("--heartbeat", type=float, default=DEFAULT_HEARTBEAT_SECONDS)
    parser.add_argument("--data-dir", default="", help="TRAINYARD_AGENT_DATA, ~/.trainyard-agent/<name>")
    parser.add_argument(
        "--checkpoint-root",
        default="",
        help="TRAINYARD_CHECKPOINT_ROOT, default <data-dir>/../checkpoints; shared storage on a cluster",
    )
    parser.add_argument(
        "--warm-pool",
        type=int,
        default=DEFAULT_WARM_POOL,
        help="interpreters kept ready with torch imported for fast rank starts (~300 MB each; the pool "
        "keeps up to twice the last round's local ranks); 0 disables",
    )
    parser.add_argument(
        "--teardown-timeout",
        type=float,
        default=DEFAULT_TEARDOWN_TIMEOUT_SECONDS,
        help="seconds a rank may spend exiting after its Python code ended before it is killed "
        "(its exit code stands)",
    )
    parser.add_argument(
        "--keep-rounds-days",
        type=float,
        default=DEFAULT_KEEP_ROUNDS_DAYS,
        help="days a past round's local files (logs, telemetry) are kept once unchanged; 0 keeps them",
    )
    ns = parser.parse_args(argv)
    broker = ns.broker or os.environ.get("TRAINYARD_BROKER_URL") or os.environ.get("REDIS_URL") or ""
    data_dir = Path(
        ns.data_dir or os.environ.get("TRAINYARD_AGENT_DATA") or Path.home() / ".trainyard-agent" / ns.name
    ).resolve()
    checkpoint_root = Path(
        ns.checkpoint_root or os.environ.get("TRAINYARD_CHECKPOINT_ROOT") or data_dir.parent / "checkpoints"
    ).resolve()
    return AgentConfig(
        name=ns.name,
        broker_url=broker or DEFAULT_BROKER_URL,
        token=ns.token or os.environ.get("TRAINYARD_NODE_TOKEN", ""),
        join_token=ns.join_token or os.environ.get("TRAINYARD_JOIN_TOKEN", ""),
        console_url=ns.console or os.environ.get("TRAINYARD_CONSOLE_URL", ""),
        address=ns.address or os.environ.get("TRAINYARD_AGENT_ADDRESS", ""),
        interface=ns.interface or os.environ.get("TRAINYARD_AGENT_INTERFACE", ""),
        console_key=ns.console_key or os.environ.get("TRAINYARD_CONSOLE_KEY", ""),
        slots=ns.slots,
        heartbeat=ns.heartbeat,
        data_dir=data_dir,
        checkpoint_root=checkpoint_root,
        warm_pool=max(0, ns.warm_pool),
        teardown_timeout=max(0.0, ns.teardown_timeout),
        keep_rounds_days=max(0.0, ns.keep_rounds_days),
    )
