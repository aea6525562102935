"""``trainyard compare`` and ``trainyard sweep submit|ls|show|stop``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from workers.cli.base import JsonOption, LimitOption, OutputOption, app, console, wants_json
from workers.cli.errors import CliError, Exit
from workers.cli.output import out, print_json, table, when
from workers.cli.submit import parse_yaml

sweep_app = typer.Typer(
    help="Hyperparameter sweeps: every trial a job, losers stopped early.", no_args_is_help=True
)
app.add_typer(sweep_app, name="sweep")


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    return text if len(text) <= 40 else text[:37] + "..."


@app.command()
def compare(
    jobs: Annotated[list[int] | None, typer.Argument(help="Job ids to compare.", show_default=False)] = None,
    name: Annotated[str | None, typer.Option(help="Every job whose name starts with this.")] = None,
    sweep: Annotated[int | None, typer.Option(help="The trials of this sweep.")] = None,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Jobs side by side: the hyperparameters that differ, each metric's final and best value."""
    given = [bool(jobs), name is not None, sweep is not None]
    if sum(given) != 1:
        raise CliError("Give job ids, --name PREFIX or --sweep ID (one of them).", Exit.USAGE)
    params: dict[str, Any] = {"jobs": ",".join(map(str, jobs or [])) or None, "name": name, "sweep": sweep}
    data = console().get("compare/", **params)
    if wants_json(json_flag, output):
        print_json(data)
        return
    ids = [str(job["id"]) for job in data["jobs"]]
    header = ["", *[f"#{job['id']} {job['name']}" for job in data["jobs"]]]
    out.print(table([[job["state"] for job in data["jobs"]]], header[1:], title="Jobs"), highlight=False)
    rows = [[key, *[_short(values.get(i)) for i in ids]] for key, values in data["hyperparameters"].items()]
    out.print()
    same = data.get("same_hyperparameters", 0)
    out.print(
        table(rows, ["HYPERPARAMETER", *header[1:]], title=f"Hyperparameters that differ ({same} the same)")
    )
    metric_rows = []
    for metric, info in data["metrics"].items():
        cells = []
        for job_id in ids:
            stat = info["jobs"].get(job_id)
            cells.append(
                "-"
                if stat is None
                else f"{_number(stat['final'])} (best {_number(stat['best'])} @ {_number(stat['best_step'])})"
            )
        direction = "max" if info["higher_is_better"] else "min"
        metric_rows.append([f"{metric} ({direction})", *cells])
    out.print()
    out.print(table(metric_rows, ["METRIC", *header[1:]], title="Final (best) values"), highlight=False)


SWEEP_HEADER = ["ID", "NAME", "STATE", "OBJECTIVE", "SAMPLER", "PRUNER", "TRIALS", "BEST", "OWNER"]


def _sweep_row(sweep: dict[str, Any]) -> list[Any]:
    counts = sweep.get("counts") or {}
    best = sweep.get("best") or {}
    done = sum(counts.values()) if counts else 0
    return [
        sweep["id"],
        sweep["name"],
        sweep["state"],
        f"{sweep['direction'][:3]} {sweep['objective']}",
        sweep["sampler"],
        sweep["pruner"],
        f"{done}/{sweep['max_trials']} ({counts.get('PRUNED', 0)} pruned)",
        f"#{best['number']} {_number(best['value'])}" if best else "-",
        sweep.get("owner"),
    ]


def load_sweep(path: str, overrides: list[str]) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"Cannot read {path}: {exc.strerror}", Exit.USAGE) from None
    try:
        spec = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {' '.join(str(exc).split())}", Exit.INVALID) from None
    if not isinstance(spec, dict):
        raise CliError(f"{path} must hold a mapping of sweep fields (name, job, space, ...).", Exit.INVALID)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set {item!r}: use key=value", Exit.USAGE)
        spec[key] = parse_yaml(value)
    return spec


@sweep_app.command("submit")
def sweep_submit(
    spec_file: Annotated[str, typer.Argument(help="The sweep's YAML (or - for stdin).")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field: max_trials=8")] = None,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Start a sweep: its job spec (``job:``), search space (``space:``), ``objective``,
    ``max_trials``, ``parallel``, ``sampler`` (grid|random|tpe), ``pruner`` (none|median|
    successive_halving) and ``pruner_options``."""
    sweep = console().post("sweeps/", load_sweep(spec_file, set_ or []))
    if wants_json(json_flag, output):
        print_json(sweep)
    else:
        out.print(
            f"Sweep {sweep['id']} ({sweep['name']}) started: {sweep['max_trials']} trials, {sweep['parallel']} at once",
            highlight=False,
        )


@sweep_app.command("ls")
def sweep_list(limit: LimitOption = None, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """List sweeps, newest first."""
    sweeps = console().all("sweeps/", limit)
    if wants_json(json_flag, output):
        print_json(sweeps)
    else:
        out.print(table([_sweep_row(s) for s in sweeps], SWEEP_HEADER), highlight=False)


@sweep_app.command("show")
def sweep_show(
    sweep: Annotated[int, typer.Argument(help="The sweep's id.", min=1)],
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """One sweep with its trials."""
    detail = console().get(f"sweeps/{sweep}/")
    if wants_json(json_flag, output):
        print_json(detail)
        return
    out.print(table([_sweep_row(detail)], SWEEP_HEADER), highlight=False)
    if detail.get("message"):
        out.print(detail["message"], highlight=False, markup=False)
    names = list(detail["space"])
    rows = [
        [
            t["number"],
            t["state"],
            _number(t["value"]),
            _number(t["last_step"]),
            *[_number(t["params"].get(n)) for n in names],
            _number(t["seconds"]),
            t["job"],
            when(t["finished_at"]),
        ]
        for t in detail["trials"]
    ]
    out.print()
    header = [
        "TRIAL",
        "STATE",
        detail["objective"].upper(),
        "STEP",
        *[n.upper() for n in names],
        "SECONDS",
        "JOB",
        "ENDED",
    ]
    out.print(table(rows, header, title="Trials"), highlight=False)


@sweep_app.command("stop")
def sweep_stop(
    sweep: Annotated[int, typer.Argument(help="The sweep's id.", min=1)],
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Stop a sweep and every trial still running."""
    detail = console().post(f"sweeps/{sweep}/stop/")
    if wants_json(json_flag, output):
        print_json(detail)
    else:
        out.print(f"Sweep {detail['id']}: {detail['state']}", highlight=False)
