"""Goodput under /api/v1/: a job's (``jobs/<id>/goodput/``) and the cluster's (``goodput/``).

The job's: its wall time in seconds per bucket (console/telemetry/goodput.py), productive over
wall (``goodput``), the labelled segments and, with ``bins=N``, N equal slices of its life with
the seconds of every bucket in each (the job page's stacked bar over time). The cluster's: every
job's seconds within the last day and the last week, summed.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.telemetry import goodput_data
from console.telemetry.api import JOB_ID, get_job, validated
from console.telemetry.goodput import BUCKETS

MAX_BINS = 500


class GoodputQuery(serializers.Serializer):
    bins = serializers.IntegerField(required=False, min_value=0, max_value=MAX_BINS, default=0)


# One class (one schema component) for the job's and the cluster's buckets.
GoodputSeconds = type(
    "GoodputSeconds",
    (serializers.Serializer,),
    {b: serializers.FloatField(help_text=f"seconds {b}") for b in BUCKETS},
)


class SegmentSerializer(serializers.Serializer):
    start = serializers.FloatField(help_text="unix seconds")
    end = serializers.FloatField()
    bucket = serializers.ChoiceField(choices=BUCKETS)
    data_share = serializers.FloatField(help_text="of a productive segment: the share spent waiting on data")


class JobGoodputSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    start = serializers.FloatField()
    end = serializers.FloatField()
    wall_seconds = serializers.FloatField()
    goodput = serializers.FloatField(allow_null=True, help_text="productive seconds over wall seconds")
    seconds = GoodputSeconds()
    segments = SegmentSerializer(many=True)
    bins = serializers.ListField(child=serializers.DictField(child=serializers.FloatField()), required=False)


class ClusterWindowSerializer(serializers.Serializer):
    jobs = serializers.IntegerField()
    wall_seconds = serializers.FloatField()
    window_seconds = serializers.FloatField()
    goodput = serializers.FloatField(allow_null=True)
    seconds = GoodputSeconds()


class ClusterGoodputSerializer(serializers.Serializer):
    day = ClusterWindowSerializer()
    week = ClusterWindowSerializer()


class JobGoodputView(APIView):
    @extend_schema(
        parameters=[
            JOB_ID,
            OpenApiParameter("bins", int, description=f"slices of the job's life, 0..{MAX_BINS}"),
        ],
        responses={200: JobGoodputSerializer},
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = get_job(request.user, job_id)
        params = validated(GoodputQuery, request)
        body: dict[str, Any] = {"job": job.pk, **goodput_data.job_goodput(job).as_json(bins=params["bins"])}
        return Response(body)


class ClusterGoodputView(APIView):
    @extend_schema(responses={200: ClusterGoodputSerializer})
    def get(self, request: Request) -> Response:
        return Response(
            {name: goodput_data.cluster_goodput(seconds) for name, seconds in goodput_data.WINDOWS.items()}
        )
