"""One error shape for the API: ``{"detail": "...", "errors": {field: [messages]}}``."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from console.core.states import IllegalTransition


class Conflict(Exception):
    """The request is valid but the object's state does not allow it now (HTTP 409)."""


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, IllegalTransition | Conflict):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DjangoValidationError):
        return Response(
            {
                "detail": "Invalid input.",
                "errors": exc.message_dict
                if hasattr(exc, "error_dict")
                else {"non_field_errors": exc.messages},
            },
            status=400,
        )
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" not in response.data:
        response.data = {"detail": "Invalid input.", "errors": response.data}
    elif response is not None and isinstance(response.data, list):
        response.data = {"detail": "Invalid input.", "errors": {"non_field_errors": response.data}}
    return response
