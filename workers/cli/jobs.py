"""``trainyard ls``, ``show``, ``scale``, ``restart`` and ``stop``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from workers.cli.base import (
    JobId,
    JsonOption,
    LimitOption,
    OutputOption,
    app,
    console,
    wants_json,
)
from workers.cli.output import JOB_HEADER, job_rows, out, print_json, table


@app.command("ls")
def list_jobs(
    state: Annotated[str | None, typer.Option(help="e.g. RUNNING or PENDING,RUNNING")] = None,
    owner: Annotated[str | None, typer.Option(help="Submitted by this username.")] = None,
    workspace: Annotated[str | None, typer.Option(help="Of this workspace.")] = None,
    name: Annotated[str | None, typer.Option(help="Names starting with this.")] = None,
    created_after: Annotated[str | None, typer.Option(help="Submitted at or after (ISO 8601).")] = None,
    created_before: Annotated[str | None, typer.Option(help="Submitted before (ISO 8601).")] = None,
    sort: Annotated[
        str | None, typer.Option(help="e.g. -created_at, name, priority ('-': descending).")
    ] = None,
    limit: LimitOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """List jobs (every page, or --limit)."""
    as_json = wants_json(json_flag, output)
    jobs = console().all(
        "jobs/",
        limit,
        state=state,
        owner=owner,
        workspace=workspace,
        name=name,
        created_after=created_after,
        created_before=created_before,
        sort=sort,
    )
    if as_json:
        print_json(jobs)
    else:
        out.print(table(job_rows(jobs), JOB_HEADER))


@app.command()
def show(job: JobId, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """One job with its recent rounds."""
    detail = console().get(f"jobs/{job}/")
    if wants_json(json_flag, output):
        print_json(detail)
        return
    out.print(table(job_rows([detail]), JOB_HEADER))
    failure = detail.get("failure")
    if failure:
        out.print(
            f"\nFailed: rank {failure.get('rank')} on {failure.get('node')} "
            f"(exit {failure.get('exit_code')}, signal {failure.get('signal')})",
            highlight=False,
        )
        out.print(failure.get("error", ""), markup=False, highlight=False)
    rounds = [
        [
            r.get("number"),
            r.get("reason"),
            r.get("world_size"),
            " ".join(a["node"] for a in r.get("allocations", [])),
            r.get("state"),
            r.get("outcome"),
        ]
        for r in detail.get("rounds", [])
    ]
    out.print()
    out.print(table(rounds, ["ROUND", "REASON", "WORLD", "NODES", "STATE", "OUTCOME"], title="Rounds"))


def job_line(job: dict[str, Any]) -> str:
    return (
        f"Job {job['id']}: {job['state']}, round {job.get('round')}, world {job.get('world_size')} "
        f"on {','.join(job.get('nodes') or []) or '-'}"
    )


def job_action(path: str, body: Any, as_json: bool) -> None:
    job = console().post(path, body)
    if as_json:
        print_json(job)
    else:
        out.print(job_line(job), highlight=False)


@app.command()
def scale(
    job: JobId,
    nodes: Annotated[int, typer.Argument(help="The number of nodes wanted (with --role: processes).", min=1)],
    role: Annotated[
        str | None,
        typer.Option(
            "--role", help="Resize this role of a parameter_server job: worker or ps.", show_default=False
        ),
    ] = None,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Resize a job to NODES nodes (within its MIN:MAX), or a parameter_server job's role to NODES
    processes (--role worker: in place; --role ps: a new round)."""
    body = {"role": role, "count": nodes} if role else {"nodes": nodes}
    job_action(f"jobs/{job}/resize/", body, wants_json(json_flag, output))


@app.command()
def restart(job: JobId, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Restart a running job's ranks (a new round)."""
    job_action(f"jobs/{job}/restart/", None, wants_json(json_flag, output))


@app.command()
def stop(job: JobId, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Stop a job."""
    job_action(f"jobs/{job}/stop/", None, wants_json(json_flag, output))


QUOTA_HEADER = ["POOL", "WORKSPACE", "WEIGHT", "USED", "QUOTA", "BORROWED", "MAY BORROW", "PENDING"]


@app.command()
def quota(json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Each pool's workspaces: use, nominal quota, borrowing and pending jobs."""
    rows = console().get("quotas/")
    if wants_json(json_flag, output):
        print_json(rows)
        return
    cells = [
        [
            f"{r['pool']} ({r['capacity']} {r['unit']})",
            r["workspace"] + (" *" if r.get("mine") else ""),
            r["weight"],
            r["used"],
            r["nominal"],
            r["borrowed"],
            "any idle" if r["borrowing_limit"] is None else r["borrowing_limit"],
            r["pending"],
        ]
        for r in rows
    ]
    out.print(table(cells, QUOTA_HEADER) if cells else "No node pool has quotas.", highlight=False)
