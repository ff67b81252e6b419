"""``transplant init``: a starting manifest from two inventories (pure core; the command is in
:mod:`transplant.cli.commands.init`).

:func:`draft` takes the donor's and the target's inventories and the names to bring, and
decides:

* the overlay: each name as ``{closure: NAME}`` when its closure pulls anything in, else as a
  plain name (shorter); a glob stays a plain pattern;
* ``remove:``: the target's ``nvidia-*-cuNN`` libraries of another CUDA major than the donor's
  torch (written as the glob ``nvidia-*-cuNN`` when the donor has no name it matches), then what
  the planner's own hints ask for: the draft manifest is planned (without ELF facts) and the
  ``add ... to remove:`` / ``add ... to overlay`` hints of its error findings are taken, for at
  most :data:`ROUNDS` rounds or until a round adds nothing;
* ``verify:``: the import names of the roots and of the distributions they require directly
  that the overlay brings, ``smoke: {device: auto}`` where torch will be in the target, and, when sglang is overlaid, a
  ``server_args`` check with DFLASH and placeholder model paths.

:func:`render` writes it as commented YAML.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import yaml
from packaging.utils import canonicalize_name

from transplant.core.elf_facts import ElfReport
from transplant.core.closure import closure, expand
from transplant.core.cuda import cuda_variant, variant_cuda_version
from transplant.core.inventory import Inventory
from transplant.core.import_names import import_names
from transplant.core.manifest import Manifest, normalize_pattern, parse_manifest
from transplant.core.plan import Finding
from transplant.core.planner import plan, selected_names
from transplant.core.units import count, visible

__all__ = ["Draft", "draft", "render", "ROUNDS", "MODEL_PLACEHOLDER", "DRAFT_PLACEHOLDER"]

#: Planner rounds whose hints the draft follows at most.
ROUNDS = 5
MODEL_PLACEHOLDER = "/path/to/model"
DRAFT_PLACEHOLDER = "/path/to/draft-model"
_CU = re.compile(r"^nvidia-.+-cu(\d+)$")


@dataclass(frozen=True, kw_only=True)
class Draft:
    """A starting manifest.

    :ivar data: the manifest as YAML data (what :func:`transplant.core.manifest.parse_manifest` reads).
    :ivar notes: key -> one comment line per entry (``remove`` -> {name: why}, ``overlay`` ->
        {root: "pulls 53 distributions..."}).
    :ivar rounds: planner rounds the draft took; :ivar findings: the last round's error findings
        (without ELF facts: ``transplant plan`` reads the binaries too).
    """

    data: dict[str, Any]
    notes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    rounds: int = 0
    findings: tuple[Finding, ...] = ()


def _major(inv: Inventory) -> int | None:
    torch = inv.latest().get("torch")
    if torch is None or torch.version is None:
        return None
    cuda = variant_cuda_version(cuda_variant(torch.version))
    if cuda is not None:
        return cuda[0]
    # an unlabelled torch: its nvidia requirements say which major (nvidia-*-cu12, or CUDA 13's cuda-toolkit)
    for req in torch.requires_dist:
        m = _CU.match(canonicalize_name(req.name))
        if m:
            return int(m.group(1))
        if canonicalize_name(req.name) == "cuda-toolkit" and req.specifier:
            spec = next(iter(req.specifier))
            return int(spec.version.split(".")[0])
    return None


def _hinted(findings: Sequence[Finding], donor: set[str], target: set[str]) -> tuple[list[str], list[str]]:
    """(names to add to overlay, names to add to remove:) from the error findings' hints."""
    overlay: list[str] = []
    remove: list[str] = []
    for f in findings:
        if f.severity != "error" or f.accepted:
            continue
        for part in f.hint.split("; "):
            m = re.match(r"add to (remove:|overlay\b) in .+?: \[?([^\]()]+)\]?", part) or \
                re.match(r"add (.+?) to (remove:|overlay\b)", part)
            if m is None:
                continue
            key, names = (m.group(1), m.group(2)) if part.startswith("add to ") else (m.group(2), m.group(1))
            for raw in names.split(","):
                name = canonicalize_name(raw.strip().strip("'\" "))
                if key == "overlay" and name in donor and name not in overlay:
                    overlay.append(name)
                elif key == "remove:" and name in target and name not in remove:
                    remove.append(name)
    return overlay, remove


