"""Running a tuning job: lanes of benchmark workers sharing keys through the database.

A lane is a thread driving one benchmark worker process (one per visible GPU, or interpreter
workers on a CPU). Lanes of this process and of any other host pointed at the same database take
keys through claims (`kerneltune.tuner.claims`), so each key is tuned once; a key whose owner
died is taken over once its claim goes stale. A key is done when its study says so for the
current budget and its result row exists for the current kernel hash; a restarted job skips done
keys and resumes the others' studies. A key's result row is written as soon as it is picked; its
study (trials, done record) by a writer thread, which then releases the key's claim. The row
replaces a faster stored one when the pick re-timed that one's config beside its winner.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from sqlalchemy import Engine, orm, text
from sqlalchemy.exc import OperationalError, ProgrammingError

from kerneltune import storage
from kerneltune._store_errors import store_reason
from kerneltune.kernels import KernelConfig, KernelSpec
from kerneltune.resolution import Source, rank_transfers
from kerneltune.runtime.transfer import transfer_tables
from kerneltune.table import Config, Entry, Env, with_same_width
from kerneltune.tuner import claims
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.precompile import Precompiler
from kerneltune.tuner.protocol import problem_message
from kerneltune.tuner.search import (
    KeySearch,
    Pick,
    config_id,
    done_info,
    fastest_measured,
    mark_done,
    previous_winner_variants,
    study_name,
    timed_problems,
)
from kerneltune.tuner.worker import BenchmarkWorker

log = logging.getLogger(__name__)

#: Configs of a key's searches on earlier kernel code that seed its search, after the previous
#: winner: a re-tune of a few trials after an edit re-times that winner and its neighbours,
#: and missed runners-up the edit had made faster (measured: picks that trailed such a
#: runner-up by a few percent).
EARLIER_CODE_SEEDS = 3
#: Seconds without a heartbeat after which another worker may take a claimed key over.
CLAIM_TTL_S = 120.0
_PG_INIT_LOCK_KEY = int.from_bytes(b"kttuner0", "big") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class KeyReport:
    """How one key ended in this job: "tuned" (here), "done" (before, or by another worker),
    "failed" (no config passed), "incomplete" (stopped or out of time)."""

    key: TuneKey
    status: str
    entry: Entry | None = None
    trials: int = 0
    pruned: int = 0
    reason: str | None = None


@dataclass
class JobReport:
    device: str
    run_id: int | None
    status: str
    keys: list[KeyReport] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for k in self.keys if k.status == status)


class Progress:
    """What a job tells its observer (the CLI's progress bar); every method may be called from
    any lane's thread."""

    def job_started(self, device: str, keys: list[TuneKey], budget: int) -> None: ...
    def key_started(self, key: TuneKey, lane: int) -> None: ...
    def trial_finished(self, key: TuneKey, trial: FrozenTrial, best_us: float | None) -> None: ...
    def key_finished(self, report: KeyReport) -> None: ...


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    import torch

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def interpreter_only() -> bool:
    import torch

    from kerneltune.kernels import interpreting

    return interpreting() or not torch.cuda.is_available()


@contextlib.contextmanager
def _init_lock(engine: Engine) -> Iterator[None]:
    """Serialise first-time table creation across hosts (PostgreSQL DDL races otherwise)."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_INIT_LOCK_KEY})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_INIT_LOCK_KEY})
            conn.commit()


def open_stores(url: str | None) -> tuple[Engine, optuna.storages.RDBStorage]:
    """The results engine (migrated) and Optuna's storage on the same database, with the
    claims table in place."""
    engine = storage.make_engine(url)
    optuna_url = engine.url.render_as_string(hide_password=False)
    sqlite = engine.dialect.name == "sqlite"
    engine_kwargs: dict[str, Any] = {} if sqlite else {"pool_pre_ping": True}
    for attempt in range(5):
        try:
            with _init_lock(engine):
                storage.migrate(engine)
                study_store = optuna.storages.RDBStorage(optuna_url, engine_kwargs=engine_kwargs)
                if sqlite:  # the busy timeout and commits without fsync of the results engine
                    storage.configure_sqlite(study_store.engine)
                claims.create_claims_table(engine)
            return engine, study_store
        except (OperationalError, ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))  # SQLite: another process creating the same tables
    raise AssertionError("unreachable")


def _failure(error: BaseException) -> str:
    """What went wrong, for the log: one line where the store is away (each lane and thread
    meets it, and its traceback says nothing more), else the traceback."""
    reason = store_reason(error)
    if reason is not None:
        return f"store: {reason}"
    return "".join(traceback.format_exception(error)).rstrip()


def _counts(reports: list[KeyReport]) -> dict[str, int]:
    """A run's counters (`storage.RUN_COUNTS`) from its keys' reports."""
    return {
        "keys_done": sum(r.status in ("tuned", "done") for r in reports),
        "keys_failed": sum(r.status == "failed" for r in reports),
        "trials": sum(r.trials for r in reports),
        "trials_pruned": sum(r.pruned for r in reports),
    }


def with_transfer_seeds(seeds: dict[tuple[str, str, int, int], list[Config]], device: str,
                        compute_capability: str | None, copy_gbps: float | None
                        ) -> dict[tuple[str, str, int, int], list[Config]]:
    """`seeds` (the job's seed tables' configs by key), then the configs of the other GPUs'
    tables this machine has, nearest GPU first (`kerneltune.runtime.transfer`, the order in
    which a runtime on `device` would borrow them): a key untuned here runs the first of them,
    so the search measures it early and keeps it only where it wins. None under the
    interpreter or with KERNELTUNE_TRANSFER=0."""
    others = [Source(t.source, t.origin, t.table) for t in transfer_tables(device)]
    merged = {key: list(configs) for key, configs in seeds.items()}
    for source in rank_transfers(device, compute_capability, copy_gbps, others):
        for entry in source.entries:
            configs = merged.setdefault(entry.key, [])
            if entry.config not in configs:
                configs.append(dict(entry.config))
    return merged


class JobRunner:
    """Runs a `Job` against the database at `database_url` with `workers` lanes."""

    def __init__(
        self, job: Job, database_url: str | None = None, *, workers: int = 1,
        progress: Progress | None = None, claim_ttl_s: float = CLAIM_TTL_S, poll_s: float = 2.0,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.job = job
        self.url = database_url
        self.workers = workers
        self.progress = progress or Progress()
        self.claim_ttl_s = claim_ttl_s
        self.poll_s = poll_s
        self.owner = claims.process_owner()
        self.stop_event = threading.Event()
        self.deadline = (time.monotonic() + job.time_budget_s) if job.time_budget_s else None
        self._lock = threading.Lock()
        self._finished: dict[TuneKey, KeyReport] = {}
        self._lane_errors: list[str] = []
        self._lanes: list[BenchmarkWorker] = []
        self._precompilers: list[Precompiler | None] = []
        #: Writes each finished key's study, then releases its claim (made anew by each run).
        self._writer: ThreadPoolExecutor
        self.specs: dict[str, KernelSpec] = job.specs()
        self.seeds = job.seed_configs()

    # -- state --------------------------------------------------------------------------------
    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def should_stop(self) -> bool:
        return self.stop_event.is_set() or self.out_of_time()

    def stop(self) -> None:
        """Stop after the candidates in flight (the CLI calls it on Ctrl-C)."""
        self.stop_event.set()

    def _search(self, key: TuneKey, worker: BenchmarkWorker | None,
                precompiler: Precompiler | None = None) -> KeySearch:
        prepare = None
        if precompiler is not None:
            ref = key.spec_ref or key.kernel
            messages = [problem_message(p) for p in timed_problems(key, self.specs[key.spec_ref])]

            def prepare(configs: list[KernelConfig]) -> None:
                for message in messages:
                    precompiler.compile(ref, message, configs)

        return KeySearch(
            self.job, key, self.specs[key.spec_ref], self.study_store,
            worker, should_stop=self.should_stop,  # type: ignore[arg-type]
            on_trial=self.progress.trial_finished, prepare=prepare,
            seeds=self.neighbour_configs(key) if worker is not None else (),
        )

    def neighbour_configs(self, key: TuneKey) -> list[KernelConfig]:
        """The seed tables' configs for this key (`Job.seed_tables`, then the other GPUs' tables a
        runtime on this GPU would borrow from: `with_transfer_seeds`), as this code reads them
        (`KernelSpec.parse`: upgraded, in its space and valid); the winner of this key on the
        kernel's previous code (an edit seldom moves the best config far), with each other value of
        a parameter the new code added (what the edit offers is tried on the config it is most
        likely to help); the fastest configs of the key's searches on earlier code
        (`EARLIER_CODE_SEEDS`); then the stored winners of the same kernel and N at the nearest M
        buckets below and above (a config that wins at M rows often wins, or nearly, at other row
        counts), and at the same M in the other 16-bit dtype (the same bytes moved). Stored configs
        are JSON: each becomes a typed config here, and the search enqueues those that may run
        there."""
        spec = self.specs[key.spec_ref]
        problem = key.problem()
        found: list[KernelConfig] = []
        for stored in self.seeds.get((key.kernel, key.dtype, key.n, key.m), ()):
            with contextlib.suppress(ValueError):  # not a config this code runs here
                found.append(spec.parse(problem, stored))
        with self.Session() as s:
            before = storage.get_result(s, key.device, key.kernel, key.dtype, key.n, key.m)
            if before is not None and before.kernel_hash != spec.kernel_hash:
                with contextlib.suppress(ValueError):  # a parameter the new code dropped
                    found += previous_winner_variants(spec, problem, before.config)
            earlier = fastest_measured(self.study_store, key, spec, EARLIER_CODE_SEEDS,
                                       except_code=spec.kernel_hash)
            found += [config for config, _ in earlier if config not in found]
            same_n = storage.results_for(s, key.device, key.kernel, key.dtype, n=key.n,
                                         kernel_hash=spec.kernel_hash)
            below = max((r for r in same_n if r.m < key.m), key=lambda r: r.m, default=None)
            above = min((r for r in same_n if r.m > key.m), key=lambda r: r.m, default=None)
            other_dtypes = (storage.get_result(s, key.device, key.kernel, dtype, key.n, key.m,
                                               kernel_hash=spec.kernel_hash)
                            for dtype in with_same_width(key.dtype)[1:])
            for row in (below, above, *other_dtypes):
                if row is not None:
                    with contextlib.suppress(ValueError):  # not a config this code reads
                        found.append(spec.config_type.from_json(spec.upgrade(problem,
                                                                             row.config)))
        return found

    def is_done(self, key: TuneKey) -> bool:
        spec = self.specs[key.spec_ref]
        info = done_info(self.study_store, study_name(key, spec.kernel_hash))
        if not info:
            return False
        # Done with the job's trials, it is done; with fewer, only where its space had no more
        # valid configs (counted only then: a long row's space takes a while to go through).
        done_with = info.get("budget", 0)
        if not (self.job.trials and done_with >= self.job.trials) and (
                done_with < self._search(key, None).budget()):
            return False
        if info.get("no_result"):
            return True
        with self.Session() as s:
            return self._stored_result(s, key) is not None

    def _stored_result(self, session: orm.Session, key: TuneKey) -> storage.Result | None:
        """The key's stored result, if measured on the current kernel code."""
        return storage.get_result(session, key.device, key.kernel, key.dtype, key.n, key.m,
                                  kernel_hash=self.specs[key.spec_ref].kernel_hash)

    def stored_entry(self, key: TuneKey) -> Entry | None:
        with self.Session() as s:
            row = self._stored_result(s, key)
            return None if row is None else row.to_entry()

    def _retimed_result(self, session: orm.Session, key: TuneKey, pick: Pick) -> int | None:
        """The fingerprint of the key's stored result if the pick ran its config beside the
        winner (the finalists hold the key's previous winner): that verdict replaces it, where
        the stored time, from another run, would keep it."""
        row = self._stored_result(session, key)
        ran = {config_id(f.config) for f in pick.finalists} | set(pick.failed)
        return row.fingerprint if row is not None and config_id(row.config) in ran else None

    # -- the job ------------------------------------------------------------------------------
    def run(self) -> JobReport:
        interpret = interpreter_only()
        gpus = [None] if interpret else visible_gpus()
        if not gpus:
            raise RuntimeError("no GPU visible (CUDA_VISIBLE_DEVICES is empty)")
        self._lanes = [
            BenchmarkWorker(cuda_device=gpus[i % len(gpus)], interpret=interpret, name=f"lane{i}")
            for i in range(self.workers)
        ]
        self._precompilers = [
            Precompiler(self.job.precompile, cuda_device=gpus[i % len(gpus)],
                        interpret=interpret) if self.job.precompile else None
            for i in range(self.workers)
        ]
        try:
            return self._run()
        finally:
            for w in self._lanes:
                w.close()
            for p in self._precompilers:
                if p is not None:
                    p.close()

    def _run(self) -> JobReport:
        first = self._lanes[0]
        first.start()
        info = first.request({"op": "info"}, timeout_s=600)
        device = self.job.device or info["device"]
        self.env = Env(**info.get("env", {}))
        self.copy_gbps = info.get("copy_gbps")
        self.seeds = with_transfer_seeds(self.seeds, device, info.get("compute_capability"),
                                         self.copy_gbps)
        self.engine, self.study_store = open_stores(self.url)
        self.Session = storage.session_factory(self.engine)
        keys = self.job.keys(device)
        with self.Session.begin() as s:
            storage.upsert_device(s, device, compute_capability=info.get("compute_capability"),
                                  sm_count=info.get("sm_count"), copy_gbps=self.copy_gbps)
            self.run_id = storage.start_run(
                s, device=device, env=self.env, sampler=self.job.sampler,
                trials_per_key=self.job.trials, time_budget_s=self.job.time_budget_s,
                worker=f"{os.getpid()}x{self.workers}", keys_total=len(keys),
            )
        self.progress.job_started(device, keys, self.job.trials)
        beat = threading.Thread(target=self._heartbeat, name="claims-heartbeat", daemon=True)
        beat.start()
        lanes = [threading.Thread(target=self._lane, args=(i, keys), name=f"lane{i}", daemon=True)
                 for i in range(len(self._lanes))]
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="study-writer")
        for t in lanes:
            t.start()
        try:
            for t in lanes:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            self.stop()
            for w in self._lanes:
                w.kill()  # candidates in flight end now; their trials are closed as interrupted
            for t in lanes:
                t.join(30)
        finally:
            self._writer.shutdown(wait=True)
            self.stop_event.set()
            beat.join(5)
        return self._finish(device, keys)

    def _finish(self, device: str, keys: list[TuneKey]) -> JobReport:
        reports = []
        for key in keys:
            report = self._finished.get(key)
            if report is None:
                status = "done" if self.is_done(key) else "incomplete"
                report = KeyReport(key, status, entry=self.stored_entry(key))
            reports.append(report)
        interrupted = any(r.status == "incomplete" for r in reports)
        status = "failed" if self._lane_errors else "interrupted" if interrupted else "done"
        with self.Session.begin() as s:
            storage.finish_run(s, self.run_id, status, **_counts(reports))
        if self._lane_errors:
            log.error("lane errors:\n%s", "\n".join(self._lane_errors))
        return JobReport(device, self.run_id, status, reports)

    def _heartbeat(self) -> None:
        owners = [f"{self.owner}/{i}" for i in range(len(self._lanes))]
        while not self.stop_event.wait(self.claim_ttl_s / 4):
            try:
                claims.heartbeat(self.engine, owners)
            except Exception as e:  # a database blip must not kill the job; the next beat retries
                log.warning("claim heartbeat failed: %s", _failure(e))

    def _lane(self, lane: int, keys: list[TuneKey]) -> None:
        worker, owner = self._lanes[lane], f"{self.owner}/{lane}"
        try:
            worker.start()
            while not self.should_stop():
                with self._lock:
                    pending = [k for k in keys if k not in self._finished]
                if not pending:
                    return
                progressed = False
                for key in pending:
                    if self.should_stop():
                        return
                    if key in self._finished:
                        continue
                    if self.is_done(key):
                        self._record(KeyReport(key, "done", entry=self.stored_entry(key)))
                        continue
                    if not claims.claim(self.engine, study_name(
                            key, self.specs[key.spec_ref].kernel_hash), owner,
                            ttl_s=self.claim_ttl_s):
                        continue  # another worker has it
                    progressed = True
                    writes: list[Callable[[], object]] = []
                    try:
                        report = self._tune(key, lane, worker, self._precompilers[lane], writes)
                    finally:
                        self._write(writes, functools.partial(
                            claims.release, self.engine,
                            study_name(key, self.specs[key.spec_ref].kernel_hash), owner))
                    if report.status != "incomplete":
                        self._record(report)
                if not progressed:
                    self.stop_event.wait(self.poll_s)  # the rest is claimed elsewhere
        except Exception as e:
            self._lane_errors.append(f"lane {lane}: {_failure(e)}")
            self.stop()

    def _record(self, report: KeyReport) -> None:
        with self._lock:
            if report.key in self._finished:
                return
            self._finished[report.key] = report
            reports = list(self._finished.values())
        self.progress.key_finished(report)
        try:  # the run's row shows progress while it goes
            with self.Session.begin() as s:
                storage.update_run(s, self.run_id, **_counts(reports))
        except Exception as e:
            log.warning("could not record the run's progress: %s", _failure(e))

    def _tune(self, key: TuneKey, lane: int, worker: BenchmarkWorker,
              precompiler: Precompiler | None, writes: list[Callable[[], object]]
              ) -> KeyReport:
        """Search and pick one key; what goes into its study (the trials, the done record) is
        appended to `writes`, for the study writer."""
        if self.is_done(key):  # finished by another worker between the check and the claim
            return KeyReport(key, "done", entry=self.stored_entry(key))
        self.progress.key_started(key, lane)
        started = time.time()
        search = self._search(key, worker, precompiler)
        state = search.start()
        writes.append(state.save)
        complete = state.counted >= state.budget or state.exhausted
        if not complete and (self.stop_event.is_set() or state.counted == 0):
            return KeyReport(key, "incomplete", trials=state.counted, pruned=state.pruned,
                             reason="stopped")
        pick = search.pick(state, env=self.env, copy_gbps=self.copy_gbps)
        entry, why = pick.entry, pick.reason
        if entry is not None:
            with self.Session.begin() as s:
                storage.upsert_result(s, key.device, entry, run_id=self.run_id,
                                      supersedes=self._retimed_result(s, key, pick))
        if not complete:  # out of time: the best so far is published, the study goes on later
            return KeyReport(key, "incomplete", self.stored_entry(key), state.counted,
                             state.pruned, reason="time budget spent")
        assert state.stored is not None
        writes.append(functools.partial(
            mark_done, state.stored, state, pick, started=started,
            by=f"{self.owner}/{lane} gpu {worker.cuda_device or 'interpreter'}"))
        if entry is None:
            return KeyReport(key, "failed", None, state.counted, state.pruned, reason=why)
        return KeyReport(key, "tuned", self.stored_entry(key), state.counted, state.pruned, why)

    def _write(self, writes: list[Callable[[], object]], release: Callable[[], object]) -> None:
        """Hand a key's study writes to the writer thread, then its claim: the lane goes on to
        its next key while they are written (hundreds of statements a key), and no other worker
        takes the key before its done record is in."""
        def run() -> None:
            try:
                for write in writes:
                    write()
            except Exception as e:
                self._lane_errors.append(f"study writer: {_failure(e)}")
                self.stop()
            finally:
                release()

        self._writer.submit(run)
