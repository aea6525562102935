"""REST API of experiments (/api/v1/): sweeps, comparisons of jobs. Views parse input and call
console/experiments/sweeps.py or compare.py."""

from __future__ import annotations

from typing import Any

import orjson
from django.db.models import QuerySet
from django.http import Http404, HttpResponse
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.errors import Conflict
from console.api.models import Scope
from console.core.roles import is_operator
from console.experiments import compare, study, sweeps
from console.experiments import space as spaces
from console.experiments.models import Direction, Pruner, Sampler, Sweep, Trial, TrialState
from console.jobs import actions as job_actions
from console.jobs.api import IsOperatorOrReadOnly
from console.jobs.env_names import HIDDEN
from console.jobs.models import Job
from console.telemetry.api import BucketSerializer
from console.telemetry.downsample import MAX_QUERY_POINTS, query_series

MAX_TRIALS = 1000
MAX_PARALLEL = 64


class SweepSpecSerializer(serializers.Serializer):
    """A sweep: the job spec every trial starts from, the search space, the budget, the objective
    and how losers are stopped. The CLI's YAML has the same fields."""

    name = serializers.RegexField(
        r"^[\w.\- ]{1,100}$",
        max_length=100,
        error_messages={"invalid": "Use 1-100 letters, digits, spaces, '.', '-' or '_'."},
    )
    job = serializers.DictField(help_text="The job spec of every trial (the jobs API's fields)")
    space = serializers.DictField(
        help_text='{"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": true}, '
        '"hidden": {"type": "int", "low": 16, "high": 128, "step": 16}, "opt": ["adam", "sgd"]}'
    )
    sampler = serializers.ChoiceField(choices=Sampler.choices, default=Sampler.TPE)
    seed = serializers.IntegerField(default=0, min_value=0, max_value=2**31 - 1)
    objective = serializers.CharField(
        max_length=128, help_text="A metric the trials log (sdk.log or TensorBoard)"
    )
    direction = serializers.ChoiceField(choices=Direction.choices, default=Direction.MINIMIZE)
    max_trials = serializers.IntegerField(min_value=1, max_value=MAX_TRIALS)
    parallel = serializers.IntegerField(default=1, min_value=1, max_value=MAX_PARALLEL)
    pruner = serializers.ChoiceField(choices=Pruner.choices, default=Pruner.NONE)
    pruner_options = serializers.DictField(
        default=dict,
        help_text="median: startup_trials, warmup_steps; successive_halving: min_resource "
        '(steps, or "auto"), reduction_factor, min_early_stopping_rate',
    )

    def validate_space(self, value: dict[str, Any]) -> dict[str, Any]:
        try:
            spaces.distributions(value)
        except spaces.SpaceError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["sampler"] == Sampler.GRID:
            try:
                spaces.grid(attrs["space"])
            except spaces.SpaceError as exc:
                raise serializers.ValidationError({"space": [str(exc)]}) from None
        try:
            attrs["pruner_options"] = study.check_pruner(attrs["pruner"], attrs.get("pruner_options") or {})
        except ValueError as exc:
            raise serializers.ValidationError({"pruner_options": [str(exc)]}) from None
        # The job spec, checked as trial 0 would be submitted (parameters at their low ends).
        probe = Sweep(name=attrs["name"], spec=attrs["job"], space=attrs["space"])
        try:
            sweeps.build_job(
                sweeps.trial_spec(probe, 0, spaces.example(attrs["space"])), self.context["user"]
            )
        except job_actions.InvalidRequest as exc:
            raise serializers.ValidationError({"job": [str(exc)]}) from None
        return attrs

    def to_sweep(self, owner: Any) -> Sweep:
        data = dict(self.validated_data)
        return Sweep(owner=owner if owner.is_authenticated else None, spec=data.pop("job"), **data)


def may_see_env_values(user: Any, sweep: Sweep) -> bool:
    """Environment values of a sweep's spec: its owner (an operator) and staff, as for a job's."""
    if not is_operator(user):
        return False
    return bool(
        user.is_staff or user.is_superuser or (sweep.owner_id is not None and sweep.owner_id == user.pk)
    )


class TrialSerializer(serializers.ModelSerializer):
    job_name = serializers.CharField(source="job.name", default=None, read_only=True)
    job_state = serializers.CharField(source="job.state", default=None, read_only=True)
    seconds = serializers.SerializerMethodField(help_text="How long its job ran (so far)")

    class Meta:
        model = Trial
        fields = [
            "number",
            "job",
            "job_name",
            "job_state",
            "state",
            "params",
            "value",
            "last_step",
            "message",
            "created_at",
            "finished_at",
            "seconds",
        ]
        read_only_fields = fields

    def get_seconds(self, trial: Trial) -> float | None:
        job = trial.job
        if job is None or job.started_at is None:
            return None
        from django.utils import timezone

        end = job.finished_at or timezone.now()
        return round(max(0.0, (end - job.started_at).total_seconds()), 3)


class SweepSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", default=None, read_only=True)
    job = serializers.SerializerMethodField(help_text="The job spec of every trial")
    counts = serializers.SerializerMethodField(help_text="Trials by state")
    best = serializers.SerializerMethodField(help_text="The best complete trial")

    class Meta:
        model = Sweep
        fields = [
            "id",
            "name",
            "owner",
            "state",
            "message",
            "job",
            "space",
            "sampler",
            "seed",
            "objective",
            "direction",
            "max_trials",
            "parallel",
            "pruner",
            "pruner_options",
            "counts",
            "best",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_job(self, sweep: Sweep) -> dict[str, Any]:
        spec = dict(sweep.spec)
        request = self.context.get("request")
        if spec.get("env") and not (request is not None and may_see_env_values(request.user, sweep)):
            spec["env"] = dict.fromkeys(spec["env"], HIDDEN)
        if "secret_env" in spec:  # write-only, as a job's: its names only, to anyone
            spec["secret_env"] = sorted(spec["secret_env"] or {})
        return spec

    def _trials(self, sweep: Sweep) -> list[Trial]:
        cached = getattr(sweep, "_trials_cache", None)
        if cached is None:
            cached = list(sweep.trials.select_related("job").order_by("number"))
            sweep._trials_cache = cached  # type: ignore[attr-defined]
        return cached

    def get_counts(self, sweep: Sweep) -> dict[str, int]:
        counts = dict.fromkeys(TrialState.values, 0)
        for trial in self._trials(sweep):
            counts[trial.state] += 1
        return counts

    def get_best(self, sweep: Sweep) -> dict[str, Any] | None:
        best = sweeps.best_trial(sweep, self._trials(sweep))
        if best is None:
            return None
        return {"number": best.number, "value": best.value, "job": best.job_id, "params": best.params}


class SweepDetailSerializer(SweepSerializer):
    trials = serializers.SerializerMethodField()

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "trials"]
        read_only_fields = fields

    @extend_schema_field(TrialSerializer(many=True))
    def get_trials(self, sweep: Sweep) -> list[dict[str, Any]]:
        return list(TrialSerializer(self._trials(sweep), many=True).data)


class SweepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Sweeps: the list (newest first, cursor-paginated), submit, one sweep with its trials, stop."""

    permission_classes = [IsOperatorOrReadOnly]
    serializer_class = SweepSerializer
    write_scope = Scope.JOBS_WRITE
    cursor_ordering = ("-created_at", "-id")

    def get_queryset(self) -> QuerySet[Sweep]:
        return Sweep.objects.select_related("owner")

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return SweepDetailSerializer if self.action == "retrieve" else SweepSerializer

    @extend_schema(request=SweepSpecSerializer, responses={201: SweepDetailSerializer})
    def create(self, request: Request) -> Response:
        spec = SweepSpecSerializer(data=request.data, context={"user": request.user})
        spec.is_valid(raise_exception=True)
        sweep = sweeps.submit_sweep(spec.to_sweep(request.user), request.user)
        return Response(
            SweepDetailSerializer(sweep, context={"request": request}).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=None, responses={200: SweepDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str) -> Response:
        if not str(pk).isdigit() or not Sweep.objects.filter(pk=int(pk)).exists():
            raise Http404("No such sweep.")
        try:
            sweep = sweeps.stop_sweep(int(pk), request.user)
        except job_actions.ControlError as exc:
            raise Conflict(str(exc)) from None
        sweep.refresh_from_db()
        return Response(SweepDetailSerializer(sweep, context={"request": request}).data)


# --- comparisons -------------------------------------------------------------------------------


class CompareQuery(serializers.Serializer):
    jobs = serializers.CharField(required=False, max_length=2000, help_text="Job ids: 3,5,8")
    name = serializers.CharField(required=False, max_length=128, help_text="Jobs whose name starts with this")
    sweep = serializers.IntegerField(required=False, min_value=1, help_text="The trials of this sweep")

    def validate_jobs(self, value: str) -> list[int]:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            raise serializers.ValidationError("Give job ids separated by commas, e.g. 3,5,8.")
        ids = list(dict.fromkeys(int(p) for p in parts))
        if len(ids) > compare.MAX_JOBS:
            raise serializers.ValidationError(f"At most {compare.MAX_JOBS} jobs.")
        return ids

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [key for key in ("jobs", "name", "sweep") if attrs.get(key) not in (None, "", [])]
        if len(given) != 1:
            raise serializers.ValidationError({"jobs": ["Give one of jobs, name or sweep."]})
        return attrs


class ComparedJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()
    owner = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    progress = serializers.DictField()
    trial = serializers.DictField(allow_null=True, help_text="{sweep, number, state} of a sweep's trial")


class MetricStatSerializer(serializers.Serializer):
    final = serializers.FloatField(allow_null=True, help_text="The value at the last step (null: not finite)")
    final_step = serializers.IntegerField(allow_null=True)
    best = serializers.FloatField(allow_null=True)
    best_step = serializers.IntegerField(allow_null=True, help_text="The first step with the best value")
    points = serializers.IntegerField()


class ComparedMetricSerializer(serializers.Serializer):
    higher_is_better = serializers.BooleanField()
    jobs = serializers.DictField(child=MetricStatSerializer(), help_text="By job id")


class ComparisonSerializer(serializers.Serializer):
    jobs = ComparedJobSerializer(many=True)
    hyperparameters = serializers.DictField(
        child=serializers.DictField(allow_null=True), help_text="{key: {job id: value}}, the keys that differ"
    )
    same_hyperparameters = serializers.IntegerField(help_text="How many keys are the same in every job")
    metrics = serializers.DictField(child=ComparedMetricSerializer())


class CompareBucketSerializer(BucketSerializer):
    x = serializers.FloatField(
        required=False, allow_null=True, help_text="x=time: seconds since the job started"
    )


class CompareSeriesSerializer(serializers.Serializer):
    metric = serializers.CharField()
    x = serializers.ChoiceField(choices=["step", "time"])
    points = serializers.IntegerField()
    series = serializers.DictField(child=CompareBucketSerializer(many=True), help_text="Buckets by job id")


def compared_jobs(request: Request) -> list[Job]:
    """The jobs a comparison request names, in its order (ids), by age (a name prefix) or trial
    number (a sweep); 404 for ids the caller may not see or that do not exist."""
    params = CompareQuery(data=request.query_params)
    params.is_valid(raise_exception=True)
    data = params.validated_data
    visible = compare.visible_jobs(request.user).select_related("owner", "trial")
    if data.get("jobs"):
        found = {job.pk: job for job in visible.filter(pk__in=data["jobs"])}
        missing = [str(i) for i in data["jobs"] if i not in found]
        if missing:
            raise NotFound(f"No such job: {', '.join(missing)}.")
        return [found[i] for i in data["jobs"]]
    if data.get("name"):
        return list(
            visible.filter(name__pattern_prefix=data["name"]).order_by("created_at", "id")[: compare.MAX_JOBS]
        )
    if not Sweep.objects.filter(pk=data["sweep"]).exists():
        raise NotFound(f"Sweep {data['sweep']} does not exist.")
    return list(visible.filter(trial__sweep_id=data["sweep"]).order_by("trial__number")[: compare.MAX_JOBS])


class CompareView(APIView):
    """Jobs side by side: the hyperparameters where they differ (and spec fields as ``spec.*``),
    each metric's final value and best value (the highest for accuracy-like names, else the
    lowest) per job. Name the jobs by ``jobs`` (ids), ``name`` (a prefix) or ``sweep``."""

    @extend_schema(parameters=[CompareQuery], responses={200: ComparisonSerializer})
    def get(self, request: Request) -> Response:
        return Response(compare.comparison(compared_jobs(request)))


class CompareSeriesQuery(serializers.Serializer):
    metric = serializers.CharField(max_length=128)
    points = serializers.IntegerField(required=False, min_value=1, max_value=MAX_QUERY_POINTS, default=300)
    x = serializers.ChoiceField(choices=["step", "time"], default="step")


class CompareSeriesView(APIView):
    """One metric of every compared job, each downsampled to at most ``points`` buckets (min, max,
    mean, count; as /jobs/{id}/metrics/). With ``x=time`` each bucket also has ``x``: seconds since
    the job started (its first point when it has no start time)."""

    @extend_schema(parameters=[CompareQuery, CompareSeriesQuery], responses={200: CompareSeriesSerializer})
    def get(self, request: Request) -> HttpResponse:
        jobs = compared_jobs(request)
        params = CompareSeriesQuery(data=request.query_params)
        params.is_valid(raise_exception=True)
        name, points, axis = (params.validated_data[k] for k in ("metric", "points", "x"))
        series: dict[str, list[dict[str, Any]]] = {}
        for job in jobs:
            buckets = [b.as_json() for b in query_series(job.pk, name, points=points)]
            if axis == "time" and buckets:
                origin = job.started_at.timestamp() if job.started_at else None
                times = [b["time"] for b in buckets if b["time"] is not None]
                origin = origin if origin is not None else (min(times) if times else 0.0)
                for b in buckets:
                    b["x"] = None if b["time"] is None else round(max(0.0, b["time"] - origin), 3)
            series[str(job.pk)] = buckets
        # Ten jobs' buckets are tens of thousands of values: orjson writes them several times
        # faster than the JSON renderer (the first chart waits for this answer).
        body = orjson.dumps({"metric": name, "x": axis, "points": points, "series": series})
        return HttpResponse(body, content_type="application/json")
