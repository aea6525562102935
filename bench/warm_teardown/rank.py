"""One rank of bench/warm_teardown: what a warm interpreter is when it is handed a script, then
the script. ``WARM_TEARDOWN_VARIANT``: ``guarded`` (workers.agent.warm.preload as shipped),
``unguarded`` (the same imports, torch._dynamo included, but torch's own context stash and
destroy_process_group), ``lean``
(the imports without torch._dynamo, as before it was preloaded)."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from workers.agent import warm  # noqa: E402

variant = os.environ["WARM_TEARDOWN_VARIANT"]
import torch.distributed  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402

stash, destroy = torch._C._stash_obj_in_tls, c10d.destroy_process_group
if variant == "lean":
    import torch.distributed.elastic.multiprocessing.errors
    import torch.nn.parallel
    import torch.optim
else:
    warm.preload()
    if variant == "unguarded":
        torch._C._stash_obj_in_tls = stash
        c10d.destroy_process_group = torch.distributed.destroy_process_group = destroy
warm.freeze_heap()
script = str(REPO / "tests" / "scripts" / "plain_ddp.py")
sys.argv = [script, *sys.argv[1:]]
sys.path[0] = str(Path(script).parent)
runpy.run_path(script, run_name="__main__")
