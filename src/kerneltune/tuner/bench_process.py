"""The program a benchmark worker process runs: compile, check and time candidates, one at a time.

`kerneltune.tuner.worker.BenchmarkWorker` starts it (``python -m kerneltune.tuner.bench_process``)
and sends it the requests of `kerneltune.tuner.protocol`; it answers them until told to exit or
until its parent dies. A candidate gets fresh random inputs from its own seed, and its first
output is checked against the kernel's reference before it is timed: a wrong or non-finite result
is rejected. After a fatal CUDA error the process exits, since its CUDA context is dead; the
parent starts another.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

from kerneltune.tuner.protocol import TIMING_MS, is_fatal, problem_from_message


def _classify(exc: BaseException, stage: str) -> str:
    """'compile_error' for what Triton raises while building a kernel, 'error' otherwise."""
    from triton.errors import TritonError

    return "compile_error" if stage == "compile" and isinstance(exc, TritonError) else "error"


def _error(exc: BaseException, stage: str) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}".strip()
    return {"type": "result", "status": _classify(exc, stage), "fatal": is_fatal(text),
            "reason": f"{stage}: {text}"[:2000]}


def evaluate(req: dict[str, Any], device: str, send: Any, specs: dict[str, Any]) -> dict[str, Any]:
    """The result message for one "eval" request; `send` gets "compiled" once the first run has
    returned. `specs` caches the kernel specs already resolved, by reference."""
    import torch

    from kerneltune.tuner.job import resolve_spec
    from kerneltune.tuner.timing import capture_config

    try:
        spec = specs.get(req["spec"]) or specs.setdefault(req["spec"], resolve_spec(req["spec"]))
        problem = problem_from_message(req["problem"])
        # The parent sent a config of the key's space (`to_json`): read back exactly, typed.
        config, seed = spec.config_type.from_json(req["config"]), int(req["seed"])
        inputs = spec.make_inputs(problem, seed, device)
    except Exception as e:
        return _error(e, "setup")
    try:
        outputs = spec.run(inputs, config)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as e:
        return _error(e, "compile")
    send({"type": "compiled"})
    try:  # captured before the check, timed after it passed (see `capture_config`)
        sets = _timing_sets(req["spec"], spec, problem, device, seed)
        timed = capture_config(spec, problem, config, device=device, seed=seed, input_sets=sets,
                               budget_ms=float(req.get("timing_ms", TIMING_MS)))
    except Exception as e:
        return _error(e, "timing")
    try:
        why = spec.check(inputs, outputs)
    except Exception as e:
        return _error(e, "check")
    if why:
        return {"type": "result", "status": "rejected", "reason": f"wrong output: {why}"[:2000]}
    del inputs, outputs
    try:
        timing = timed()
    except Exception as e:
        return _error(e, "timing")
    if not (math.isfinite(timing.median_us) and timing.median_us > 0):
        return {"type": "result", "status": "rejected", "reason": f"bad time {timing.median_us}"}
    return {"type": "result", "status": "ok", "median_us": timing.median_us,
            "samples_us": list(timing.samples_us), "method": timing.method}


_rotation: dict[tuple[str, Any], list[Any]] = {}


def _timing_sets(ref: str, spec: Any, problem: Any, device: str, seed: int) -> list[Any] | None:
    """The GPU's rotating input sets for a problem, made once for all its candidates (a large
    problem's inputs take longer to make than its candidates take to time); the check still runs
    on fresh inputs per candidate. Only the latest problem's sets are kept: a key whose entry
    serves two (`KernelSpec.served`) makes them again as its search alternates, where keeping
    both ran quant at 16384 x 262144 out of memory in its check on an H100."""
    if not device.startswith("cuda"):
        return None
    from kerneltune.tuner.timing import rotating_inputs

    key = (ref, problem)
    if key not in _rotation:
        _rotation.clear()
        _rotation[key] = rotating_inputs(spec, problem, device=device, seed=seed)
    return _rotation[key]


def _device_info(device: str) -> dict[str, Any]:
    from dataclasses import asdict

    import torch

    from kerneltune.env import device_name, environment
    from kerneltune.tuner.timing import copy_bandwidth_gbps

    info: dict[str, Any] = {"type": "info", "device": device_name(), "compute_capability": None,
                            "sm_count": None, "copy_gbps": None, "env": asdict(environment())}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info["compute_capability"] = f"{props.major}.{props.minor}"
        info["sm_count"] = props.multi_processor_count
        info["copy_gbps"] = copy_bandwidth_gbps(device)
    return info


def _exit_with_parent() -> None:
    """Exit when the tuner dies (even by SIGKILL), also while a candidate hangs."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> None:
    # Keep the protocol on a private copy of stdout; anything the kernels or libraries print
    # goes to stderr (the worker's log) instead of corrupting it.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    _exit_with_parent()
    from kerneltune.env import device_name, on_gpu

    device = "cuda" if on_gpu() else "cpu"
    send({"type": "ready", "device": device_name(), "torch_device": device, "pid": os.getpid()})
    specs: dict[str, Any] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "exit":
            break
        if op == "info":
            send(_device_info(device))
        elif op == "eval":
            result = evaluate(req, device, send, specs)
            send(result)
            if result.get("fatal"):
                os._exit(3)  # the CUDA context is dead; the parent starts a fresh process
        else:
            send({"type": "error", "reason": f"unknown op {op!r}"})


if __name__ == "__main__":
    main()
