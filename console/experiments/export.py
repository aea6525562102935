"""A job's metrics as a file: CSV (streamed) or Parquet (pyarrow), every raw point with its
round, rank, step, name, value and time. Points past raw retention are no longer there (only
their 100-step tiles are, which a chart reads); the export says how many rows it holds.
"""

from __future__ import annotations

import csv
import io
import math
import tempfile
from collections.abc import Iterator
from typing import Any

from django.http import FileResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.views import APIView

from console.experiments.compare import visible_jobs
from console.telemetry.api import MAX_SERIES_PER_QUERY
from console.telemetry.models import Metric

CHUNK_ROWS = 20_000
# Rows per Parquet row group: a few MB each, so writing never holds the whole series in memory.
PARQUET_ROW_GROUP = 200_000
COLUMNS = ("round", "rank", "step", "name", "value", "time")


class ExportQuery(serializers.Serializer):
    format = serializers.ChoiceField(choices=["csv", "parquet"], default="csv")
    name = serializers.CharField(
        required=False, max_length=128 * MAX_SERIES_PER_QUERY, help_text="Metric names, comma-separated"
    )


def _rows(job_id: int, names: list[str] | None) -> Iterator[tuple[int, int, int, str, float, Any]]:
    points = Metric.objects.filter(job_id=job_id)
    if names:
        points = points.filter(name__in=names)
    yield from (
        points.order_by("name", "step", "round_number", "rank")
        .values_list("round_number", "rank", "step", "name", "value", "time")
        .iterator(chunk_size=CHUNK_ROWS)
    )


def _csv(job_id: int, names: list[str] | None) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for count, (rnd, rank, step, name, value, time) in enumerate(_rows(job_id, names), 1):
        writer.writerow((rnd, rank, step, name, "" if math.isnan(value) else repr(value), time.isoformat()))
        if count % 2000 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _parquet(job_id: int, names: list[str] | None) -> Any:
    """The Parquet file, written a row group at a time to a temporary file (spooled in memory
    while small)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("round", pa.int32()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("name", pa.string()),
            ("value", pa.float64()),
            ("time", pa.timestamp("us", tz="UTC")),
        ]
    )
    out = tempfile.SpooledTemporaryFile(max_size=32 << 20)  # noqa: SIM115  (the response closes it)
    with pq.ParquetWriter(out, schema, compression="zstd") as writer:
        columns: list[list[Any]] = [[] for _ in COLUMNS]
        for row in _rows(job_id, names):
            for column, value in zip(columns, row, strict=True):
                column.append(value)
            if len(columns[0]) >= PARQUET_ROW_GROUP:
                writer.write_table(pa.Table.from_arrays([pa.array(c) for c in columns], schema=schema))
                columns = [[] for _ in COLUMNS]
        writer.write_table(
            pa.Table.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
            )
        )
    out.seek(0)
    return out


class FileFormat(BaseContentNegotiation):
    """``?format=`` names the file here, not a DRF renderer (which would answer 404 to "csv"):
    errors are JSON whatever it says."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class MetricsExportView(APIView):
    """Every raw point of a job's metrics (or of ``name``'s), as CSV (streamed) or Parquet:
    columns round, rank, step, name, value (empty / null for NaN), time (UTC)."""

    content_negotiation_class = FileFormat

    @extend_schema(
        parameters=[OpenApiParameter("job_id", int, OpenApiParameter.PATH), ExportQuery],
        responses={
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.BINARY, description="format=csv (streamed) or format=parquet"
            ),
            (200, "application/vnd.apache.parquet"): OpenApiResponse(
                OpenApiTypes.BINARY, description="format=csv (streamed) or format=parquet"
            ),
        },
    )
    def get(self, request: Request, job_id: int) -> Any:
        job = visible_jobs(request.user).filter(pk=job_id).first()
        if job is None:
            from rest_framework.exceptions import NotFound

            raise NotFound(f"Job {job_id} does not exist.")
        query = ExportQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        names = [n for n in query.validated_data.get("name", "").split(",") if n] or None
        stem = f"job-{job.pk}-metrics"
        if query.validated_data["format"] == "parquet":
            return FileResponse(
                _parquet(job.pk, names),
                as_attachment=True,
                filename=f"{stem}.parquet",
                content_type="application/vnd.apache.parquet",
            )
        response = StreamingHttpResponse(_csv(job.pk, names), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{stem}.csv"'
        return response
