"""The job's secret on the PS runtime's wire: its PS and coordinator answer only callers with it.

The PS and the coordinator listen on the node's routable address over plain gRPC; without this,
anyone who can reach the port could pull the job's embedding rows, overwrite them with a push or
take its data shards. Every process of the job gets the secret in TRAINYARD_PS_SECRET
(workers/ps/contract.py): the console derives it per job (console/jobs/spec.py), the local runner
(workers/ps/local.py) draws one. Clients send it as ``authorization: Bearer <secret>`` on every
call; the servers compare it in constant time and refuse anything else with UNAUTHENTICATED.

The secret authenticates callers; it does not encrypt: the rows and the secret itself cross the
network in clear text, as the job's torch.distributed traffic does.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc

from workers.ps.contract import ENV_SECRET

METADATA_KEY = "authorization"
SCHEME = "Bearer "


def new_secret() -> str:
    """A secret for processes started outside the console (the local runner, tests, bench)."""
    return secrets.token_urlsafe(32)


def _bearer(secret: str) -> str:
    if not secret:
        raise ValueError(f"the PS runtime needs the job's secret ({ENV_SECRET})")
    return SCHEME + secret


class RequireSecret(grpc.ServerInterceptor):
    """Refuses, before its handler runs, every call that does not present ``secret``."""

    def __init__(self, secret: str) -> None:
        self._expected = _bearer(secret).encode()
        self._missing = _refusal("the call carried no secret")
        self._wrong = _refusal("the call carried a wrong secret")

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        presented = _presented(handler_call_details.invocation_metadata)
        if presented is None:
            return self._missing
        if not hmac.compare_digest(presented, self._expected):
            return self._wrong
        return continuation(handler_call_details)


def _presented(metadata: Any) -> bytes | None:
    for key, value in metadata or ():
        if key == METADATA_KEY:
            return value.encode() if isinstance(value, str) else bytes(value)
    return None


def _refusal(why: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that answers UNAUTHENTICATED. Every method of both services is unary; the request
    is left undecoded."""
    message = f"{why}: this PS job's servers answer only callers with its secret ({ENV_SECRET})"

    def refuse(request: bytes, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _PresentSecret(grpc.UnaryUnaryClientInterceptor):
    """Adds the secret to every call of a channel, so the stubs' callers need not know of it."""

    def __init__(self, secret: str) -> None:
        self._metadata = ((METADATA_KEY, _bearer(secret)),)

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        details = _CallDetails(
            client_call_details.method,
            client_call_details.timeout,
            (*(client_call_details.metadata or ()), *self._metadata),
            client_call_details.credentials,
            client_call_details.wait_for_ready,
            client_call_details.compression,
        )
        return continuation(details, request)


def authenticated(channel: grpc.Channel, secret: str) -> grpc.Channel:
    """``channel`` with the job's secret on every call."""
    return grpc.intercept_channel(channel, _PresentSecret(secret))
