"""The agent process: a Celery worker on queue ``node.<name>`` (solo pool, so rank processes
are children of this process and never of a pool child that Celery may replace) plus
threads and processes: the supervisor, the heartbeat and the telemetry shipper, the reaper process, and the
warm pool (workers/agent/warmpool.py: pre-started rank interpreters and their refill thread).

Boot: find the node's credential (credential.py; enrol with a join token the first time), start
the reaper, purge the node queue (commands from before a crash are stale; the controller answers
the registration with AGENT_SYNC listing what should run), register, then consume. Clean shutdown (SIGTERM/SIGINT, handled by Celery as a warm shutdown): stop every
round gracefully, send CONTROL_OFFLINE, flush telemetry.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from celery import Celery

from workers import protocol
from workers.agent import network, preflight
from workers.agent.config import AgentConfig
from workers.agent.control import ControlClient
from workers.agent.credential import (
    CredentialError,
    resolve_console_key,
    resolve_console_url,
    resolve_credential,
)
from workers.agent.hangwatch import HangWatcher
from workers.agent.inventory import node_info, node_load
from workers.agent.reaper import ENV_AGENT_SESSION, ReaperClient
from workers.agent.shipper import TelemetryShipper
from workers.agent.supervisor import DEFAULT_GRACE_PERIOD_SECONDS, StartRound, StopJob, Supervisor, Sync
from workers.agent.warmpool import WarmPool
from workers.protocol import PreflightRequest, RoundSpec
from workers.signing import CommandVerifier, report_key

logger = logging.getLogger("workers.agent")

SHUTDOWN_MARGIN_SECONDS = 15.0
CONTROL_FLUSH_SECONDS = 10.0
EXIT_NO_CREDENTIAL = 3  # not restarted with hope: the operator must enrol the node
EXIT_BAD_ADDRESS = 4  # --address names a host that does not resolve
EXIT_REFUSED = 5  # the console refused this agent's protocol: upgrade it


def make_celery_app(config: AgentConfig) -> Celery:
    app = Celery(f"trainyard-agent-{config.name}", broker=config.broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        # An unacknowledged command (the agent lost the broker midway) comes back after 2
        # minutes, not Redis's default hour; every command is safe to apply twice.
        broker_transport_options={"visibility_timeout": 120},
        worker_prefetch_multiplier=1,
        task_default_queue=protocol.node_queue(config.name),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        # Nothing drives agents through Celery's remote control; skipping its broadcast
        # queue keeps boot short and the broker tidy.
        worker_enable_remote_control=False,
    )
    return app


def register_tasks(
    app: Celery,
    supervisor: Supervisor,
    register: Callable[[], None],
    heartbeat_now: Callable[[], None],
    verifier: CommandVerifier,
    watcher: HangWatcher | None = None,
    preflight: Callable[[PreflightRequest], None] = lambda request: None,
    refused: Callable[[str], None] = lambda reason: None,
) -> None:
    """Every command runs only once its seal verifies (workers/signing.py); a refusal is logged."""

    def verified(command: str, kwargs: dict[str, Any]) -> bool:
        reason = verifier.refusal(command, kwargs)
        if reason:
            spec = kwargs.get("spec")
            job = (spec if isinstance(spec, dict) else kwargs).get("job_id")
            logger.warning("refused %s (job %r): %s", command, job, reason)
        return not reason

    @app.task(name=protocol.AGENT_START_ROUND, ignore_result=True)
    def start_round(**kwargs: Any) -> None:
        if verified(protocol.AGENT_START_ROUND, kwargs):
            supervisor.submit(StartRound(kwargs["spec"]))

    @app.task(name=protocol.AGENT_STOP_JOB, ignore_result=True)
    def stop_job(**kwargs: Any) -> None:
        if verified(protocol.AGENT_STOP_JOB, kwargs):
            grace_period = kwargs.get("grace_period")
            grace = DEFAULT_GRACE_PERIOD_SECONDS if grace_period is None else float(grace_period)
            supervisor.submit(StopJob(int(kwargs["job_id"]), int(kwargs["round"]), grace))

    @app.task(name=protocol.AGENT_SYNC, ignore_result=True)
    def sync(**kwargs: Any) -> None:
        if verified(protocol.AGENT_SYNC, kwargs):
            rounds: list[RoundSpec] = kwargs["rounds"]
            supervisor.submit(Sync(list(rounds)))

    @app.task(name=protocol.AGENT_REGISTER_AGAIN, ignore_result=True)
    def register_again(**kwargs: Any) -> None:
        if verified(protocol.AGENT_REGISTER_AGAIN, kwargs):
            reason = kwargs.get("reason") or "no reason given"
            logger.warning("the console asks this agent to register again: %s", reason)
            register()

    @app.task(name=protocol.AGENT_HEARTBEAT_NOW, ignore_result=True)
    def send_heartbeat_now(**kwargs: Any) -> None:
        if verified(protocol.AGENT_HEARTBEAT_NOW, kwargs):
            heartbeat_now()

    @app.task(name=protocol.AGENT_COLLECT_STACKS, ignore_result=True)
    def collect_stacks(**kwargs: Any) -> None:
        if verified(protocol.AGENT_COLLECT_STACKS, kwargs) and watcher is not None:
            watcher.collect(int(kwargs["job_id"]), int(kwargs["round"]), str(kwargs.get("reason") or ""))

    @app.task(name=protocol.AGENT_PREFLIGHT, ignore_result=True)
    def run_preflight(**kwargs: Any) -> None:
        if verified(protocol.AGENT_PREFLIGHT, kwargs):
            preflight(kwargs["request"])

    @app.task(name=protocol.AGENT_REFUSED, ignore_result=True)
    def registration_refused(**kwargs: Any) -> None:
        if verified(protocol.AGENT_REFUSED, kwargs):
            refused(str(kwargs.get("reason") or ""))


def preflight_runner(
    control: ControlClient, address: str, console_url: str
) -> Callable[[PreflightRequest], None]:
    """Runs each check in a thread of its own (it waits on peers: the node queue must not) and
    answers CONTROL_PREFLIGHT."""

    def run(request: PreflightRequest) -> None:
        def check() -> None:
            try:
                result = preflight.run_check(request, address, console_url)
            except Exception:
                logger.exception("pre-flight check %s failed", request.get("check_id"))
                return
            control.send(protocol.CONTROL_PREFLIGHT, check_id=int(request["check_id"]), result=result)

        threading.Thread(target=check, name=f"preflight-{request.get('check_id')}", daemon=True).start()

    return run


def purge_node_queue(app: Celery, name: str) -> int:
    with app.connection_for_write() as connection:
        purged: int = connection.default_channel.queue_purge(protocol.node_queue(name)) or 0
    return purged


class Heartbeat(threading.Thread):
    def __init__(self, interval: float, control: ControlClient, supervisor: Supervisor) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._interval = interval
        self._control = control
        self._supervisor = supervisor
        self._stopping = threading.Event()
        self._wake = threading.Event()

    def run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            self._control.send(
                protocol.CONTROL_HEARTBEAT, load=node_load(), rounds=self._supervisor.statuses()
            )

    def poke(self) -> None:
        """Send the next heartbeat now (news the controller waits for: a rank waits in place)."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.join(timeout=5)


