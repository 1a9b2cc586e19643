"""Whether a resume may add rows to a run directory that holds rows measured in another
environment (:func:`check_resume`, run by :mod:`bench.engine.rundir`)."""

from __future__ import annotations

from typing import Any

from bench.engine.provenance import RESUME_FIELDS

#: environment fields that a config sets and that change what is measured, though no case or
#: unit id holds them: a run directory holds rows of one value unless ``--allow-mixed``
SETTING_FIELDS = ("threads", "noise_threshold")
#: of those, the ones a plan sets (:attr:`bench.engine.rundir.RunPlan.row_settings`) rather than the machine:
#: compared on a cluster too, where the driver's machine says nothing of the nodes'
PLAN_SETTINGS = ("noise_threshold",)


class MixedEnvironmentError(ValueError):
    """Resuming would mix rows measured in different environments."""


def check_resume_environment(rows: list[dict[str, str]], env: dict[str, Any], dtype: str,
                             fields: tuple[str, ...] = RESUME_FIELDS) -> None:
    """``MixedEnvironmentError`` naming what differs between existing rows and this run."""
    current = {**{k: str(env[k]) for k in fields if k in env}, "dtype": dtype}
    differences: dict[str, set[str]] = {}
    for row in rows:
        for key, value in current.items():
            if row.get(key) and row[key] != value:
                differences.setdefault(key, set()).add(row[key])
    if differences:
        said = "; ".join(f"{k} {', '.join(sorted(v))} -> {current[k]}" for k, v in differences.items())
        raise MixedEnvironmentError(
            f"the run directory holds rows from another environment ({said}); rerun with "
            "--allow-mixed to add rows anyway (the report then says which rows came from where), "
            "or use another --out")


def check_resume(kept: list[dict[str, Any]], env: dict[str, Any], dtype: str, *, has_work: bool,
                 local: bool = True) -> None:
    """The resume check of a run (and of its dry run, :func:`bench.engine.rundir.dry_run_units`): ``kept`` rows
    measured in another environment are a ``MixedEnvironmentError``. With work to do, every
    field of :data:`bench.engine.provenance.RESUME_FIELDS` counts; with nothing to run, the
    settings a case id lacks (:data:`SETTING_FIELDS`) and the dtype still count; the plan's
    settings (:data:`PLAN_SETTINGS`: a speed sweep's noise threshold) count always. On a
    cluster (``local`` False) the driver's device and threads say nothing of the nodes', so
    only the code version, the plan's settings and the dtype are compared."""
    fields = (*RESUME_FIELDS, *PLAN_SETTINGS) if has_work else SETTING_FIELDS
    compared = fields if local else tuple(f for f in fields if f in ("git_sha", *PLAN_SETTINGS))
    check_resume_environment(kept, env, dtype, compared)
