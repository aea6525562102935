"""``python -m workers.agent --name gpu-07 [--broker URL] [--token TOKEN] ...``"""

from __future__ import annotations

import logging
import sys

from workers.agent.app import run_agent
from workers.agent.config import parse_config


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_agent(parse_config(argv))


if __name__ == "__main__":
    sys.exit(main())
