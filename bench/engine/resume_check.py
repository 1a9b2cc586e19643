"""Whether a resume may add rows to a run directory that holds rows measured in another environment."""

from __future__ import annotations

from typing import Any

from bench.engine.provenance import RESUME_FIELDS

#: fields a config sets that change what is measured but no case id holds: one value per run directory
SETTING_FIELDS = ("threads", "noise_threshold")
#: of those, the plan's rather than the machine's (``RunPlan.row_settings``): compared on a cluster too
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
    """``MixedEnvironmentError`` for ``kept`` rows of another environment (with nothing to do: the settings only; on
    a cluster the driver's device and threads say nothing of the nodes': the code version only)."""
    fields = (*RESUME_FIELDS, *PLAN_SETTINGS) if has_work else SETTING_FIELDS
    compared = fields if local else tuple(f for f in fields if f in ("git_sha", *PLAN_SETTINGS))
    check_resume_environment(kept, env, dtype, compared)
