"""OpenAPI post-processing: every operation documents the API's error answers.

drf-spectacular documents what views return on success; the errors every view can give (bad
input, no credentials, a role or token scope that does not allow it, unknown ids, a state
conflict, a lockout) come from shared code, so they are added here once, with the one error
shape of console/api/errors.py.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "detail": {"type": "string"},
        "errors": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
            "description": "Messages by field ('non_field_errors' for the request as a whole).",
        },
    },
    "required": ["detail"],
}

COMMON = {
    "400": "Invalid input (the messages name the fields).",
    "401": "No credentials, or a wrong, expired or revoked token.",
    "403": "The role or the token's scopes do not allow it.",
    "404": "No such object.",
    "429": "Too many failed sign-in or token attempts; see Retry-After.",
}
WRITES = {"409": "The object's state does not allow it now."}


def document_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    reference = {"$ref": "#/components/schemas/Error"}
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            answers = dict(COMMON)
            if method.lower() in ("post", "put", "patch", "delete"):
                answers.update(WRITES)
            for code, description in answers.items():
                operation["responses"].setdefault(
                    code,
                    {
                        "description": description,
                        "content": {"application/json": {"schema": reference}},
                    },
                )
    return result


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    """Personal API tokens in the schema: ``Authorization: Bearer ty_...``."""

    target_class = "console.api.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token (Account menu → API tokens, or POST /api/v1/auth/token/).",
        }


class NodeTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "console.jobs.bundle_api.NodeTokenAuthentication"
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer", "description": "The node token agents present."}


class SchemaView(SpectacularAPIView):
    """``/api/schema/`` (YAML, or JSON with ``?format=json``); its errors are JSON like the API's."""

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)
