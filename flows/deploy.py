"""``rlhf deploy FILE``: an experiment file as a Prefect deployment ``rlhf/<experiment name>``.

The deployment runs the ``rlhf`` flow (``flows/rlhf.py:rlhf``) from this checkout's folder, as ``prefect.yaml``'s
``rlhf/full`` does (a ``set_working_directory`` pull step, no push/pull of code), and carries the experiment
itself: parameters ``experiment_content`` (the file's text), ``experiment_sha256`` (its digest, which the flow
checks) and ``experiment_base_dir`` (the file's folder, against which its relative paths resolve). A worker on
another machine therefore runs exactly the file that was deployed, not whatever the path holds later.

Created or updated through Prefect's deployment API (``POST /deployments``, an upsert on flow and name): a second
``rlhf deploy`` of the same experiment keeps the deployment's id and replaces its parameters, description, work
pool and schedule (an experiment without ``schedule``, or ``--no-schedule``, leaves none; the server also deletes
the runs the old schedule had queued).

Everything that can be checked here is checked before the server is contacted, each as one line: the file (the
experiment loader's own error, naming the file and field), ``PREFECT_API_URL`` (unset: how to start a server),
the server (unreachable within :data:`HEALTH_TIMEOUT_S` seconds), the work pool (missing: how to create it).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

from rlhf_core.cli import run_command
from rlhf_core.config.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
FLOW_NAME = "rlhf"                      # the @flow name in flows/rlhf.py
ENTRYPOINT = "flows/rlhf.py:rlhf"       # relative to REPO, the worker's working directory
HEALTH_TIMEOUT_S = 5.0
TAGS = ["rlhf", "experiment"]


class DeployError(ConfigError):
    """Deployment refused before or by the server (no API URL, unreachable server, missing work pool): an input
    error, shown by ``rlhf deploy`` as one line."""


@dataclasses.dataclass(frozen=True)
class DeploymentSpec:
    """What ``rlhf deploy`` sends: the deployment ``<flow_name>/<name>`` and its settings.

    ``schedule`` is ``None`` or ``{"cron", "timezone", "active"}``; ``parameters`` hold the experiment
    (``experiment_content``, ``experiment_sha256``, ``experiment_base_dir``)."""

    name: str
    description: str
    work_pool: str
    schedule: dict[str, Any] | None
    parameters: dict[str, str]
    tags: list[str]
    version: str
    flow_name: str = FLOW_NAME
    entrypoint: str = ENTRYPOINT
    working_dir: str = str(REPO)

    @property
    def full_name(self) -> str:
        """``rlhf/<name>``, as ``prefect deployment run`` takes it."""
        return f"{self.flow_name}/{self.name}"


def deployment_spec(path: str | Path, pool: str | None = None, name: str | None = None,
                    schedule: bool = True, check_configs: bool = True) -> DeploymentSpec:
    """The deployment for the experiment file at ``path`` (nothing contacted).

    ``pool`` overrides the file's ``work_pool``, ``name`` its ``name`` (the deployment's name); ``schedule=False``
    drops the file's ``schedule``. The file is checked by the experiment loader exactly as the flow will read the
    deployed parameters (its text, with its folder as the base for relative paths), and, with ``check_configs``,
    every stage's config is composed and validated as the flow's first check does (a typo fails now, not at the
    nightly run). Data, model and reward files are not read here: the worker's machine may see other paths than
    this one; the flow's preflight checks them when each run starts.

    Raises:
        FileNotFoundError: no file at ``path``.
        ConfigError: the loader refused the file (its message names the file and field), its cron or timezone is
            invalid, or a stage's composed config is (the stage on the first line, then each bad key).
    """
    from flows.experiment import load_experiment  # the one loader (schema, defaults, did-you-mean, digest)

    file = Path(path).expanduser().resolve()
    experiment = load_experiment(file)  # what the flow reads back: its text, digest and folder
    if check_configs:
        from flows.settings import resolve_settings, validate_overrides

        validate_overrides(resolve_settings({}, experiment))  # the flow's first check, on any machine
    when = experiment.schedule if schedule else None
    sched = None if when is None else {"cron": when.cron, "timezone": when.timezone, "active": when.active}
    if sched is not None:
        _cron_schedule(sched, file)  # an invalid cron or timezone: refused here, naming the field
    return DeploymentSpec(
        name=name or experiment.name,
        description=experiment.description or f"experiment {experiment.name} ({file.name})",
        work_pool=pool or experiment.work_pool,
        schedule=sched,
        parameters={"experiment_content": experiment.text, "experiment_sha256": experiment.sha256,
                    "experiment_base_dir": experiment.base_dir},
        tags=TAGS + [experiment.name],
        version=f"sha256:{experiment.sha256[:12]}",
    )


def _cron_schedule(sched: dict[str, Any], where: Path):
    """Prefect's ``CronSchedule`` for ``sched``.

    Raises:
        ConfigError: Prefect refuses the cron string or the timezone (naming ``where``, the field and the value).
    """
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        return CronSchedule(cron=sched["cron"], timezone=sched["timezone"])
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        reason = error["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{where}: schedule.{field}: {reason}") from None


def api_url() -> str:
    """The Prefect API the deployment goes to (``PREFECT_API_URL``, from the environment or the active Prefect
    profile).

    Raises:
        DeployError: none is set (the message says how to start a server on this machine).
    """
    from prefect.settings import get_current_settings

    from infra.servers import prefect_server_command

    url = get_current_settings().api.url
    if not url:
        raise DeployError("PREFECT_API_URL is not set: a deployment lives on a Prefect server. Start one with "
                          f"`{shlex.join(prefect_server_command(4200, '127.0.0.1'))}` and "
                          "`export PREFECT_API_URL=http://127.0.0.1:4200/api`")
    return url


def check_server(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """``GET <url>/health`` answers 200 within ``timeout_s`` seconds.

    Raises:
        DeployError: it did not (connection refused, timeout, another status), naming the URL.
    """
    import httpx

    try:
        response = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise DeployError(f"Prefect server at {url} is not reachable ({type(exc).__name__}: {exc or 'no reply'}; "
                          f"waited at most {timeout_s:g} s): is it running?") from None
    if response.status_code != 200:
        raise DeployError(f"Prefect server at {url} answered /health with HTTP {response.status_code}")


def apply(spec: DeploymentSpec) -> tuple[str, bool]:
    """Create or update ``spec`` on the server at ``PREFECT_API_URL``; returns ``(deployment id, created)``.

    Raises:
        DeployError: no API URL, server unreachable, or the work pool does not exist there.
    """
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.exceptions import ObjectNotFound

    url = api_url()
    check_server(url)
    schedules = [] if spec.schedule is None else [DeploymentScheduleCreate(
        schedule=_cron_schedule(spec.schedule, Path(spec.parameters["experiment_base_dir"])),  # checked already
        active=spec.schedule["active"])]
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(spec.work_pool)
        except ObjectNotFound:
            raise DeployError(f"work pool {spec.work_pool!r} does not exist on {url}: create it with `prefect "
                              f"work-pool create --type process {spec.work_pool}` (or pass --pool)") from None
        try:
            client.read_deployment_by_name(spec.full_name)
            created = False
        except ObjectNotFound:
            created = True
        flow_id = client.create_flow_from_name(spec.flow_name)
        deployment_id = client.create_deployment(  # an upsert on (flow, name): same id, schedules replaced
            flow_id=flow_id, name=spec.name, version=spec.version, description=spec.description,
            tags=spec.tags, work_pool_name=spec.work_pool, schedules=schedules, parameters=spec.parameters,
            entrypoint=spec.entrypoint, path=None,
            parameter_openapi_schema=flow_parameter_schema(),
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": spec.working_dir}}],
            concurrency_limit=1, job_variables={})
    return str(deployment_id), created


def flow_parameter_schema() -> dict[str, Any]:
    """The flow's parameter schema as ``prefect deploy`` records it (the UI's run form: names, types, defaults,
    docstring), from the ``rlhf`` function's own source alone: Prefect's ``parameter_schema_from_entrypoint`` on
    the whole of ``flows/rlhf.py`` first imports every module that file imports (MLflow, Ray...: seconds), which
    the signature's builtin annotations do not need."""
    import ast
    import tempfile

    from prefect.utilities.callables import parameter_schema_from_entrypoint

    file, function = ENTRYPOINT.split(":")
    source = (REPO / file).read_text(encoding="utf-8")
    [node] = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function]
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "flow_signature.py"
        copy.write_text("from typing import Any\n\n" + ast.get_source_segment(source, node), encoding="utf-8")
        return parameter_schema_from_entrypoint(f"{copy}:{function}").model_dump_for_openapi()


