"""The benchmark worker: a separate process that compiles, checks and times candidates.

A candidate can hang, crash its process or leave a dead CUDA context behind (an illegal memory
access poisons every later launch), so candidates never run in the tuner's process. The parent
talks to one child per GPU over a small protocol of JSON lines on the child's stdin and stdout:

    parent -> child   {"op": "eval", "spec": ref, "problem": {...}, "config": {...}, "seed": s}
    child  -> parent  {"type": "compiled"}                          after the first run returns
    child  -> parent  {"type": "result", "status": ..., "median_us": ..., "reason": ...}

The parent waits `compile_timeout_s` for "compiled" (input generation plus the first run, which
compiles the kernel) and `run_timeout_s` for the result (the check and the timing). On a timeout,
a crash or a fatal CUDA error it kills the child's process group and starts a fresh one; the
candidate's outcome records why.

Each candidate gets fresh random inputs from its own seed, and its first output is checked
against the kernel's reference before it is timed: a wrong or non-finite result is rejected.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneltune.table import Config

#: Error text after which a CUDA context is unusable: the process must be replaced.
FATAL_MARKERS = (
    "illegal memory access",
    "unspecified launch failure",
    "cuda error",
    "misaligned address",
    "device-side assert",
    "an illegal instruction",
)

STATUSES = ("ok", "rejected", "compile_error", "error", "timeout", "crash")
#: GPU milliseconds of graph replays per candidate timing, unless the job says otherwise.
TIMING_MS = 60.0


def is_fatal(text: str) -> bool:
    low = text.lower()
    return any(marker in low for marker in FATAL_MARKERS)


@dataclass
class Outcome:
    """What became of one candidate. `status` is one of `STATUSES`."""

    status: str
    median_us: float | None = None
    samples_us: list[float] = field(default_factory=list, repr=False)
    method: str | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class WorkerError(RuntimeError):
    """A worker process that could not be started or answered nonsense."""


class _Timeout(Exception):
    pass


class _Dead(Exception):
    pass


class BenchmarkWorker:
    """Parent side of one benchmark worker process (restarted as needed).

    `cuda_device` becomes the child's CUDA_VISIBLE_DEVICES; `interpret` runs its kernels under
    the Triton interpreter (TRITON_INTERPRET=1) on the CPU.
    """

    def __init__(
        self, *, cuda_device: str | None = None, interpret: bool = False,
        startup_timeout_s: float = 300.0, name: str = "worker",
    ) -> None:
        self.cuda_device = cuda_device
        self.interpret = interpret
        self.startup_timeout_s = startup_timeout_s
        self.name = name
        self.restarts = 0
        self.hello: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._logdir = Path(tempfile.mkdtemp(prefix="kerneltune-worker-"))
        self._log = self._logdir / f"{name}.log"

    # -- lifecycle -------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The child finds what this process finds (kernel plugins named "module:attr" included).
        paths = [p for p in sys.path if p] + env.get("PYTHONPATH", "").split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        if self.cuda_device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_device
        if self.interpret:
            env["TRITON_INTERPRET"] = "1"
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self) -> dict[str, Any]:
        """Start the child and wait until it has imported everything; returns its hello."""
        if self._proc is not None:
            return self.hello
        self._logdir.mkdir(parents=True, exist_ok=True)
        log = open(self._log, "ab")  # noqa: SIM115 - handed to the child
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kerneltune.tuner.worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=self._env(), start_new_session=True,  # its own group: kill takes compilers too
            )
        finally:
            log.close()
        self._buf = b""
        try:
            msg = self._read(time.monotonic() + self.startup_timeout_s)
        except (_Timeout, _Dead) as e:
            self.kill()
            raise WorkerError(f"{self.name} did not start: {self._log_tail()}") from e
        if msg.get("type") != "ready":
            self.kill()
            raise WorkerError(f"{self.name} said {msg!r} instead of ready")
        self.hello = msg
        return msg

    def kill(self) -> None:
        """Kill the child's process group at once (it may be hung in a kernel)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    def restart(self) -> None:
        self.kill()
        self.restarts += 1
        self.start()

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not within a few seconds."""
        proc = self._proc
        if proc is not None:
            try:
                self._send({"op": "exit"})
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.kill()
        shutil.rmtree(self._logdir, ignore_errors=True)

    def __enter__(self) -> BenchmarkWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    # -- protocol --------------------------------------------------------------------------
    def _send(self, msg: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self._proc.stdin.flush()

    def _read(self, deadline: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise _Dead
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self._log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])[-500:]

    def _death_reason(self) -> str:
        proc = self._proc
        code = None if proc is None else proc.wait(timeout=10)
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        tail = self._log_tail(1)
        return f"worker process {how}" + (f" ({tail})" if tail else "")

    def request(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One request with one answer (no compile stage), e.g. {"op": "info"}."""
        self.start()
        self._send(msg)
        try:
            return self._read(time.monotonic() + timeout_s)
        except (_Timeout, _Dead) as e:
            self.restart()
            raise WorkerError(f"{self.name} gave no answer to {msg['op']!r}") from e

    def evaluate(
        self, spec_ref: str, problem: dict[str, Any], config: Config, *, seed: int,
        compile_timeout_s: float, run_timeout_s: float, timing_ms: float = TIMING_MS,
    ) -> Outcome:
        """Check and time one candidate (`timing_ms` of graph replays on a GPU); never raises
        for anything the candidate does."""
        self.start()
        try:
            self._send({"op": "eval", "spec": spec_ref, "problem": problem, "config": config,
                        "seed": seed, "timing_ms": timing_ms})
        except OSError:
            reason = self._death_reason()
            self.restart()
            return Outcome("crash", reason=reason)
        stage, limit = "compile", compile_timeout_s
        try:
            msg = self._read(time.monotonic() + compile_timeout_s)
            if msg.get("type") == "compiled":
                stage, limit = "run", run_timeout_s
                msg = self._read(time.monotonic() + run_timeout_s)
        except _Timeout:
            self.restart()
            return Outcome("timeout", reason=f"{stage} timed out after {limit:g} s")
        except _Dead:
            reason = f"{self._death_reason()} during {stage}"
            self.restart()
            return Outcome("crash", reason=reason)
        if msg.get("type") != "result" or msg.get("status") not in STATUSES:
            self.restart()
            return Outcome("error", reason=f"unexpected message from worker: {msg!r}"[:500])
        outcome = Outcome(
            msg["status"], median_us=msg.get("median_us"), samples_us=msg.get("samples_us") or [],
            method=msg.get("method"), reason=msg.get("reason"),
        )
        if msg.get("fatal") or (outcome.reason and is_fatal(outcome.reason)):
            self.restart()  # the child exits by itself after a fatal error; start a fresh one
        return outcome


