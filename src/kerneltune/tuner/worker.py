"""The tuner's side of a benchmark worker process: start it, feed it, time it out, replace it.

A candidate can hang, crash its process or leave a dead CUDA context behind (an illegal memory
access poisons every later launch), so candidates never run in the tuner's process: each GPU gets
a child process (`kerneltune.tuner.bench_process`) that a `BenchmarkWorker` sends candidates to,
over the messages of `kerneltune.tuner.protocol`. It waits `compile_timeout_s` for "compiled"
(input generation plus the first run, which compiles the kernel) and `run_timeout_s` for the
result (the check and the timing). On a timeout, a crash or a fatal CUDA error it kills the
child's process group and starts a fresh one; the candidate's outcome records why.
"""

from __future__ import annotations

import json
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
from typing import TYPE_CHECKING, Any

from kerneltune.tuner.protocol import STATUSES, TIMING_MS, is_fatal, problem_message

#: `is_fatal` and `problem_message` (of the protocol) are here too: callers of a worker use them.
__all__ = ["BenchmarkWorker", "Outcome", "WorkerError", "is_fatal", "problem_message"]

if TYPE_CHECKING:
    from kerneltune.kernels import KernelConfig

#: The module the child process runs.
CHILD_MODULE = "kerneltune.tuner.bench_process"


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
                [sys.executable, "-m", CHILD_MODULE],
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
        self, spec_ref: str, problem: dict[str, Any], config: KernelConfig, *, seed: int,
        compile_timeout_s: float, run_timeout_s: float, timing_ms: float = TIMING_MS,
    ) -> Outcome:
        """Check and time one candidate (`timing_ms` of graph replays on a GPU); never raises
        for anything the candidate does. The config travels as its JSON (`to_json`)."""
        self.start()
        try:
            self._send({"op": "eval", "spec": spec_ref, "problem": problem,
                        "config": config.to_json(), "seed": seed, "timing_ms": timing_ms})
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