def deploy_parser() -> argparse.ArgumentParser:
    """The ``rlhf deploy`` parser."""
    parser = argparse.ArgumentParser(
        prog="rlhf deploy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="then: prefect worker start --pool POOL (from this folder); prefect deployment run rlhf/NAME")
    parser.add_argument("file", metavar="FILE", help="the experiment YAML file")
    parser.add_argument("--pool", help="work pool (default: the file's work_pool)")
    parser.add_argument("--name", help="deployment name (default: the experiment's name)")
    parser.add_argument("--no-schedule", action="store_true", help="deploy without the file's schedule")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rlhf deploy FILE [--pool POOL] [--name NAME] [--no-schedule]``; returns the exit code (an input error:
    one line, exit 1)."""
    def command(args: list[str]) -> int:
        opts = deploy_parser().parse_args(args)
        spec = deployment_spec(opts.file, opts.pool, opts.name, schedule=not opts.no_schedule)
        deployment_id, created = apply(spec)
        when = "no schedule" if spec.schedule is None else (
            f"schedule {spec.schedule['cron']} {spec.schedule['timezone']}"
            + ("" if spec.schedule["active"] else " (paused)"))
        print(f"{'created' if created else 'updated'} deployment {spec.full_name} ({deployment_id}): "
              f"{spec.version}, work pool {spec.work_pool}, {when}")
        print(f"  run it now: prefect deployment run {shlex.quote(spec.full_name)}")
        print(f"  a worker runs it from {spec.working_dir}: prefect worker start --pool {shlex.quote(spec.work_pool)}")
        return 0

    return run_command("rlhf deploy", command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
