"""Verify stage ``serve``: start the server with a tiny model, ask it once, stop it.

Usage: ``<venv>/bin/python -c SOURCE < request.json`` with the request
``{"command": [argv], "health": "/health", "path": "/generate", "body": {...},
"config": {...} | null, "deadline": seconds}``. In the command, ``{model}`` becomes the
tiny model's folder, ``{port}`` a free loopback port and ``{python}`` this interpreter
(each argument replaced as text; no shell).

The tiny model is written into ``<venv>/.transplant/serve-<pid>/model``: a hand-written
``config.json`` (a two-layer Llama, hidden size 64, vocabulary 512, unless ``config`` is
given) and ``model.safetensors`` with zero-filled bfloat16 weights of the Llama tensor
names and shapes (no download); the folder is removed at the end. The server runs in its
own process group, which is stopped with SIGTERM (SIGKILL after 10 s) whatever happens.

Prints ``{"started", "startup_seconds", "first_token_seconds", "request_seconds",
"streamed", "status", "answer", "error", "exit_code", "stopped", "log_tail", "port"}``;
``answer`` is the decoded JSON answer (the last event of a stream). Stdlib only.
"""

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": 2,
}


def _llama_tensors(c):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    d = c.get("head_dim", h // heads)
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for n in range(c["num_hidden_layers"]):
        p = "model.layers.{}.".format(n)
        shapes.update({p + "self_attn.q_proj.weight": [heads * d, h], p + "self_attn.k_proj.weight": [kv * d, h],
                       p + "self_attn.v_proj.weight": [kv * d, h], p + "self_attn.o_proj.weight": [h, heads * d],
                       p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                       p + "mlp.down_proj.weight": [h, i], p + "input_layernorm.weight": [h],
                       p + "post_attention_layernorm.weight": [h]})
    return shapes


def write_model(folder, config):
    """config.json and a safetensors file of zero bfloat16 weights (the format: an 8-byte
    little-endian header length, the JSON header, then the raw tensors)."""
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    header, offset = {}, 0
    shapes = _llama_tensors(config) if config.get("model_type") == "llama" else {}
    for name in sorted(shapes):
        size = 2
        for dim in shapes[name]:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": shapes[name], "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as handle:
        handle.write(struct.pack("<Q", len(blob)) + blob)
        handle.truncate(8 + len(blob) + offset)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ended(returncode):
    """How the server ended (``_common.ended``: a signal by its name, SIGILL as an illegal
    instruction); imported when needed, since this script is also loaded from its file alone."""
    try:
        from _transplant_common import ended
    except ImportError:
        try:
            from ._common import ended  # imported on the controller, as part of its package
        except ImportError:  # run from its file: the shared module beside it
            import runpy

            ended = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_common.py"))["ended"]
    return ended(returncode)


def _stop(proc):
    """SIGTERM the server's process group, SIGKILL after 10 s; returns how it ended."""
    if proc.poll() is not None:
        how = "had {}".format(_ended(proc.returncode))
    else:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(10)
            how = "stopped by SIGTERM"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            how = "killed (SIGKILL) after SIGTERM did not stop it in 10 s"
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # children left in the group
        how += "; leftover processes of its group killed"
    except ProcessLookupError:
        pass
    return how


_ANSWER_LIMIT = 16 << 20  # bytes of answer read at most


def _ask(url, body, deadline):
    """POST ``body``, reading the answer until ``deadline`` (a ``time.monotonic()`` value);
    returns (status, answer, first_token_seconds, total_seconds, streamed).

    :raises TimeoutError: the answer was still coming at the deadline (a server trickling a
        stream, each part inside the socket timeout, is stopped too).
    :raises ValueError: the answer is over ``_ANSWER_LIMIT`` bytes or not JSON.
    """
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    started = time.monotonic()

    def check(size):
        if time.monotonic() > deadline:
            raise TimeoutError("the answer was still coming at the deadline")
        if size > _ANSWER_LIMIT:
            raise ValueError("the answer is over {} bytes".format(_ANSWER_LIMIT))

    with urllib.request.urlopen(req, timeout=max(1.0, deadline - started)) as resp:
        status = resp.status
        if "text/event-stream" in resp.headers.get("Content-Type", ""):
            first, last, size = None, None, 0
            for raw in resp:
                size += len(raw)
                check(size)
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                if first is None:
                    first = time.monotonic() - started
                last = json.loads(payload)
            return status, last, first, time.monotonic() - started, True
        chunks, size = [], 0
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            check(size)
        answer = json.loads(b"".join(chunks).decode("utf-8", "replace"))
        total = time.monotonic() - started
        return status, answer, total, total, False


def main():
    request = json.loads(sys.stdin.read() or "{}")
    deadline = time.monotonic() + float(request.get("deadline", 300))
    work = os.path.join(sys.prefix, ".transplant", "serve-{}".format(os.getpid()))
    _RUNNING["work"] = work
    model = os.path.join(work, "model")
    port = _free_port()
    report = {"started": False, "startup_seconds": None, "first_token_seconds": None, "request_seconds": None,
              "streamed": False, "status": None, "answer": None, "error": None, "exit_code": None, "stopped": None,
              "log_tail": None, "port": port, "model": model}
    proc = None
    log_path = os.path.join(work, "server.log")
    state = os.path.join(sys.prefix, ".transplant")
    try:
        if os.path.islink(state) or (os.path.exists(state) and not os.path.isdir(state)):
            report["error"] = "{} is not a real folder; refusing to write the tiny model through it".format(state)
            return
        write_model(model, request.get("config") or TINY)
        argv = [a.replace("{model}", model).replace("{port}", str(port)).replace("{python}", sys.executable)
                for a in request["command"]]
        report["command"] = argv
        log = open(log_path, "wb")
        started = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=os.setpgrp)
            _RUNNING["proc"] = proc
        except OSError as exc:
            report["error"] = "the server command could not start: {}".format(exc)
            return
        finally:
            log.close()
        signal.signal(signal.SIGTERM, lambda *_: (_stop(proc), sys.exit(143)))
        base = "http://127.0.0.1:{}".format(port)
        health = base + request.get("health", "/health")
        while True:
            if proc.poll() is not None:
                report["exit_code"] = proc.returncode
                report["error"] = "the server {} before {} answered".format(_ended(proc.returncode), health)
                return
            if time.monotonic() > deadline:
                report["error"] = "{} did not answer 200 within {:.0f} s".format(health, time.monotonic() - started)
                return
            try:
                with urllib.request.urlopen(health, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.25)
        report["started"] = True
        report["startup_seconds"] = round(time.monotonic() - started, 3)
        try:
            status, answer, first, total, streamed = _ask(base + request.get("path", "/generate"),
                                                          request.get("body", {}), max(deadline, time.monotonic() + 5))
        except urllib.error.HTTPError as exc:
            report["status"] = exc.code
            report["error"] = "HTTP {} from {}: {}".format(exc.code, exc.url, exc.read()[:500].decode("utf-8", "replace"))
            return
        except (urllib.error.URLError, OSError, ValueError) as exc:  # TimeoutError is an OSError
            report["error"] = "the generation request failed: {}: {}".format(type(exc).__name__, exc)
            return
        report.update(status=status, answer=answer, first_token_seconds=round(first, 3) if first is not None else None,
                      request_seconds=round(total, 3), streamed=streamed)
    except Exception as exc:  # noqa: BLE001 - reported, and the server is stopped below
        report["error"] = "{}: {}".format(type(exc).__name__, exc)
    finally:
        if proc is not None:
            report["stopped"] = _stop(proc)
        try:
            with open(log_path, "rb") as handle:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - 3000))
                report["log_tail"] = handle.read().decode("utf-8", "replace")
        except OSError:
            pass
        shutil.rmtree(work, ignore_errors=True)
        sys.stdout.write(json.dumps(report) + "\n")


#: The server started and the folder of its tiny model, for :func:`_abandon` (set by :func:`main`).
_RUNNING: "dict[str, object]" = {}


def _abandon():
    """Stop the server and remove the tiny model's folder: nothing reads this script's output any
    more (the controller gave up), so it ends at once, not at its deadline."""
    proc = _RUNNING.get("proc")
    if proc is not None:
        _stop(proc)
    if _RUNNING.get("work"):
        shutil.rmtree(_RUNNING["work"], ignore_errors=True)


if __name__ == "__main__":
    try:  # the controller gone or given up (Ctrl-C): stop the server, then end
        from _transplant_common import end_when_unread

        end_when_unread(_abandon)
    except ImportError:  # run from its file (tests): no shared module, nothing watches
        pass
    main()
    sys.exit(0)
