"""The warm interpreter's preload: torch._dynamo is imported ahead of the launch, and backward()
keeps its contextvars copy out of the thread's torch TLS until something is compiled (so gloo
works launched in backward carry no Python object: workers/agent/warm.py explains the hang).

Each case runs in a fresh interpreter: the preload patches torch for the process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

BACKWARD_THEN_COMPILE = """
import json, sys, torch
{setup}
during = []  # whether the context is in this thread's torch TLS while backward runs
model = torch.nn.Linear(2, 1)
model.weight.register_hook(lambda grad: during.append(torch._C._is_key_in_tls("context")))
model(torch.ones(1, 2)).sum().backward()
compiled = torch.compile(lambda x: (x * 2).sum(), backend="eager")
x = torch.ones(2, requires_grad=True)
x.register_hook(lambda grad: during.append(torch._C._is_key_in_tls("context")))
compiled(x).backward()
print(json.dumps({{
    "eager": during[0],
    "compiled": during[1],
    "after": torch._C._is_key_in_tls("context"),
    "dynamo_before_backward": DYNAMO_BEFORE,
}}))
"""


def run(setup: str) -> dict[str, Any]:
    code = BACKWARD_THEN_COMPILE.format(setup=textwrap.dedent(setup))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_torch_itself_stashes_the_context_at_every_backward() -> None:
    """What the guard changes: without it, even an eager backward has the context in TLS while it
    runs (so collectives it launches copy it); torch removes it when backward returns."""
    seen = run("DYNAMO_BEFORE = 'torch._dynamo' in sys.modules")
    assert seen == {"eager": True, "compiled": True, "after": False, "dynamo_before_backward": False}


def test_a_preloaded_rank_stashes_it_only_once_something_was_compiled() -> None:
    seen = run(
        """
        from workers.agent import warm
        warm.preload()
        warm.preload()  # a second install does not wrap the wrapper
        assert getattr(torch._C._stash_obj_in_tls, "_trainyard_guard", False)
        DYNAMO_BEFORE = "torch._dynamo" in sys.modules
        """
    )
    assert seen == {"eager": False, "compiled": True, "after": False, "dynamo_before_backward": True}


def test_a_preloaded_rank_destroys_its_group_after_a_pause() -> None:
    """destroy_process_group, by either name, is the pausing wrapper, and it still destroys."""
    code = textwrap.dedent(
        """
        import json, time, torch, torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from workers.agent import warm
        warm.preload()
        warm.preload()
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        t = torch.ones(1)
        dist.all_reduce(t)
        started = time.monotonic()
        dist.destroy_process_group()
        print(json.dumps({
            "same": dist.destroy_process_group is c10d.destroy_process_group,
            "marked": getattr(dist.destroy_process_group, "_trainyard_drain", False),
            "wrapped_once": not getattr(dist.destroy_process_group.__wrapped__, "_trainyard_drain", False),
            "paused": time.monotonic() - started >= warm.GLOO_DRAIN_SECONDS,
            "destroyed": not dist.is_initialized(),
        }))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"same": True, "marked": True, "wrapped_once": True, "paused": True, "destroyed": True}