def _manifest(data: Mapping[str, Any], path: str) -> Manifest:
    return parse_manifest(dict(data), path=path)


def draft(donor: Inventory, target: Inventory, names: Sequence[str], *, donor_at: Mapping[str, str],
          target_at: Mapping[str, str], path: str = "transplant.yaml", donor_elf: ElfReport | None = None,
          target_elf: ElfReport | None = None) -> Draft:
    """A starting manifest for bringing ``names`` (and what they need) from ``donor`` to ``target``.

    :param donor: the donor's inventory with RECORD facts (no hashes needed).
    :param target: the target's, likewise.
    :param names: distribution names (each a closure root) or globs (plain patterns), as typed.
    :param donor_at: / :param target_at: the ``donor:`` / ``target:`` mappings (``{host, venv}``).
    :param path: the manifest's path, used in the planner's hints.
    :param donor_elf: / :param target_elf: ELF facts (:func:`transplant.pipeline.gather.gather` of an
        earlier draft) so the binary rules' hints (libtorch-abi, a DT_NEEDED CUDA major) count
        too; None: only the rules that read metadata and RECORDs.
    :returns: a :class:`Draft`; its ``data`` always parses.
    :raises ValueError: a name is neither on the donor nor a glob matching something there.
    """
    donor_latest, target_latest = donor.latest(), target.latest()
    roots: list[str] = []
    patterns: list[str] = []
    for text in names:
        pattern = normalize_pattern(text)
        if any(ch in pattern for ch in "*?["):
            if not any(fnmatchcase(n, pattern) for n in donor_latest):
                raise ValueError(f"--overlay {text!r} matches no distribution on the donor")
            patterns.append(pattern)
        elif pattern in donor_latest:
            roots.append(pattern)
        else:
            raise ValueError(f"--overlay {text!r}: the donor has no distribution of that name")
    notes: dict[str, dict[str, str]] = {"overlay": {}, "remove": {}}
    remove: list[str] = []
    major = _major(donor)
    stale = sorted(n for n in target_latest if (m := _CU.match(n)) and major is not None and int(m.group(1)) != major
                   and n not in donor_latest)
    if stale:
        glob = {f"nvidia-*-cu{_CU.match(n).group(1)}" for n in stale}  # type: ignore[union-attr]  # stale holds only names _CU matched
        for g in sorted(glob):
            if all(n in stale for n in target_latest if fnmatchcase(n, g)):
                remove.append(g)
                notes["remove"][g] = f"the target's CUDA {g.rsplit('cu', 1)[1]} libraries; the donor's torch is CUDA {major}"
            else:
                for n in stale:
                    if fnmatchcase(n, g):
                        remove.append(n)
                        notes["remove"][n] = f"CUDA {g.rsplit('cu', 1)[1]} library; the donor's torch is CUDA {major}"

    def data_of() -> dict[str, Any]:
        overlay: list[Any] = list(patterns) + [{"closure": r} for r in roots]
        out: dict[str, Any] = {"version": 1, "donor": donor_at, "target": target_at, "overlay": overlay}
        if remove:
            out["remove"] = list(remove)
        return out

    rounds = 0
    errors: list[Finding] = []
    donor_names, target_names = set(donor_latest), set(target_latest)
    for _round in range(1, ROUNDS + 1):
        manifest = _manifest(data_of(), path)
        result = plan(manifest, donor, target, donor_elf=donor_elf, target_elf=target_elf)
        errors = [f for f in result.findings if f.severity == "error"]
        more_overlay, more_remove = _hinted(errors, donor_names, target_names)
        expanded, _ = expand(manifest, donor, target)
        brought = set(selected_names(expanded.overlay, donor))
        removed = set(selected_names(remove, target))
        new_roots = [n for n in more_overlay if n not in brought and n not in roots]
        new_remove = [n for n in more_remove if n not in removed and n not in brought]
        for n in new_remove:
            why = next((f for f in errors if n in f.dists), None)
            notes["remove"][n] = _why(why) if why else "the plan's hint"
        if not new_roots and not new_remove:
            break
        roots.extend(new_roots)
        remove.extend(new_remove)
    data = data_of()
    manifest = _manifest(data, path)
    # write a root as a plain name when its own closure pulls nothing in (shorter)
    overlay: list[Any] = list(patterns)
    for r in roots:
        alone = closure([r], donor_latest, target_latest, target.interpreter.markers, overlay=manifest.overlay,
                        remove=manifest.remove)
        if alone.pulled:
            overlay.append({"closure": r})
            chains = sorted(p.name for p in alone.pulled)
            notes["overlay"][r] = (f"{r} {donor_latest[r].raw_version} and what it needs: "
                                   f"{count(len(chains), 'distribution')} the target lacks or has at a refused version")
        else:
            overlay.append(r)
    data["overlay"] = overlay
    manifest = _manifest(data, path)
    expanded, _ = expand(manifest, donor, target)
    chosen = selected_names(expanded.overlay, donor)
    direct = {canonicalize_name(q.name) for r in roots for q in donor_latest[r].requires_dist
              if q.marker is None or _evaluates(q, target.interpreter.markers)}
    imported = [donor_latest[n] for n in chosen if n in roots or n in direct]
    verify: dict[str, Any] = {"imports": [m for m in (_main_import(d) for d in imported) if m]}
    if "sglang" in chosen:
        verify["server_args"] = {
            "entry": "sglang.srt.server_args:prepare_server_args",
            "args": ["--model-path", MODEL_PLACEHOLDER, "--speculative-algorithm", "DFLASH",
                     "--speculative-draft-model-path", DRAFT_PLACEHOLDER, "--speculative-dflash-block-size", "16"],
            "expect": {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 16,
                       "model_path": MODEL_PLACEHOLDER},
        }
    torch_removed = any(fnmatchcase("torch", g) for g in manifest.remove)
    if "torch" in chosen or ("torch" in target_latest and not torch_removed):
        verify["smoke"] = {"device": "auto"}  # the smoke pass is torch's: proposed only where torch will be
    data["verify"] = verify
    _manifest(data, path)
    return Draft(data=data, notes=notes, rounds=rounds, findings=tuple(errors))


