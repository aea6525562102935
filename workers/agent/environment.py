"""What a rank inherits from the agent's environment: an allow-list, never the agent's secrets.

A job is hostile until proven otherwise and reads anything in its environment. The agent's own
environment holds credentials (under ``bin/run``: ``DATABASE_URL`` with the database's password,
``REDIS_URL``, ``TRAINYARD_NODE_TOKEN``), so a rank gets only what a program needs to run on
this host: the search paths, home and locale, the accelerator and transport settings (CUDA_*,
NCCL_*, GLOO_*, TP_*, TORCH_*), thread counts, the Python settings that matter, and the agent's
session marker (the reaper finds ranks by it). On top of that come the job's own ``env`` and
torchrun's contract, which the round sets (launcher.rank_env). Cold ranks and the warm pool's
interpreters (warmpool.py) are given the same, so a warm rank sees what a cold one does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from workers.agent.reaper import ENV_AGENT_SESSION

INHERITED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "TMPDIR",
        "LANG",
        "LANGUAGE",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONWARNINGS",
        "PYTHONFAULTHANDLER",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONNOUSERSITE",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        # Set on some processors here: older OpenBLAS builds compute wrong results without them.
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        ENV_AGENT_SESSION,
    }
)
INHERITED_PREFIXES = ("LC_", "CUDA_", "NCCL_", "GLOO_", "TP_", "TORCH_", "NVIDIA_", "OMP_", "MKL_", "KMP_")
# Never inherited, whatever the lists above say: names that carry credentials.
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|PASSWD|CREDENTIAL|_KEY$|^KEY$|API_KEY|DATABASE_URL|REDIS_URL", re.I
)


def inherited(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the agent's environment a rank may see."""
    return {
        name: value
        for name, value in environ.items()
        if (name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES)) and not SECRET_NAME.search(name)
    }


def rank_environment(environ: Mapping[str, str], round_env: Mapping[str, str]) -> dict[str, str]:
    """A rank's whole environment: what it inherits from the agent, then the round's (the job's
    own env and torchrun's contract), which wins."""
    return {**inherited(environ), **round_env}
