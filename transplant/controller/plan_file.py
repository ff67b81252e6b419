"""The saved plan file: JSON written atomically by ``plan --out``, read back bounded and decoded
by :func:`transplant.core.plan.plan_from_dict` (edge)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from transplant.controller.output_file import check_output
from transplant.controller.regular_file import NotRegular, read_regular
from transplant.errors import PlanError, TransplantError
from transplant.core.plan import Plan, plan_from_dict, write_plan

__all__ = ["MAX_PLAN_BYTES", "check_plan_destination", "save_plan", "load_plan"]


#: the largest saved plan read (bytes): about 200 bytes a file, so over a million files
MAX_PLAN_BYTES = 256 << 20


def check_plan_destination(path: str | os.PathLike, *, manifest: str) -> None:
    """Refuse a ``--out`` path that cannot or must not be replaced by a plan file.

    :raises TransplantError: as :func:`transplant.controller.output_file.check_output` (its folder
        is missing or takes no new file, it is a folder or another non-regular file: a device, a
        FIFO, a symlink), or it is the manifest itself.
    """
    target = Path(path)
    fix = "give --out a new file name in a folder you can write, e.g. --out plan.json"
    check_output(path, option="--out", replace=True, hint=fix)
    if target.exists() and target.resolve() == Path(manifest).resolve():
        raise TransplantError(f"--out {path}: that is the manifest itself", hint=fix)


def save_plan(plan: Plan, path: str | os.PathLike, *, manifest: str) -> None:
    """Write a plan as JSON atomically (temporary file in the same folder, fsync, rename), with
    the manifest's path made absolute (``apply plan.json`` works from any folder).

    :raises TransplantError: as :func:`check_plan_destination`, or the write failed (the
        temporary file is removed).
    """
    check_plan_destination(path, manifest=manifest)
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent) or ".")
    except OSError as exc:  # the folder changed since the check
        raise TransplantError(f"--out {path}: cannot write the plan ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            # the manifest's path absolute: the plan is applied from any folder
            # as json.dump(indent=2, sort_keys=True) writes it, in large pieces (write_plan)
            write_plan(plan, handle.write, {"manifest": os.path.abspath(plan.manifest)})
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise TransplantError(f"--out {path}: cannot write the plan ({exc.strerror})") from None


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan saved by :func:`save_plan`.

    :raises PlanError: unreadable, not a regular file (a FIFO is not waited on), over
        :data:`MAX_PLAN_BYTES`, not JSON, nested too deeply, or not a plan document.
    """
    hint = "make one with: transplant plan MANIFEST --out plan.json"
    try:
        data = json.loads(read_regular(path, MAX_PLAN_BYTES).decode("utf-8"))
    except NotRegular as exc:
        raise PlanError(f"{path}: refusing the plan: it {exc}", hint=hint) from None
    except RecursionError:
        raise PlanError(f"{path}: refusing the plan: it is nested too deeply to be a plan", hint=hint) from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: refusing the plan: not a text file (byte {exc.start} is not UTF-8); a saved "
                        f"plan is the JSON text plan --out writes", hint=hint) from None
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc})", hint=hint) from None
    try:
        return plan_from_dict(data, source=str(path))
    except RecursionError:
        raise PlanError(f"{path}: refusing the plan: it is nested too deeply to be a plan", hint=hint) from None
