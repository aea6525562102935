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

How the console runs it: the controller places the coordinator (one, on node rank 0), M PS
and N workers on the job's nodes and picks the coordinator's and each PS's port; the
agent starts each as a rank with ``PsEnv``'s variables (workers/agent/launcher.py ``ps_env``). The
worker role is resized in place (workers started or stopped within the running round; the PS and
the coordinator run on) and a worker's exit never stops the round. Changing M is a new round: every
PS gets SIGTERM (each writes a final checkpoint) and M' PS re-shard from it. A PS that dies fails
the round: the next one resumes every PS from its checkpoint. Hybrid mode is not offered by the
console yet (its workers' DDP group would have to re-form on every worker change).
"""
