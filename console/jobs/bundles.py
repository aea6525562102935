"""Storing uploaded code bundles: streamed, hashed, checked, content-addressed, deduplicated."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from console.jobs.models import Bundle
from console.teams.models import Workspace, default_workspace_id
from workers.bundles import BundleError, check_archive

__all__ = ["BundleError", "bundle_path", "store_bundle"]


def _root() -> Path:
    return Path(settings.BUNDLE_ROOT)


def bundle_path(bundle: Bundle) -> Path:
    return _root() / bundle.sha256[:2] / bundle.sha256


def _limit_text(limit: int) -> str:
    return f"{limit / (1024 * 1024):.0f} MB" if limit >= 1024 * 1024 else f"{limit} bytes"


def store_bundle(uploaded_file: Any, owner: Any, workspace: Workspace | None = None) -> Bundle:
    """Stores ``uploaded_file`` (a Django UploadedFile) once per content; returns its Bundle.

    Raises BundleError (message for the uploader) when the file is too large or not an
    acceptable archive; nothing is kept then.
    """
    limit: int = settings.BUNDLE_MAX_BYTES
    if getattr(uploaded_file, "size", None) and uploaded_file.size > limit:
        raise BundleError(f"The bundle is larger than the limit of {_limit_text(limit)}.")
    root = _root()
    incoming = root / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(prefix="upload-", dir=incoming)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in uploaded_file.chunks():
                size += len(chunk)
                if size > limit:
                    raise BundleError(f"The bundle is larger than the limit of {_limit_text(limit)}.")
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        check_archive(temporary, limit)
        sha = digest.hexdigest()
        final = root / sha[:2] / sha
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            temporary.unlink()
        else:
            os.replace(temporary, final)
        bundle = _record(sha, size, Path(getattr(uploaded_file, "name", "") or "").name[:255], owner)
    finally:
        temporary.unlink(missing_ok=True)
    # Stored once, but each workspace that uploads it may see and run it.
    bundle.workspaces.add(workspace if workspace is not None else default_workspace_id())
    return bundle


def _record(sha: str, size: int, filename: str, owner: Any) -> Bundle:
    existing = Bundle.objects.filter(sha256=sha).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return Bundle.objects.create(
                sha256=sha,
                size_bytes=size,
                filename=filename,
                owner=owner if getattr(owner, "is_authenticated", False) else None,
            )
    except IntegrityError:
        # Two uploads of the same content raced; the other one's row wins.
        return Bundle.objects.get(sha256=sha)
