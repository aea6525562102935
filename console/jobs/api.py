"""REST API for jobs (/api/v1/jobs/). Views parse input and call one action in console/jobs/actions.py."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.errors import Conflict
from console.api.models import ApiToken, Scope
from console.jobs import actions, hangs
from console.jobs import roles as job_roles
from console.jobs.env_names import ENV_NAME, HIDDEN, RESERVED_ENV
from console.jobs.models import Allocation, Bundle, Job, Precision, Round, Strategy
from console.jobs.queries import JobFilter, attach_current_rounds, job_ordering
from console.jobs.tenancy import IsOperatorOrReadOnly, submit_pool, submit_workspace, visible_job
from console.teams import access
from console.teams.models import Role
from workers import protocol

MAX_NODES = 1024


def parse_nnodes(value: Any) -> tuple[int, int]:
    """ "2" → (2, 2); "2:4" → (2, 4); 3 → (3, 3)."""
    text = str(value).strip()
    match = re.fullmatch(r"(\d{1,4})(?::(\d{1,4}))?", text)
    if not match:
        raise serializers.ValidationError('Use a node count like "2" or a range like "2:4".')
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else low
    if low < 1:
        raise serializers.ValidationError("A job needs at least 1 node.")
    if low > high:
        raise serializers.ValidationError(f"The minimum ({low}) is larger than the maximum ({high}).")
    if high > MAX_NODES:
        raise serializers.ValidationError(f"At most {MAX_NODES} nodes.")
    return low, high


class JobSpecSerializer(serializers.Serializer):
    """The job spec of the public contract; the CLI's YAML has the same fields."""

    name = serializers.RegexField(
        r"^[\w.\- ]{1,128}$",
        max_length=128,
        error_messages={"invalid": "Use 1-128 letters, digits, spaces, '.', '-' or '_'."},
    )
    workload = serializers.CharField(required=False, allow_blank=True, max_length=64, default="")
    entrypoint = serializers.CharField(required=False, allow_blank=True, max_length=1024, default="")
    args = serializers.ListField(
        child=serializers.CharField(max_length=4096, allow_blank=True),
        required=False,
        default=list,
        max_length=256,
    )
    bundle = serializers.PrimaryKeyRelatedField(
        queryset=Bundle.objects.all(), required=False, allow_null=True, default=None
    )
    workdir = serializers.CharField(required=False, allow_blank=True, max_length=1024, default="")
    nnodes = serializers.CharField(required=False, default="1", max_length=16)
    nproc_per_node = serializers.IntegerField(required=False, default=1, min_value=1, max_value=64)
    gpus_per_proc = serializers.IntegerField(required=False, default=0, min_value=0, max_value=16)
    strategy = serializers.ChoiceField(choices=Strategy.choices, required=False, default=Strategy.ALLREDUCE)
    precision = serializers.ChoiceField(choices=Precision.choices, required=False, default=Precision.FP32)
    grad_accum_steps = serializers.IntegerField(required=False, default=1, min_value=1, max_value=4096)
    max_restarts = serializers.IntegerField(required=False, default=3, min_value=0, max_value=1000)
    priority = serializers.IntegerField(required=False, default=0, min_value=-1000, max_value=1000)
    grace_period = serializers.FloatField(required=False, default=30.0, min_value=0.0, max_value=3600.0)
    env = serializers.DictField(
        child=serializers.CharField(max_length=8192, allow_blank=True), required=False, default=dict
    )
    secret_env = serializers.DictField(
        child=serializers.CharField(max_length=8192, allow_blank=True),
        required=False,
        default=dict,
        write_only=True,
        help_text="Variables whose values are write-only (API keys, tokens): the ranks get them; "
        "the API, pages and admin show their names only",
    )
    hyperparameters = serializers.DictField(required=False, default=dict)
    roles = serializers.DictField(
        required=False,
        default=dict,
        help_text="parameter_server only: {ps: {count, mode}, worker: {count, min, max}}",
    )
    hang = serializers.JSONField(
        required=False,
        default=dict,
        help_text="Hang detection: {timeout_s, multiple, floor_s, first_step_s, action: notify|restart|fail, "
        "max_drift_steps} (console/jobs/hangs.py); {} = the defaults",
    )
    workspace = serializers.SlugField(
        required=False,
        allow_blank=True,
        default="",
        max_length=64,
        help_text="The workspace it belongs to (whose quota it uses); default: yours",
    )
    pool = serializers.SlugField(
        required=False, allow_blank=True, default="", max_length=64, help_text="The node pool it runs in"
    )
    node_selector = serializers.DictField(
        child=serializers.CharField(max_length=128),
        required=False,
        default=dict,
        help_text='Labels every node of the job must have, e.g. {"zone": "b"}',
    )
    elastic = serializers.ChoiceField(
        choices=["inplace", "restart"],
        required=False,
        allow_blank=True,
        default="",
        help_text="inplace: the script uses sdk.elastic, so membership changes keep its processes; "
        "restart: every change restarts the ranks. Default: inplace for built-in workloads that "
        "support it, restart otherwise.",
    )

    def validate_hang(self, value: Any) -> protocol.HangPolicy:
        try:
            return hangs.check_policy(value)
        except hangs.PolicyError as exc:
            raise serializers.ValidationError([f"{k}: {v}" for k, v in exc.errors.items()]) from None

    def validate_nnodes(self, value: str) -> str:
        parse_nnodes(value)
        return value

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 256:
            raise serializers.ValidationError("At most 256 variables.")
        for key in value:
            if not ENV_NAME.match(key):
                raise serializers.ValidationError(f"{key!r} is not a valid environment variable name.")
            if key in RESERVED_ENV:
                raise serializers.ValidationError(f"{key} is set by the launcher and cannot be overridden.")
        return value

    def validate_secret_env(self, value: dict[str, str]) -> dict[str, str]:
        return self.validate_env(value)

    def validate_entrypoint(self, value: str) -> str:
        if "\x00" in value:
            raise serializers.ValidationError("The entrypoint contains a NUL byte.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        workload, entrypoint = attrs.get("workload", ""), attrs.get("entrypoint", "")
        self._validate_roles(attrs)
        if both := sorted(set(attrs.get("env", {})) & set(attrs.get("secret_env", {}))):
            raise serializers.ValidationError(
                {"secret_env": [f"{', '.join(both)}: give a variable in env or in secret_env, not both."]}
            )
        if bool(workload) == bool(entrypoint):
            raise serializers.ValidationError(
                {
                    "workload": [
                        "Give either a built-in workload or an entrypoint (with a bundle or host path), not both."
                    ]
                }
            )
        if workload:
            attrs["hyperparameters"] = self._validate_workload(workload, attrs.get("hyperparameters", {}))
            if attrs.get("strategy") == Strategy.PARAMETER_SERVER:
                # The dataset is fixed now, from the workers asked for: a resize must not change
                # what a new worker declares to the coordinator (it refuses another dataset).
                from workers.workloads import catalog

                attrs["hyperparameters"]["examples"] = catalog.parameter_server_examples(
                    attrs["hyperparameters"], attrs["roles"]["worker"]["count"]
                )
        if attrs.get("bundle") is not None and attrs.get("workdir"):
            raise serializers.ValidationError({"workdir": ["Give a bundle or a host path, not both."]})
        if (
            entrypoint
            and attrs.get("bundle") is None
            and not attrs.get("workdir")
            and not entrypoint.startswith("/")
        ):
            raise serializers.ValidationError(
                {"entrypoint": ["A relative entrypoint needs a bundle or a workdir (host path)."]}
            )
        attrs["elastic"] = self._elastic_mode(attrs)
        if len(str(attrs.get("hyperparameters", {}))) > 65536:
            raise serializers.ValidationError({"hyperparameters": ["Too large (64 KiB at most)."]})
        return attrs

    @staticmethod
    def _elastic_mode(attrs: dict[str, Any]) -> str:
        from workers.workloads import catalog

        asked = attrs.get("elastic") or ""
        if attrs.get("strategy") == Strategy.PARAMETER_SERVER:
            if asked == "inplace":
                raise serializers.ValidationError(
                    {"elastic": ["parameter_server jobs resize their worker role in place already."]}
                )
            return "restart"
        if asked:
            return str(asked)
        info = catalog.WORKLOADS.get(attrs.get("workload", ""))
        return "inplace" if info is not None and info.inplace else "restart"

    @staticmethod
    def _validate_roles(attrs: dict[str, Any]) -> None:
        """A parameter_server job has roles (normalised here); an allreduce job has none."""
        given = attrs.get("roles") or {}
        if attrs.get("strategy") != Strategy.PARAMETER_SERVER:
            if given:
                raise serializers.ValidationError(
                    {"roles": ["Roles are for the parameter_server strategy; allreduce uses nnodes."]}
                )
            return
        try:
            attrs["roles"] = job_roles.normalize(given)
        except job_roles.RolesError as exc:
            raise serializers.ValidationError({"roles": [str(exc)]}) from None
        low, high = parse_nnodes(attrs.get("nnodes", "1"))
        if low != high:
            raise serializers.ValidationError(
                {"nnodes": ["A parameter_server job runs on a fixed node count; its worker role is elastic."]}
            )
        if attrs.get("gpus_per_proc"):
            raise serializers.ValidationError(
                {"gpus_per_proc": ["parameter_server jobs run on CPU here; use gpus_per_proc 0."]}
            )
        if attrs.get("workload") and attrs["workload"] != "recsys-embedding":
            raise serializers.ValidationError(
                {"workload": ["Only recsys-embedding has a parameter_server version; or give an entrypoint."]}
            )

    @staticmethod
    def _validate_workload(name: str, hyperparameters: dict[str, Any]) -> dict[str, Any]:
        from workers.workloads import catalog

        if name not in catalog.WORKLOADS:
            known = ", ".join(sorted(catalog.WORKLOADS))
            raise serializers.ValidationError(
                {"workload": [f"Unknown workload {name!r}; choose one of: {known}."]}
            )
        try:
            return dict(catalog.validate_hyperparameters(name, hyperparameters))
        except ValueError as exc:
            raise serializers.ValidationError({"hyperparameters": [str(exc)]}) from None

    def validate_node_selector(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 32:
            raise serializers.ValidationError("At most 32 labels.")
        for key in value:
            if not re.fullmatch(r"[A-Za-z0-9_.\-/]{1,63}", key):
                raise serializers.ValidationError(f"{key!r} is not a valid label name.")
        return value

    def to_job(self, owner: Any) -> Job:
        data = dict(self.validated_data)
        low, high = parse_nnodes(data.pop("nnodes"))
        inplace = data.pop("elastic", "") == "inplace"
        workspace = submit_workspace(owner, data.pop("workspace"))
        pool = submit_pool(data.pop("pool"), workspace, gpus=bool(data.get("gpus_per_proc")))
        bundle = data.get("bundle")
        if bundle is not None and not bundle.workspaces.filter(pk=workspace.pk).exists():
            # As if it did not exist: another workspace's bundle is not this one's to run.
            raise serializers.ValidationError(
                {"bundle": [f'Invalid pk "{bundle.pk}" - object does not exist.']}
            )
        return Job(
            owner=owner if owner.is_authenticated else None,
            inplace=inplace,
            hang_policy=data.pop("hang", {}),
            min_nodes=low,
            max_nodes=high,
            desired_nodes=high,
            workspace=workspace,
            pool=pool,
            **data,
        )


class AllocationSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")

    class Meta:
        model = Allocation
        fields = ["node", "node_rank", "nproc", "gpu_indices", "state", "exit_info", "processes"]


class RoundSerializer(serializers.ModelSerializer):
    allocations = AllocationSerializer(many=True, read_only=True)
    change_seconds = serializers.FloatField(
        read_only=True, allow_null=True, help_text="How long the membership change into this round took"
    )

    class Meta:
        model = Round
        fields = [
            "number",
            "reason",
            "world_size",
            "master_addr",
            "master_port",
            "charged",
            "state",
            "outcome",
            "inplace",
            "carry_over",
            "change_seconds",
            "created_at",
            "formed_at",
            "first_step_at",
            "failed_at",
            "ended_at",
            "allocations",
        ]


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", default=None, read_only=True)
    workspace = serializers.CharField(source="workspace.name", read_only=True)
    pool = serializers.CharField(source="pool.name", default=None, read_only=True, allow_null=True)
    round = serializers.IntegerField(source="round_number", read_only=True)
    world_size = serializers.SerializerMethodField()
    nodes = serializers.SerializerMethodField()
    nnodes = serializers.CharField(read_only=True)
    elastic = serializers.SerializerMethodField()
    hang = serializers.JSONField(source="hang_policy", read_only=True)
    env = serializers.SerializerMethodField(
        help_text=f'Values for editors of its workspace; for anyone else each value reads "{HIDDEN}"'
    )
    secret_env = serializers.SerializerMethodField(help_text="The names of its write-only variables")

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "workspace",
            "pool",
            "node_selector",
            "wait_reason",
            "state",
            "round",
            "world_size",
            "nodes",
            "restarts",
            "max_restarts",
            "progress",
            "failure",
            "nnodes",
            "min_nodes",
            "max_nodes",
            "desired_nodes",
            "nproc_per_node",
            "gpus_per_proc",
            "workload",
            "entrypoint",
            "args",
            "bundle",
            "workdir",
            "strategy",
            "precision",
            "grad_accum_steps",
            "priority",
            "grace_period",
            "env",
            "secret_env",
            "hyperparameters",
            "roles",
            "elastic",
            "hang",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_elastic(self, job: Job) -> str:
        return "inplace" if job.inplace else "restart"

    @extend_schema_field(serializers.DictField(child=serializers.CharField(allow_blank=True)))
    def get_env(self, job: Job) -> dict[str, str]:
        if job.workspace_id in self._env_value_workspaces:
            return {str(k): str(v) for k, v in job.env.items()}
        return dict.fromkeys(map(str, job.env), HIDDEN)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_secret_env(self, job: Job) -> list[str]:
        return sorted(map(str, job.secret_env))

    @cached_property
    def _env_value_workspaces(self) -> frozenset[int]:
        """Where the caller sees env values: workspaces it edits (who may run the job again),
        through a session or a token that may write jobs; read-only tokens and viewers: none.
        Worked out once for a page of jobs."""
        request = self.context.get("request")
        user = getattr(request, "user", None)
        token = getattr(request, "auth", None)
        if user is None or (isinstance(token, ApiToken) and not token.allows(Scope.JOBS_WRITE.value)):
            return frozenset()
        return frozenset(access.editable_workspaces(user))

    def _current(self, job: Job) -> Round | None:
        """The current round, as attach_current_rounds loaded it for a page (one query per job
        otherwise: a single job's detail)."""
        if not hasattr(job, "current_round_cached"):
            attach_current_rounds([job])
        return job.current_round_cached  # type: ignore[attr-defined,no-any-return]

    def get_world_size(self, job: Job) -> int:
        rnd = self._current(job)
        return rnd.world_size if rnd and job.job_state.is_active else 0

    def get_nodes(self, job: Job) -> list[str]:
        rnd = self._current(job)
        if rnd is None or not job.job_state.is_active:
            return []
        return [a.node.name for a in sorted(rnd.allocations.all(), key=lambda a: a.node_rank)]


class JobDetailSerializer(JobSerializer):
    rounds = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "rounds"]
        read_only_fields = fields

    @extend_schema_field(RoundSerializer(many=True))
    def get_rounds(self, job: Job) -> list[dict[str, Any]]:
        recent = job.rounds.order_by("-number").prefetch_related("allocations__node")[:20]
        return list(RoundSerializer(recent, many=True).data)


class ResizeSerializer(serializers.Serializer):
    """``{"nodes": N}`` for an allreduce job; ``{"role": "worker" | "ps", "count": N}`` for a
    parameter_server job."""

    nodes = serializers.IntegerField(min_value=1, max_value=MAX_NODES, required=False)
    role = serializers.ChoiceField(choices=[job_roles.WORKER, job_roles.PS], required=False)
    count = serializers.IntegerField(min_value=1, max_value=job_roles.MAX_WORKERS, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "role" in attrs:
            if "count" not in attrs:
                raise serializers.ValidationError({"count": ["Give the role's new process count."]})
            if "nodes" in attrs:
                raise serializers.ValidationError({"nodes": ["Resize a role or the nodes, not both."]})
        elif "nodes" not in attrs:
            raise serializers.ValidationError({"nodes": ["Give nodes, or a role and its count."]})
        return attrs


def _control(call: Any, *args: Any, field: str = "nodes") -> Job:
    try:
        return call(*args)
    except Job.DoesNotExist:
        raise Http404("No such job.") from None
    except actions.InvalidRequest as exc:
        raise serializers.ValidationError({field: [str(exc)]}) from None
    except actions.ControlError as exc:
        raise Conflict(str(exc)) from None


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs: the list (filters and sort orders of console/jobs/queries.py, cursor-paginated),
    submit, one job with its recent rounds, resize, restart, stop, and all of a job's rounds."""

    permission_classes = [IsOperatorOrReadOnly]
    serializer_class = JobSerializer
    filterset_class = JobFilter
    write_scope = Scope.JOBS_WRITE

    def get_queryset(self) -> QuerySet[Job]:
        return access.visible(self.request.user, Job.objects.select_related("owner", "workspace", "pool"))

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # Filters apply to the list only; a detail or an action finds any job by id.
        return super().filter_queryset(queryset) if self.action == "list" else queryset

    def get_cursor_ordering(self, request: Request) -> tuple[str, ...]:
        if self.action == "rounds":
            return ("-number", "-id")
        return job_ordering(request.query_params)

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        assert page is not None
        attach_current_rounds(page)  # no query per job (tests/test_api_job_list.py counts them)
        return self.get_paginated_response(JobSerializer(page, many=True, context={"request": request}).data)

    @extend_schema(
        parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH)],
        responses={200: RoundSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], filterset_class=None)
    def rounds(self, request: Request, pk: str) -> Response:
        """Every round of the job, newest first, with its allocations."""
        job_id = visible_job(request.user, pk).pk
        allocations = Allocation.objects.select_related("node").order_by("node_rank")
        rounds = Round.objects.filter(job_id=job_id).prefetch_related(
            Prefetch("allocations", queryset=allocations)
        )
        page = self.paginate_queryset(rounds)
        assert page is not None
        return self.get_paginated_response(RoundSerializer(page, many=True).data)

    @extend_schema(request=JobSpecSerializer, responses={201: JobDetailSerializer})
    def create(self, request: Request) -> Response:
        spec = JobSpecSerializer(data=request.data)
        spec.is_valid(raise_exception=True)
        job = actions.submit_job(spec.to_job(request.user), request.user)
        return Response(
            JobDetailSerializer(job, context={"request": request}).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=ResizeSerializer, responses={200: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def resize(self, request: Request, pk: str) -> Response:
        body = ResizeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if "role" in data:
            job = _control(
                actions.resize_role,
                self._editable(request, pk),
                data["role"],
                data["count"],
                request.user,
                field="count",
            )
        else:
            job = _control(actions.resize_job, self._editable(request, pk), data["nodes"], request.user)
        return Response(JobDetailSerializer(job, context={"request": request}).data)

    @extend_schema(request=None, responses={200: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: str) -> Response:
        job = _control(actions.restart_job, self._editable(request, pk), request.user)
        return Response(JobDetailSerializer(job, context={"request": request}).data)

    @extend_schema(request=None, responses={200: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str) -> Response:
        job = _control(actions.stop_job, self._editable(request, pk), request.user)
        return Response(JobDetailSerializer(job, context={"request": request}).data)

    @staticmethod
    def _editable(request: Request, pk: str) -> int:
        """The job's id once the caller may change it (404: not theirs to see; 403: to change)."""
        return visible_job(request.user, pk, Role.EDITOR).pk
