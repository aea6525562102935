"""Many jobs quickly, for tests and benches of the jobs list."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import connection

from console.jobs import actions
from console.jobs.models import Job


def copy_jobs(count: int, owners: list[User]) -> None:
    """``count`` jobs copied in SQL from one made by the ORM (fast), with varied names,
    owners, states, priorities and times."""
    template = Job.objects.create(name="template", workload="digits", owner=owners[0])
    columns = [str(f.column) for f in Job._meta.concrete_fields if not f.primary_key]
    varied = {
        "name": "(ARRAY['bert','gpt','resnet','vit','t5'])[1 + n %% 5] || '-' || n",
        "owner_id": f"(ARRAY[{','.join(str(u.pk) for u in owners)}])[1 + n %% {len(owners)}]",
        "state": "(ARRAY['PENDING','RUNNING','SUCCEEDED','FAILED','STOPPED'])[1 + (n / 7) %% 5]",
        "priority": "n %% 11",
        "created_at": "now() - n * interval '1 minute'",
    }
    select = ", ".join(varied.get(c, f'j."{c}"') for c in columns)
    table = Job._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {table} ({', '.join(connection.ops.quote_name(c) for c in columns)}) "
            f"SELECT {select} FROM {table} j, generate_series(1, %s) n WHERE j.id = %s",
            [count, template.pk],
        )
        cur.execute(f"ANALYZE {table}")


def submitted_ps_job(workers: int = 3, mode: str = "async") -> Job:
    """A submitted parameter-server job: 2 PS, ``workers`` workers, on two nodes."""
    job = Job(
        name="ps",
        entrypoint="/bin/true",
        min_nodes=2,
        max_nodes=2,
        desired_nodes=2,
        strategy="parameter_server",
        roles={"ps": {"count": 2, "mode": mode}, "worker": {"count": workers, "min": 1, "max": 8}},
        grace_period=12.0,
    )
    return actions.submit_job(job, None)
