"""What a job's ``env`` may set: valid names, less those the launcher owns."""

from __future__ import annotations

import re

from workers.ps import contract as ps_contract

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What an env value reads as to someone who may not see it (a viewer, a read token).
HIDDEN = "(hidden)"
# Names the launcher owns: a job may not override the rendezvous or rank contract.
RESERVED_ENV = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "CUDA_VISIBLE_DEVICES",
    # A parameter-server process's place (workers/ps/contract.py); tunables such as
    # TRAINYARD_PS_LEASE_S stay the job's to set.
    ps_contract.ENV_ROLE,
    ps_contract.ENV_INDEX,
    ps_contract.ENV_PS_COUNT,
    ps_contract.ENV_WORKER_COUNT,
    ps_contract.ENV_ADDRESSES,
    ps_contract.ENV_COORDINATOR,
    ps_contract.ENV_MODE,
    # The console's per-job secret of the PS and the coordinator (console/jobs/spec.py).
    ps_contract.ENV_SECRET,
}
