"""Exit codes of ``trainyard`` and the one error type its commands raise.

Every failure a user can cause or meet (bad arguments, a missing file, a refused request, an
unreachable console) ends as a ``CliError``: one line on stderr and a distinct exit code, never
a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    ERROR = 1  # anything else (e.g. an unreadable config file, too many requests)
    USAGE = 2  # bad command line, unreadable spec file
    NOT_FOUND = 3  # no such job, node, token (HTTP 404)
    AUTH = 4  # not logged in, wrong password, token refused, not allowed (HTTP 401/403)
    INVALID = 5  # the console refused the request as invalid or conflicting (HTTP 400/409/422), or
    # the CLI refused it locally for the same reason (a bundle past the console's limit)
    UNREACHABLE = 6  # no answer from the console (connection, timeout) or a server error (5xx)
    INTERRUPTED = 130  # Ctrl-C


EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 other error, 2 usage, 3 not found, 4 not logged in or not allowed, "
    "5 invalid or conflicting request, 6 console unreachable or server error, 130 interrupted."
)


class CliError(Exception):
    """A failure the user can act on; printed as one line, without a traceback."""

    def __init__(self, message: str, code: Exit = Exit.ERROR) -> None:
        super().__init__(message)
        self.code = code


def exit_for_status(status: int) -> Exit:
    """The exit code for an HTTP error status."""
    if status == 404:
        return Exit.NOT_FOUND
    if status in (401, 403):
        return Exit.AUTH
    if status in (400, 409, 410, 413, 415, 422):
        return Exit.INVALID
    if status >= 500:
        return Exit.UNREACHABLE
    return Exit.ERROR
