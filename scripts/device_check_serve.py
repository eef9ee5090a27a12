"""The device check's serving step: `variantlab serve --devices cuda:0` (adaptive, so its calibration runs on the
GPU) started on loopback, a few requests, a burst, one streamed answer, /metrics; then stopped."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

from device_check_run import RUNNING, Check, StepResult, cli, end_group, start
from device_check_steps import suite_yaml

# ---------------------------------------------------------------------------------------------- 6. serve

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, str, float]:
    """(status, text, seconds) of a GET (body None) or a JSON POST on loopback."""
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), time.monotonic() - t0


def first_chunk_seconds(url: str, body: dict, timeout: float = 30.0) -> tuple[float | None, float, int]:
    """(seconds to the first streamed chunk that carries text, seconds to the end, chunks) of a streaming POST."""
    req = urllib.request.Request(url, data=json.dumps(body | {"stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    t0, first, chunks = time.monotonic(), None, 0
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            choices = json.loads(line[6:]).get("choices") or [{}]
            if first is None and (choices[0].get("delta") or {}).get("content"):
                first = time.monotonic() - t0
    return first, time.monotonic() - t0, chunks


def step_serve(check: Check, limit: float) -> StepResult:
    r = StepResult("serve")
    variants = ([{"name": "fp32", "recipe": "fp32"}, {"name": "bf16", "recipe": "bf16"}] if check.dry else
                [{"name": "bf16", "recipe": "bf16"}, {"name": "int4", "recipe": "int4", "options": {"group_size": 64}}])
    folder = check.work / "serve"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.yaml").write_text(suite_yaml("device-serve", "builtin:tiny-structured", variants[0]["name"],
                                                  variants, 1, check.device, 16, ["\n"], 0, 0))
    port, device = free_port(), "cpu" if check.dry else "cuda:0"
    argv = cli("serve", folder / "suite.yaml", "--devices", device, "--port", port, "--policy", "adaptive",
               "--max-batch", 8, "--threads", 2)
    check.write(f"\n$ {' '.join(map(str, argv))} &    # limit {limit:.0f} s\n")
    t0 = time.monotonic()
    err_path = folder / "server.log"
    with err_path.open("w") as err:
        proc = start(check, argv, folder, stdout=err, stderr=err)
    base = f"http://127.0.0.1:{port}"
    figures: dict = {"device": device, "requests": []}
    try:
        deadline = t0 + limit - 15
        while True:                       # the workers build, calibrate, then the server answers
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}) before answering /health")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer from {base}/health within {limit - 15:.0f} s")
            try:
                code, text, _ = http(base + "/health", timeout=2)
                if code == 200:
                    figures["health"] = json.loads(text)
                    break
            except OSError:
                pass
            time.sleep(0.5)
        figures["ready_s"] = time.monotonic() - t0
        prompt = "order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA:"
        for i in range(4):
            code, text, s = http(base + "/v1/completions", {"prompt": prompt, "max_tokens": 16})
            out = json.loads(text) if code == 200 else {}
            figures["requests"].append({"status": code, "seconds": s, "model": out.get("model"),
                                        "tokens": (out.get("usage") or {}).get("completion_tokens"),
                                        "text": ((out.get("choices") or [{}])[0].get("text") or "")[:40]})
        burst: list = []
        threads = [threading.Thread(target=lambda: burst.append(http(base + "/v1/completions",
                                                                     {"prompt": prompt, "max_tokens": 16})))
                   for _ in range(8)]
        b0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        figures["burst"] = {"requests": 8, "ok": sum(1 for c, _, _ in burst if c == 200),
                            "seconds": time.monotonic() - b0}
        ttft, total, chunks = first_chunk_seconds(base + "/v1/chat/completions",
                                                  {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16})
        figures["stream"] = {"ttft_s": ttft, "seconds": total, "chunks": chunks}
        code, text, _ = http(base + "/metrics")
        figures["metrics_lines"] = len(text.splitlines()) if code == 200 else None
        bad = [q for q in figures["requests"] if q["status"] != 200]
        r.status = "failed" if bad or figures["burst"]["ok"] < 8 or ttft is None else "passed"
    except Exception as e:  # noqa: BLE001 - a step's failure is recorded; the check goes on
        r.status, figures["error"] = ("timed out" if isinstance(e, TimeoutError) else "failed"), f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                end_group(proc)
        RUNNING.discard(proc)
        log = err_path.read_text(errors="replace")
        check.write(log + f"\n[server exit {proc.returncode} after {time.monotonic() - t0:.1f} s]\n")
    r.seconds, r.figures = time.monotonic() - t0, figures
    figures["calibration"] = [line.strip() for line in log.splitlines() if "decode step" in line]
    figures["serving"] = [line.strip() for line in log.splitlines() if line.startswith("serving")]
    done = [q for q in figures["requests"] if q["status"] == 200]
    stream = figures.get("stream") or {}
    r.summary = (f"{device}: {len(done)}/4 requests ok"
                 + (f" (median {sorted(q['seconds'] for q in done)[len(done) // 2] * 1e3:.0f} ms, "
                    f"{done[0]['tokens']} tokens)" if done else "")
                 + (f"; burst {figures['burst']['ok']}/8 in {figures['burst']['seconds']:.2f} s" if "burst" in figures
                    else "") + (f"; streamed TTFT {stream['ttft_s'] * 1e3:.0f} ms" if stream.get("ttft_s") else ""))
    r.details = ([f"- calibration: {line}" for line in figures["calibration"]] +
                 [f"- {line}" for line in figures["serving"]] +
                 [f"- ready after {figures.get('ready_s', 0):.1f} s; /health: {json.dumps(figures.get('health'))[:300]}"])
    if r.status != "passed":
        r.tail = figures.get("error", "") + "\n" + "\n".join(log.splitlines()[-30:])
    return r
