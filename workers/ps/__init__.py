"""Parameter-server runtime: the ``parameter_server`` strategy's processes and their gRPC contract.

Modules:
- ``ps.proto`` -> ``ps_pb2*.py`` (generated, ``generate.py``): the wire contract.
- ``contract.py``: the environment every process of a PS job is started with (one place).
- ``state.py``: ``PsState``, a PS's shards and every decision about them (in-process).
- ``server.py``: a PS process (``Servicer`` converts messages to ``PsState`` calls, ``main`` serves).
- ``store.py``, ``optim.py``, ``placement.py``: rows and dense parameters, on-PS optimizers,
  placement and deterministic lazy initialisation.
- ``checkpoint.py``: per-PS atomic checkpoints and re-sharding to another PS count.
- ``coordinator.py``: data shards with leases, membership, the synchronous step barrier.
- ``client.py``: the worker side (sharded pull/push, coordinator calls); ``workers/sdk/ps.py`` is
  the user-facing API on top of it.
- ``stats.py``: statistics every process reports through the SDK's telemetry.
- ``local.py``: starts a whole job on this host (tests, ``bench/ps``).

How the console will run it (next round): the controller allocates a port for the coordinator and
for each PS, and starts three kinds of process through the agents, each with
``PsEnv(...).to_environ()``: the coordinator (one, on any host), M PS and N workers, the latter two
shown and resized as separate roles. Resizing workers (async/sync) starts or stops worker
processes only; hybrid workers form a DDP group, so a worker resize there is a new worker round
(new MASTER_PORT) that leaves the PS and the coordinator running. Changing M stops every PS with
SIGTERM (each writes a final checkpoint), starts M' PS that re-shard from it, and restarts the
workers with the new address list. A PS that dies is restarted at the same address and resumes
from its checkpoint while the workers retry (TRAINYARD_PS_RETRY_S).
"""
