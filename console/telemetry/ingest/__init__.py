"""Ingest: agents' telemetry from the Redis stream into PostgreSQL, then to live viewers.

In parts, each a module with one responsibility:

- ``cursor``: which stream entries to read next (own pending ones first), ack, takeover, trim;
- ``trust``: which entries to believe: sealed by a live node, for a rank allocated to it;
- ``decoding``: an entry's JSON batch into typed rows, one list per table;
- ``storage``: one read's rows into PostgreSQL in one transaction, exactly once under replay;
- ``frames``: per-job live frames, thinned and paced;
- ``broadcast``: frames out through Redis pub/sub and the channel layer;
- ``stats``: ingest's own figures for /metrics;
- ``loop``: the loop that runs them, with its writer thread and its recovery from failures,
  run by ``manage.py ingest`` and by the tests alike.
"""