def problem_message(problem: Any) -> dict[str, Any]:
    """A `Problem` as the JSON the worker takes."""
    return {"kernel": problem.kernel, "m": problem.m, "n": problem.n, "dtype": problem.dtype,
            "options": [list(kv) for kv in problem.options]}


def problem_from_message(p: dict[str, Any]) -> Any:
    """The `Problem` a worker problem message stands for."""
    from kerneltune.kernels import Problem

    return Problem(p["kernel"], p["m"], p["n"], p["dtype"],
                   tuple(tuple(kv) for kv in p.get("options", ())))


# ================================================================================ child side


def _classify(exc: BaseException, stage: str) -> str:
    """'compile_error' for what Triton raises while building a kernel, 'error' otherwise."""
    from triton.errors import TritonError

    return "compile_error" if stage == "compile" and isinstance(exc, TritonError) else "error"


def _error(exc: BaseException, stage: str) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}".strip()
    return {"type": "result", "status": _classify(exc, stage), "fatal": is_fatal(text),
            "reason": f"{stage}: {text}"[:2000]}


def _evaluate(req: dict[str, Any], device: str, send: Any, specs: dict[str, Any]) -> dict[str, Any]:
    import torch

    from kerneltune.tuner.job import resolve_spec
    from kerneltune.tuner.timing import capture_config

    try:
        spec = specs.get(req["spec"]) or specs.setdefault(req["spec"], resolve_spec(req["spec"]))
        problem = problem_from_message(req["problem"])
        config, seed = req["config"], int(req["seed"])
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
            result = _evaluate(req, device, send, specs)
            send(result)
            if result.get("fatal"):
                os._exit(3)  # the CUDA context is dead; the parent starts a fresh process
        else:
            send({"type": "error", "reason": f"unknown op {op!r}"})


if __name__ == "__main__":
    main()
