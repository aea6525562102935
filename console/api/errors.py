"""One error shape for the API: ``{"detail": "...", "errors": {field: [messages]}}``.

DRF's exceptions go through ``exception_handler``; what happens outside DRF under /api/ (an
unknown path, an unhandled exception, a request Django itself rejects) goes through the
``handler400/403/404/500`` views below, which answer JSON there and Django's pages elsewhere.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import resolve
from django.views import defaults
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
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
        response.data = {"detail": "Invalid input.", "errors": _as_lists(response.data)}
    elif response is not None and isinstance(response.data, list):
        response.data = {"detail": "Invalid input.", "errors": {"non_field_errors": response.data}}
    return response


def _as_lists(errors: dict[str, Any]) -> dict[str, list[str]]:
    """Nested serializer errors flattened to ``field.sub: [messages]`` so the shape is fixed."""
    flat: dict[str, list[str]] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif isinstance(value, list) and value and all(isinstance(v, dict | list) for v in value):
            for index, inner in enumerate(value):
                walk(f"{prefix}.{index}", inner)
        else:
            items = value if isinstance(value, list) else [value]
            flat.setdefault(prefix or "non_field_errors", []).extend(str(v) for v in items if v != {})

    walk("", errors)
    return flat


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"detail": "Bad request."}, status=400)
    return defaults.bad_request(request, exception or Exception())


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"detail": "You do not have permission to perform this action."}, status=403)
    return defaults.permission_denied(request, exception or Exception())


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return api_not_found(request)
    return defaults.page_not_found(request, exception or Exception())


def handler500(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(
            {"detail": "Internal server error: the console logged it; try again or tell an administrator."},
            status=500,
        )
    return defaults.server_error(request)


def api_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Unknown paths under /api/ (the last pattern there, so it answers JSON even with DEBUG on)."""
    return JsonResponse({"detail": _not_found_text(request.path)}, status=404)


def _not_found_text(path: str) -> str:
    text = f"No API endpoint at {path}."
    if not path.endswith("/"):
        try:
            match = resolve(path + "/")
        except Http404:
            return text
        if match.url_name != "api-not-found":
            text += f" Did you mean {path}/ ?"
    return text


@extend_schema(exclude=True)
class UnknownEndpoint(APIView):
    """The last pattern under /api/: signed-in callers learn the path is unknown (JSON 404);
    anonymous callers get the same 401 as everywhere else, not a map of what exists."""

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        raise NotFound(_not_found_text(request.path))
