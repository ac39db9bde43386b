"""Merging one store into another: the searches' trials and the tuned results.

Tuning workers that cannot reach one shared PostgreSQL each fill a store of their own (an
SQLite file on a machine lent for an hour, say). `merge_stores` brings one into another as if
the workers had shared it:

- a study the target lacks is copied whole (`optuna.copy_study`);
- a study both hold gets the source's measured trials of the configs the target has not
  measured, so the key's next search knows every config either store ran;
- the results go in as `kerneltune import` stores them: per key the faster result of the same
  kernel code, and never an entry of other code over one of the running code
  (`kerneltune.storage.upsert_result`); a result whose kernel is unknown or whose config its
  kernel refuses at its own key (`kerneltune.resolution.entry_refusal`) stays out, named in
  the report, and the others go in.

The source is only read, once brought to the current schema, as a tuning job would bring it.

`refresh_local_tables` brings a store's results into the machine's own tables (one per GPU in
the user's data directory, `kerneltune.runtime.local`), which the runtime reads: every tune job,
import and merge ends with it, so that what was tuned is what a new process uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from sqlalchemy import Engine

from kerneltune import storage
from kerneltune.kernels import REGISTRY, running_hashes
from kerneltune.resolution import entry_named, refused_entries
from kerneltune.runtime import local, record
from kerneltune.tuner.runner import open_stores
from kerneltune.tuner.search import config_id, measured


@dataclass
class MergeReport:
    """What a merge brought in."""

    studies_copied: int = 0
    studies_extended: int = 0
    trials_added: int = 0
    #: Studies both stores hold whose trials could not join (name: why), e.g. a parameter
    #: whose choices differ between the two.
    studies_skipped: dict[str, str] = field(default_factory=dict)
    results_read: int = 0
    results_stored: int = 0
    #: Results left out, one line each: the device, the entry's key and why its config is
    #: refused.
    results_refused: list[str] = field(default_factory=list)
    #: The devices of the results merged in.
    devices: list[str] = field(default_factory=list)


def same_store(a_url: str, b_url: str) -> bool:
    """Whether two URLs name one store: the same SQLite file however its path is written
    (relative, absolute, through a link), else the same URL."""
    a, b = storage.normalize_url(a_url), storage.normalize_url(b_url)
    if a.get_backend_name() == b.get_backend_name() == "sqlite" and a.database and b.database:
        return Path(a.database).expanduser().resolve() == Path(b.database).expanduser().resolve()
    return a == b


def merge_stores(source_url: str, target_url: str | None,
                 running_hashes: Mapping[str, str] | None = None) -> MergeReport:
    """Merge the store at `source_url` into the one at `target_url` (None: the default store).
    `running_hashes` (kernel name: hash of the running code) guards the results as for an
    import."""
    with contextlib.ExitStack() as stack:
        source_engine, source_studies = stack.enter_context(_opened(source_url))
        target_engine, target_studies = stack.enter_context(_opened(target_url))
        report = MergeReport()
        _merge_studies(source_studies, target_studies, report)
        _merge_results(source_engine, target_engine, running_hashes, report)
        return report


@contextlib.contextmanager
def _opened(url: str | None) -> Iterator[tuple[Engine, optuna.storages.RDBStorage]]:
    """A store's results engine and Optuna storage (`open_stores`), closed on the way out,
    whatever opened after it failed."""
    engine, studies = open_stores(url)
    try:
        yield engine, studies
    finally:
        studies.remove_session()
        studies.engine.dispose()
        engine.dispose()


def _merge_studies(source: optuna.storages.BaseStorage, target: optuna.storages.BaseStorage,
                   report: MergeReport) -> None:
    held = {s.study_name for s in optuna.get_all_study_summaries(target,
                                                                 include_best_trial=False)}
    for summary in optuna.get_all_study_summaries(source, include_best_trial=False):
        name = summary.study_name
        if name not in held:
            optuna.copy_study(from_study_name=name, from_storage=source, to_storage=target)
            report.studies_copied += 1
            continue
        theirs = optuna.load_study(study_name=name, storage=source).get_trials(deepcopy=False)
        mine = optuna.load_study(study_name=name, storage=target)
        new: dict[str, optuna.trial.FrozenTrial] = {}
        known = {config_id(t.params) for t in measured(mine.get_trials(deepcopy=False))}
        for trial in measured(theirs):
            if config_id(trial.params) not in known:
                new.setdefault(config_id(trial.params), trial)
        if not new:
            continue
        try:
            mine.add_trials(list(new.values()))
        except ValueError as e:  # e.g. "Cannot set different distribution kind to the same..."
            report.studies_skipped[name] = str(e)
            continue
        report.studies_extended += 1
        report.trials_added += len(new)


def _merge_results(source: Engine, target: Engine, running_hashes: Mapping[str, str] | None,
                   report: MergeReport) -> None:
    with storage.session_factory(source)() as session:
        tables = [storage.export_table(session, d.name) for d in storage.list_devices(session)]
    sessions = storage.session_factory(target)
    for table in tables:
        if not table.entries:
            continue
        report.results_read += len(table.entries)
        report.devices.append(table.device)
        refused = refused_entries(table.entries, REGISTRY)
        report.results_refused += [f"{table.device}: {entry_named(e)}: {why}"
                                   for _, e, why in refused]
        left_out = {i for i, _, _ in refused}
        accepted = [e for i, e in enumerate(table.entries) if i not in left_out]
        if not accepted:
            continue
        with sessions.begin() as session:
            report.results_stored += storage.import_table(
                session, replace(table, entries=accepted), running_hashes)


def refresh_local_tables(url: str | None, devices: Iterable[str]) -> list[local.Refreshed]:
    """Merge the current results of each of `devices` in the store at `url` (None: the default
    store) into the device's local table (`kerneltune.runtime.local.refresh_table`), and drop
    the keys it then holds from the device's record of untuned keys. A device the store has no
    results for is left alone. Raises OSError or TimeoutError where the data directory cannot
    be written or its lock is held too long."""
    running = running_hashes()
    engine = storage.make_engine(url)
    try:
        with storage.session_factory(engine)() as session:
            tables = []
            for device in dict.fromkeys(devices):
                with contextlib.suppress(storage.UnknownDeviceError):
                    tables.append(storage.export_table(session, device))
    finally:
        engine.dispose()
    done = []
    for tuned in tables:
        done.append(local.refresh_table(tuned, running))
        record.forget(tuned.device, {e.key for e in tuned.entries
                                     if running.get(e.kernel) == e.kernel_hash})
    return done
