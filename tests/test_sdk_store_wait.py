"""The SDK's wait for a round's store: clients connect only once the new rank 0 listens."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from workers.net import free_port, wait_listening


def test_a_store_that_never_listens_is_a_timeout() -> None:
    port = free_port()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port} is not listening"):
        wait_listening("127.0.0.1", port, timeout=0.2)


def test_it_returns_once_a_late_store_listens_and_the_client_then_works() -> None:
    port = free_port()
    started: list[dist.TCPStore] = []
    opening = threading.Event()  # set just before the port can listen

    def open_master() -> None:
        time.sleep(0.3)
        opening.set()
        started.append(dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False))

    opener = threading.Thread(target=open_master)
    opener.start()
    try:
        wait_listening("127.0.0.1", port, timeout=10)
        assert opening.is_set(), "returned before the store listened"
        client = dist.TCPStore(
            "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=5)
        )
        client.set("joined", "1")
    finally:
        opener.join()
    assert started[0].get("joined") == b"1"