def with_checked_imports(d: Draft, passed: Sequence[str], gpu: Mapping[str, str], failed: Mapping[str, str]) -> Draft:
    """The draft with ``verify.imports`` as the donor answered them: the names that import there
    kept, those that fail only for want of a GPU written ``{name: NAME, needs: [gpu]}`` with a
    comment, those that fail in the donor itself left out (named in a comment with the donor's
    error). Names the donor was not asked about are kept. (:func:`transplant.verify.ladder.sort_donor_imports`
    sorts the donor's report.)"""
    verify = dict(d.data.get("verify") or {})
    names = [n for n in verify.get("imports", []) if isinstance(n, str)]
    imports: list[Any] = []
    for name in names:
        if name in gpu:
            imports.append({"name": name, "needs": ["gpu"]})
        elif name not in failed:
            imports.append(name)
    verify["imports"] = imports
    notes = {**d.notes, "imports": {n: f"needs a GPU: in the donor, on a host without a driver: {visible(e, 160)}"
                                    for n, e in gpu.items() if n in names},
             "imports-left-out": {n: visible(e, 160) for n, e in failed.items() if n in names}}
    return Draft(data={**d.data, "verify": verify}, notes=notes, rounds=d.rounds, findings=d.findings)


def with_checked_server_args(d: Draft, refused: str) -> Draft:
    """The draft without ``verify.server_args``, which the donor's own parser refuses (``refused``:
    its reason): a check that fails in the donor checks nothing of the transplant; the reason is
    kept for a comment and init's summary."""
    verify = {k: v for k, v in (d.data.get("verify") or {}).items() if k != "server_args"}
    notes = {**d.notes, "server-args-left-out": {"server_args": f"the donor's own parser refuses it: "
                                                                f"{visible(refused, 200)}"}}
    return Draft(data={**d.data, "verify": verify}, notes=notes, rounds=d.rounds, findings=d.findings)


