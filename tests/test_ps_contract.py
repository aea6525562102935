"""The PS environment contract: what a launcher sets is what a process reads; bad values are named.

Also the wire: a malformed tensor or an unknown table gets a clear gRPC status from a real server.
"""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
import torch

from workers.net import free_port
from workers.ps import contract, ps_pb2, ps_pb2_grpc, tensors
from workers.ps.contract import ContractError, Mode, PsEnv, Role
from workers.ps.server import PsState, Servicer

SECRET = "s3cret-of-the-job"


def test_the_environment_round_trips() -> None:
    spec = PsEnv(
        role=Role.PS,
        index=1,
        ps_addresses=("127.0.0.1:5001", "10.0.0.2:5002"),
        coordinator="127.0.0.1:6000",
        mode=Mode.SYNC,
        worker_count=3,
        max_staleness=4,
        seed=7,
        checkpoint_dir="/ckpt",
        max_rows=1000,
        lease_s=2.5,
        secret=SECRET,
    )
    environ = spec.to_environ()
    assert environ["ROLE_NAME"] == "ps" and environ["ROLE_RANK"] == "1"
    assert environ[contract.ENV_SECRET] == SECRET
    assert contract.from_environ(environ) == spec
    assert SECRET not in repr(spec)
    assert spec.listen_address == "10.0.0.2:5002"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({contract.ENV_ROLE: "boss"}, "TRAINYARD_PS_ROLE must be one of"),
        ({contract.ENV_MODE: "eventual"}, "TRAINYARD_PS_MODE must be one of"),
        ({contract.ENV_ADDRESSES: "127.0.0.1"}, "is not host:port"),
        ({contract.ENV_PS_COUNT: "3"}, "TRAINYARD_PS_COUNT is 3 but"),
        ({contract.ENV_INDEX: "2"}, "TRAINYARD_PS_INDEX is 2 but there are 2 PS"),
        ({contract.ENV_MAX_STALENESS: "-1"}, "TRAINYARD_PS_MAX_STALENESS must be at least 0"),
        ({contract.ENV_LEASE_S: "soon"}, "TRAINYARD_PS_LEASE_S must be a number"),
        ({contract.ENV_COORDINATOR: ""}, "TRAINYARD_PS_COORDINATOR must be"),
        ({contract.ENV_SECRET: ""}, "TRAINYARD_PS_SECRET must be set"),
        ({contract.ENV_SECRET: "two words"}, "TRAINYARD_PS_SECRET must be printable ASCII"),
    ],
)
def test_a_bad_variable_is_named(change: dict[str, str], message: str) -> None:
    environ = PsEnv(
        Role.PS, 0, ("127.0.0.1:5001", "127.0.0.1:5002"), "127.0.0.1:6000", secret=SECRET
    ).to_environ()
    environ.update(change)
    with pytest.raises(ContractError, match=message) as raised:
        contract.from_environ(environ)
    assert "two words" not in str(raised.value)


def test_malformed_requests_get_clear_statuses_over_grpc() -> None:
    state = PsState(index=0, count=1, mode=Mode.ASYNC)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ps_pb2_grpc.add_ParameterServerServicer_to_server(Servicer(state, ""), server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    server.start()
    try:
        with grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            short = ps_pb2.Tensor(dtype="int64", shape=[4], data=b"\x00" * 8)
            cases = [
                (ps_pb2.PullRequest(tables=[ps_pb2.TableIds(table="t", ids=short)]), "bytes do not hold"),
                (
                    ps_pb2.PullRequest(
                        tables=[
                            ps_pb2.TableIds(
                                table="t", ids=ps_pb2.Tensor(dtype="pickle", shape=[1], data=b"x")
                            )
                        ]
                    ),
                    "unknown dtype",
                ),
                (
                    ps_pb2.PullRequest(
                        tables=[ps_pb2.TableIds(table="t", ids=tensors.encode(torch.arange(2)))]
                    ),
                    "unknown table",
                ),
            ]
            for request, message in cases:
                with pytest.raises(grpc.RpcError) as caught:
                    stub.Pull(request, timeout=10)
                assert message in str(caught.value.details())  # type: ignore[attr-defined]
                assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)  # type: ignore[attr-defined]
            with pytest.raises(grpc.RpcError) as caught:
                stub.Checkpoint(ps_pb2.CheckpointRequest(), timeout=10)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    finally:
        server.stop(0)