def run_agent(config: AgentConfig) -> int:
    session = uuid.uuid4().hex
    config.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        # From here on config.token is the node's own credential (or the opted-in shared token).
        config = replace(config, token=resolve_credential(config), console_url=resolve_console_url(config))
        verifier = CommandVerifier(resolve_console_key(config), config.name)
    except CredentialError as exc:
        logger.error("%s", exc)
        return EXIT_NO_CREDENTIAL
    config.checkpoint_root.mkdir(parents=True, exist_ok=True)
    try:
        reach = network.detect(config.address, config.interface, (config.broker_url, config.console_url))
    except network.AddressError as exc:
        logger.error("--address: %s", exc)
        return EXIT_BAD_ADDRESS
    if not reach.interface:
        logger.warning(
            "no local interface holds %s: ranks pick their own (give --interface to choose)", reach.address
        )
    dns_warning = network.slow_lookup_warning(reach.address)
    if dns_warning:
        logger.warning("%s", dns_warning)
    app = make_celery_app(config)
    key = report_key(config.token)
    control = ControlClient(app, config.name, key, session)
    reaper = ReaperClient(session)
    shipper = TelemetryShipper(config.broker_url, config.name, key)
    pool = WarmPool.for_agent(config.warm_pool, (ENV_AGENT_SESSION, session), reaper, config.data_dir)
    supervisor = Supervisor(config, session, control, shipper, reaper, pool if config.warm_pool else None)
    heartbeat = Heartbeat(config.heartbeat, control, supervisor)
    supervisor.on_news = heartbeat.poke

    def register() -> None:
        control.send(protocol.CONTROL_REGISTER, info=node_info(reach, config.slots, dns_warning))

    refusal: list[str] = []

    def refused(reason: str) -> None:
        logger.error("the console refused this agent: %s", reason or "no reason given")
        refusal.append(reason)
        os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown, then the clean exit below

    watcher = HangWatcher(supervisor.watched, shipper, control.send)
    runner = preflight_runner(control, reach.address, config.console_url)
    register_tasks(app, supervisor, register, heartbeat.poke, verifier, watcher, runner, refused)
    shipper.resume_unshipped(config.rounds_dir)  # what a previous, killed agent left unsent
    shipper.start()
    supervisor.start()
    try:
        purged = purge_node_queue(app, config.name)
        info = node_info(reach, config.slots, dns_warning)
        logger.info(
            "agent %s (session %s, reaper pid %s): %s cpus, %s gpus, address %s on %s; purged %s stale "
            "commands",
            config.name,
            session,
            reaper.pid,
            info["cpus"],
            len(info["gpus"]),
            reach.address,
            reach.interface or "no local interface",
            purged,
        )
        control.send(protocol.CONTROL_REGISTER, info=info)
        heartbeat.start()
        watcher.start()
        pool.start()
        worker = app.Worker(
            hostname=f"{config.name}@{socket.gethostname()}",
            queues=[protocol.node_queue(config.name)],
            pool_cls="solo",
            concurrency=1,
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=True,
            loglevel="INFO",
            quiet=True,
        )
        worker.start()
    finally:
        logger.info("agent %s shutting down: stopping local rounds", config.name)
        supervisor.shutdown(timeout=supervisor.longest_grace() + SHUTDOWN_MARGIN_SECONDS)
        if heartbeat.is_alive():
            heartbeat.stop()
        if watcher.is_alive():
            watcher.stop()
        pool.close()
        control.send(protocol.CONTROL_OFFLINE)
        control.close(timeout=CONTROL_FLUSH_SECONDS)
        shipper.stop()
        reaper.close()
    return EXIT_REFUSED if refusal else 0