def _why(finding: Finding) -> str:
    """``code: reason`` for a comment: the finding's code and the hint's first parenthesis
    (``(a CUDA 13 environment does not load it, and the donor runs without it)``)."""
    found = re.search(r"\(([^()]*)\)", finding.hint)
    return f"{finding.code}: {found.group(1) if found else finding.message[:100]}"


def _main_import(dist: Any) -> str | None:
    """The one import name that stands for a distribution: of its top-level names, the closest to
    its own name (``flashinfer-python`` -> ``flashinfer``, ``sglang-kernel`` -> ``sgl_kernel``),
    so helper modules beside it (flashinfer's ``build_backend``) are not imported on their own."""
    tops = [t for t in import_names([dist]) if not t.startswith("_")]
    if not tops:
        return None
    wanted = dist.name.replace("-", "_")
    return (difflib.get_close_matches(wanted, tops, n=1, cutoff=0.0) or tops)[0]


def _evaluates(req: Any, markers: Mapping[str, str]) -> bool:
    try:
        return bool(req.marker.evaluate({**markers, "extra": ""}))
    except Exception:  # noqa: BLE001 - an undefined marker variable counts as applying, as elsewhere
        return True


def _flow(value: Any) -> str:
    """``value`` as one line of flow-style YAML (a scalar without the document end marker)."""
    return yaml.safe_dump([value], default_flow_style=True, width=100000, sort_keys=False).strip()[1:-1]


def render(d: Draft, *, header: Sequence[str] = ()) -> str:
    """The draft as commented YAML (it parses back to ``d.data``)."""
    data = d.data
    lines = [f"# {h}" for h in header]
    lines += ["version: 1", f"donor: {_flow(data['donor'])}", f"target: {_flow(data['target'])}"]
    if data.get("ssh"):
        lines.append(f"ssh: {_flow(data['ssh'])}")
    lines += ["",
              "# overlay: names, globs, or {closure: NAME}: NAME and every donor distribution its requirements need",
              "# (transitively) that the target lacks or has at a version the requirement refuses. `transplant plan`",
              "# shows each pulled-in one with the chain that needs it; exclude: [NAME] keeps one out.",
              "overlay:"]
    for item in data["overlay"]:
        note = d.notes.get("overlay", {}).get(item["closure"] if isinstance(item, dict) else item)
        lines.append(f"  - {_flow(item)}" + (f"   # {note}" if note else ""))
    if data.get("remove"):
        lines += ["", "# remove: target distributions the donor's set replaces", "remove:"]
        for name in data["remove"]:
            note = d.notes.get("remove", {}).get(name)
            lines.append(f"  - {_flow(name)}" + (f"   # {note}" if note else ""))
    verify = data.get("verify") or {}
    lines += ["", "verify:"]
    for name, note in d.notes.get("imports", {}).items():
        lines.append(f"  # {name}: {note}")
    left = d.notes.get("imports-left-out", {})
    if left:
        lines.append("  # left out, failing in the donor itself: " + "; ".join(f"{n} ({e})" for n, e in left.items()))
    lines.append(f"  imports: {_flow(verify.get('imports', []))}")
    for why in d.notes.get("server-args-left-out", {}).values():
        lines.append(f"  # server_args (sglang's parser with DFLASH) left out: {why}")
    if "server_args" in verify:
        sa = verify["server_args"]
        lines += [f"  # sglang's own parser with DFLASH; replace {MODEL_PLACEHOLDER} and {DRAFT_PLACEHOLDER} with the",
                  "  # model paths on the target (the parser does not open them; `resolve: true` would)",
                  "  server_args:", f"    entry: {sa['entry']}", f"    args: {_flow(sa['args'])}",
                  f"    expect: {_flow(sa['expect'])}"]
    if "smoke" in verify:
        lines.append(f"  smoke: {_flow(verify['smoke'])}")
    return "\n".join(lines) + "\n"
