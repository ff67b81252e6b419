"""How the later verify stages are judged: server-args resolution, serve, JIT caches (pure core).

Each judge takes a host script's report (plain data) and returns ``(status, reason)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["judge_resolve", "judge_serve", "answer_at", "judge_jit_caches", "stale_versions"]

#: Exception classes whose message means "the platform has no GPU" in sglang's and torch's words.
_GPU_WORDS = ("cuda", "gpu", "nvidia", "no accelerator", "device")


def judge_resolve(report: Mapping[str, Any]) -> tuple[str, str]:
    """(status, reason) for ``server_args.resolve``'s outcome (the ``resolve`` part of the
    server-args script's report).

    - the framework has no separate resolution step: skip, saying so;
    - it ran: pass;
    - it failed importing a module (``ImportError``): fail; the server could not start either;
    - it failed and ``<model_path>/config.json`` is absent on the target: skip, naming the file
      the step needs (with the error);
    - it failed, no GPU is visible and the error speaks of CUDA/GPU/device: skip, it needs a GPU;
    - any other failure: fail, with the error.
    """
    if not report.get("ran"):
        return "skip", str(report.get("error") or "no resolution step was run")
    method = report.get("method") or "the resolution step"
    if report.get("ok"):
        return "pass", f"{method}() ran: the arguments resolve against the model and platform"
    error = str(report.get("error"))
    kinds = set(report.get("kind") or ())
    if "ImportError" in kinds:
        return "fail", f"{method}() needs a module the venv lacks: {error}"
    model = report.get("model_path")
    if report.get("config_json") is False:
        return "skip", (f"{method}() needs the model's config.json, and {model}/config.json is absent on the "
                        f"target; put the model there to run it ({error})")
    if report.get("gpu") is not True and any(word in error.lower() for word in _GPU_WORDS):
        return "skip", f"{method}() needs a GPU, and none is visible here ({error})"
    return "fail", f"{method}() failed: {error}"


def answer_at(answer: Any, path: str) -> Any:
    """The value at a dotted path in a decoded JSON answer (``choices.0.text``); None when absent."""
    value = answer
    for part in path.split(".") if path else ():
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def judge_serve(report: Mapping[str, Any], answer_path: str, *, max_tokens: int | None = None) -> tuple[str, str]:
    """(status, reason) for the serve script's report.

    The answer's shape: the value at ``answer_path`` must be a non-empty string, or a non-empty
    list (of at most ``max_tokens`` items when given: the tokens asked for).
    """
    stopped = f"; server {report.get('stopped')}" if report.get("stopped") else ""
    if not report.get("started"):
        tail = (report.get("log_tail") or "").strip().splitlines()[-1:] or [""]
        return "fail", f"{report.get('error')}; its log ends: {tail[0][:300]}{stopped}"
    if report.get("error"):
        return "fail", f"started in {report['startup_seconds']:.1f} s, then {report['error']}{stopped}"
    value = answer_at(report.get("answer"), answer_path)
    if value is None:
        return "fail", f"the answer has no {answer_path!r}: {str(report.get('answer'))[:300]}{stopped}"
    if not isinstance(value, (str, list)) or not value:
        return "fail", f"the answer's {answer_path} is {value!r}, expected a non-empty string or list{stopped}"
    if isinstance(value, list) and max_tokens is not None and len(value) > max_tokens:
        return "fail", f"the answer's {answer_path} has {len(value)} items, more than the {max_tokens} asked for{stopped}"
    shape = f"{len(value)} {'characters' if isinstance(value, str) else 'items'}"
    first = "streamed first token" if report.get("streamed") else "answer"
    return "pass", (f"started in {report['startup_seconds']:.1f} s; {first} after {report['first_token_seconds']:.2f} s; "
                    f"{answer_path}: {shape}{stopped}")


def stale_versions(cache: Mapping[str, Any]) -> list[str]:
    """The versions a cache's contents were built for that differ from the one installed
    (all of them when the library is not installed)."""
    installed = cache.get("installed")
    return [v for v in cache.get("versions", []) if v != installed]


def judge_jit_caches(caches: Sequence[Mapping[str, Any]], *, cleared: bool) -> tuple[str, str]:
    """(status, reason) for the JIT cache report.

    Pass, naming each existing folder and, as a warning, contents built for other versions
    than installed (a cache keyed by version is not reused, so it is stale weight rather than
    a fault; ``--clear-jit-caches`` removes it). With ``cleared``, fail when a folder could
    not be removed.
    """
    parts, warnings, errors = [], [], []
    for c in caches:
        if not c.get("exists"):
            continue
        stale = stale_versions(c)
        built = f", built for {c.get('library', c['name'])} {', '.join(c['versions'])}" if c.get("versions") else ""
        parts.append(f"{c['name']} {c['path']} ({c['files']} files{built})"
                     + (" removed" if c.get("removed") else ""))
        if stale and not c.get("removed"):
            warnings.append(f"{c['name']} cache holds builds for {c.get('library', c['name'])} {', '.join(stale)} but "
                            f"{c.get('installed') or 'none'} is installed")
        if c.get("error"):
            errors.append(f"{c['path']}: {c['error']}")
    if errors and cleared:
        return "fail", "; ".join(errors)
    if not parts:
        return "pass", "no JIT cache folders exist (" + ", ".join(c["path"] for c in caches) + ")"
    tail = "".join(f"; warning: {w} (--clear-jit-caches removes it)" for w in warnings)
    return "pass", "; ".join(parts) + tail
