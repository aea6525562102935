"""Built-in workloads, run as ``python -m workers.workloads <name> [--set key=value ...]``.

The catalogue (``workers.workloads.catalog``) imports no torch; the workloads themselves are
imported only when one runs.
"""
