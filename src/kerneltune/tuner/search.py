"""The Optuna search for one tuning key, and the pick of its winner.

One study per key, stored next to the results, named after the key and the kernel's source hash
(new kernel code starts a new study). Each parameter is suggested categorically from the spec's
space, and the suggestion read as the kernel's typed config (`KernelSpec.parse`); one that is not
a config of the space or that the spec's constraints reject is pruned, with why, without running;
a config already measured in the study is pruned as a duplicate (its measurement stands).
Everything else runs in the benchmark worker, and every trial records its config (params),
outcome, median time, timing method and the reason it failed. Configs are typed inside the
search and JSON at its edges (`KernelConfig.to_json`): trial params, enqueued trials, the
worker's messages, stored results and the recorded finalists.

TPE by default, its first trials enqueued: the default config, the seeds the job gives
(`JobRunner.neighbour_configs`: the key's winners and fastest configs on earlier kernel code,
the winners of neighbouring keys), the kernel's candidates for the problem
(`KernelSpec.candidates`), on a resumed study the one-parameter neighbourhood of its incumbent
(the last pick, else its fastest trial: more trials for a key refine what it found), then the
default's one-parameter neighbourhood (up to the budget), each unless already measured (a
config that ran out of memory is run again: `settled`).
"brute" enqueues every valid config in the canonical order (default first); "random" samples
uniformly after the default.

The search runs on an in-memory copy of the stored study, whose new trials are written back
once it ends or stops (by the job's writer thread, while the next key is searched): every ask,
suggest and tell on the database costs milliseconds of host time, which added up to most of a
small key's tuning time. A process killed mid-key loses that key's trials (it is searched
again); finished trials count against the budget on resume. Trials found RUNNING in the store
(a process killed while recording one) are closed as FAIL ("interrupted") and do not count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import random
import statistics
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState

from kerneltune.kernels import KernelConfig, KernelSpec, Problem
from kerneltune.table import ConfigValue, Entry, Env
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.protocol import problem_message
from kerneltune.tuner.select import (
    Measured,
    best_over_rows,
    canonical_order,
    holds_at,
    pick_winner,
)
from kerneltune.tuner.worker import BenchmarkWorker, Outcome

#: Trial outcomes that did not measure anything new: they do not count against the budget.
NOT_MEASURED = frozenset({"invalid", "duplicate", "interrupted"})
#: After this many invalid or duplicate suggestions in a row, the next untried config (in a
#: seeded random order) is enqueued, so a converged sampler still makes progress. Each
#: suggestion is a stored trial (about 20 ms to write on SQLite): at 8, a typical key of an H200
#: job spent 0.4 s of its 1.8 s on 16 skipped suggestions, while the search study's keys reach
#: within 2% of brute force in the same trials at 3 as at 8.
SKIP_LIMIT = 3

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def study_name(key: TuneKey, kernel_hash: str) -> str:
    return f"kerneltune:{key.device}:{key.kernel}:{key.dtype}:n{key.n}:m{key.m}:{kernel_hash}"


def timed_problems(key: TuneKey, spec: KernelSpec) -> list[Problem]:
    """What each candidate of the key is checked and timed as: each problem its entry serves
    (`KernelSpec.served`) at each of the key's timed row counts (`TuneKey.timed_rows`); the
    key's time is their mean."""
    served = spec.served(key.problem())
    return [dataclasses.replace(p, m=rows) for rows in key.timed_rows() for p in served]


def key_seed(job_seed: int, key: TuneKey) -> int:
    return (job_seed * 1_000_003 + zlib.crc32(str(key).encode())) & 0x7FFF_FFFF


def config_id(config: KernelConfig | Mapping[str, ConfigValue]) -> str:
    """A config's identity in a study: its JSON with sorted keys, so that a typed config and a
    trial's params (or a stored config) of the same values have the same id."""
    data = config.to_json() if isinstance(config, KernelConfig) else dict(config)
    return json.dumps(data, sort_keys=True)


def outcome_of(trial: FrozenTrial) -> str | None:
    """A finished trial's outcome ("ok", "invalid", "timeout", ...; FAIL without one: killed)."""
    if trial.state == TrialState.FAIL and "outcome" not in trial.user_attrs:
        return "interrupted"
    return trial.user_attrs.get("outcome")


def measured(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that ran a candidate (successfully or not): those the budget counts."""
    return [t for t in trials if t.state.is_finished() and outcome_of(t) not in NOT_MEASURED]


def ran_out_of_memory(trial: FrozenTrial) -> bool:
    """Whether the trial failed for the GPU memory its process held, not for its config."""
    return (outcome_of(trial) == "error"
            and "out of memory" in str(trial.user_attrs.get("reason", "")).lower())


def settled(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Measured trials whose config a later search does not run again: all but those that ran
    out of memory. What a candidate's check held beside the key's inputs has shrunk since
    (`kerneltune.kernels._spec.row_blocks`): at 16384 x 262144 on an H200, the backward's
    fastest config, 1.12x the pick, had failed so in its search's second trial and was never
    tried again."""
    return [t for t in measured(trials) if not ran_out_of_memory(t)]


def neighbourhood(config: KernelConfig, space: Mapping[str, Sequence[ConfigValue]]
                  ) -> Iterator[KernelConfig]:
    """Configs that differ from `config` in one parameter, nearest choices first: every
    parameter's adjacent choices, then those two steps away, and so on.

    The best config of a key is most often a step or two from a good heuristic (other warps,
    the other eviction policy, a second row per program), while most of the space is far from
    it: trying this ring first finds it in a few trials where a sampler drawing from the
    whole space needs dozens.
    """
    reach = max((len(choices) for choices in space.values()), default=0)
    for step in range(1, reach):
        for name, choices in space.items():
            value = getattr(config, name)
            if value not in choices:
                continue
            at = list(choices).index(value)
            for i in (at - step, at + step):
                if 0 <= i < len(choices):
                    yield config.replace(**{name: choices[i]})


def previous_winner_variants(spec: KernelSpec, problem: Problem,
                             stored: Mapping[str, ConfigValue]) -> list[KernelConfig]:
    """A winner stored by the kernel's previous code (its JSON) as this code reads it
    (`upgrade`, then the typed config; ValueError where it cannot), then with each other
    choice of every parameter added since, where valid: an edit that adds an option is tried
    first on the config it is most likely to help. Whether the winner itself may run here is
    the search's to check, as for any seed."""
    config = spec.config_type.from_json(spec.upgrade(problem, stored))
    space = spec.space(problem)
    variants = (config.replace(**{name: choice}) for name in space if name not in stored
                for choice in space[name] if choice != getattr(config, name))
    return [config, *(v for v in variants if spec.valid(problem, v))]


def fastest_measured(storage: optuna.storages.RDBStorage, key: TuneKey, spec: KernelSpec,
                     top: int, *, except_code: str | None = None
                     ) -> list[tuple[KernelConfig, float]]:
    """The `top` fastest distinct configs that the key's studies measured, those on kernel code
    `except_code` left out, as this code reads them (`KernelSpec.parse`: upgraded, in its space
    and valid), each with its best search time (µs), fastest first. Times measured on other
    code say how that code ran: an order to try configs in, not this code's times."""
    prefix = study_name(key, "")
    # Optuna's own listing loads every study's summary: minutes for a store of 15K studies.
    # (LIKE's "_" matches any character: the prefix is checked again.)
    with storage.engine.connect() as conn:
        names = conn.execute(sqlalchemy.text(
            "SELECT study_name FROM studies WHERE study_name LIKE :p"), {"p": prefix + "%"}
        ).scalars().all()
    problem = key.problem()
    best: dict[str, tuple[KernelConfig, float]] = {}
    for name in names:
        if not name.startswith(prefix) or name == study_name(key, except_code or ""):
            continue
        for trial in measured(optuna.load_study(study_name=name, storage=storage)
                              .get_trials(deepcopy=False)):
            if trial.value is None:
                continue
            try:
                config = spec.parse(problem, trial.params)
            except ValueError:  # a parameter this code does not have, or not one it runs here
                continue
            if config_id(config) not in best or trial.value < best[config_id(config)][1]:
                best[config_id(config)] = (config, float(trial.value))
    return sorted(best.values(), key=lambda cv: cv[1])[:top]


def make_sampler(name: str, seed: int, budget: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(  # the constant liar spreads a batch's suggestions
            seed=seed, multivariate=True, constant_liar=True,
            n_startup_trials=max(2, min(10, budget // 4)),
        )
    return optuna.samplers.RandomSampler(seed=seed)  # brute: the enqueued configs drive it


@dataclass
class SearchState:
    """How far a key's search got. `study` is its working copy, holding every trial of the key;
    `save` writes the search's new trials into the stored study."""

    study: optuna.Study
    budget: int
    counted: int
    pruned: int
    exhausted: bool
    stored: optuna.Study | None = None
    _unsaved: Callable[[], None] | None = field(default=None, repr=False)

    def save(self) -> None:
        """Write the new trials into the stored study (once; later calls do nothing)."""
        write, self._unsaved = self._unsaved, None
        if write is not None:
            write()


TrialCallback = Callable[[TuneKey, FrozenTrial, "float | None"], None]


def fit_to_space(storage: optuna.storages.BaseStorage, study: optuna.Study,
                 space: dict[str, list[Any]]) -> optuna.Study:
    """`study` with each trial's parameters in `space`'s distributions: as it is where they
    already are, else rebuilt under its name.

    A study keeps the choices its parameters were first suggested with, and Optuna refuses a
    trial whose choices differ ("CategoricalDistribution does not support dynamic value
    space"): a spec whose space gained a value (a GRID_MULT, with the kernel's device code, and
    so its studies' names, unchanged) could no longer write its key's new trials. The rebuilt
    study keeps its attributes and every trial whose parameters all lie in the space, with its
    outcome and attributes, in order; a trial of a value the space no longer holds is dropped
    (its config cannot be suggested again), as is a queued one whose fixed values it does not
    hold. A process killed between the deletion and the rebuild leaves the key to be searched
    anew; its stored result stands."""
    wanted = {name: optuna.distributions.CategoricalDistribution(choices)
              for name, choices in space.items()}
    trials = study.get_trials(deepcopy=False)
    if all(t.distributions[name] == wanted.get(name) for t in trials for name in t.params):
        return study
    kept = [FrozenTrial(
        number=0, trial_id=0, state=t.state, value=None, values=t.values,
        datetime_start=t.datetime_start, datetime_complete=t.datetime_complete,
        params=t.params, distributions={name: wanted[name] for name in t.params},
        user_attrs=t.user_attrs, system_attrs=t.system_attrs,
        intermediate_values=t.intermediate_values,
    ) for t in trials if all(name in wanted and value in wanted[name].choices for name, value
                             in (t.params or t.system_attrs.get("fixed_params", {})).items())]
    name, attrs = study.study_name, study.user_attrs
    optuna.delete_study(study_name=name, storage=storage)
    fitted = optuna.create_study(study_name=name, storage=storage, direction="minimize")
    for key, value in attrs.items():
        fitted.set_user_attr(key, value)
    fitted.add_trials(kept)
    return fitted


class KeySearch:
    """Runs (or resumes) the study of one key with one benchmark worker."""

    def __init__(
        self, job: Job, key: TuneKey, spec: KernelSpec, storage: optuna.storages.BaseStorage,
        worker: BenchmarkWorker, *, should_stop: Callable[[], bool] = lambda: False,
        on_trial: TrialCallback | None = None,
        prepare: Callable[[list[KernelConfig]], object] | None = None,
        seeds: Sequence[KernelConfig] = (),
    ) -> None:
        self.job, self.key, self.spec, self.storage, self.worker = job, key, spec, storage, worker
        self.problem: Problem = key.problem()
        #: What each candidate is checked and timed as (`timed_problems`).
        self.served = timed_problems(key, spec)
        self.space = spec.space(self.problem)
        self.default = spec.default(self.problem)
        self.order = canonical_order(self.space, self.default)
        self.seed = key_seed(job.seed, key)
        self.should_stop = should_stop
        self.on_trial = on_trial
        #: Called with each batch of candidates before they are measured (to compile them).
        self.prepare = prepare
        #: Configs tried right after the default (the winners of neighbouring keys).
        self.seeds = list(seeds)
        self._valid: list[KernelConfig] | None = None
        self._budget: int | None = None
        self._counted = self._pruned = self._skips = self._asks = self._known = 0

    # -- the space ---------------------------------------------------------------------------
    @property
    def valid_configs(self) -> list[KernelConfig]:
        """Every valid config, default first, then in the space's canonical order."""
        if self._valid is None:
            configs = list(self.spec.configs(self.problem))
            self._valid = sorted(configs, key=self.order)
        return self._valid

    def _count_valid(self, up_to: int) -> int:
        """The valid configs, counted no further than `up_to`: listing a long row's whole space
        takes about a second, while a search of a few trials needs to know only that it holds
        as many."""
        if self._valid is not None:
            return min(up_to, len(self._valid))
        return sum(1 for _ in itertools.islice(self.spec.configs(self.problem), up_to))

    def budget(self) -> int:
        """Trials the key takes: the job's, or every valid config where the space holds fewer."""
        if self._budget is None:
            trials = self.job.trials
            self._budget = len(self.valid_configs) if trials == 0 else self._count_valid(trials)
        return self._budget

    def evaluate(self, config: KernelConfig, seed: int,
                 problems: Sequence[Problem] | None = None) -> Outcome:
        """Check and time `config` on every problem of the key (`timed_problems`; or those
        given): the first one's failure is the outcome, else the mean time."""
        done: list[Outcome] = []
        medians: list[float] = []
        for problem in self.served if problems is None else problems:
            outcome = self.worker.evaluate(
                self.key.spec_ref or self.key.kernel, problem_message(problem), config,
                seed=seed, compile_timeout_s=self.job.compile_timeout_s,
                run_timeout_s=self.job.run_timeout_s, timing_ms=self.job.timing_ms,
            )
            if not outcome.ok or outcome.median_us is None:
                return outcome
            done.append(outcome)
            medians.append(outcome.median_us)
        if len(done) == 1:
            return done[0]
        return Outcome("ok", median_us=statistics.fmean(medians),
                       samples_us=[t for o in done for t in o.samples_us], method=done[0].method)

    # -- the study ---------------------------------------------------------------------------
    def open_study(self) -> optuna.Study:
        """The key's stored study (created when new), with trials a killed process left
        RUNNING closed as FAIL ("interrupted"): this worker holds the key's claim, so nobody
        else runs them. A study stored under another space is fitted to this one
        (`fit_to_space`)."""
        study = optuna.create_study(
            study_name=study_name(self.key, self.spec.kernel_hash), storage=self.storage,
            direction="minimize", load_if_exists=True,
        )
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        return fit_to_space(self.storage, study, self.space)

    def working_copy(self, stored: optuna.Study) -> optuna.Study:
        """An in-memory study holding the stored one's trials under the same numbers and its
        attributes (the last search's finalists, which `finalists` re-times), with the first
        candidates enqueued (those not measured or queued yet)."""
        study = optuna.create_study(
            study_name=stored.study_name, storage=optuna.storages.InMemoryStorage(),
            sampler=make_sampler(self.job.sampler, self.seed, self.budget()),
            direction="minimize",
        )
        for name, value in stored.user_attrs.items():
            study.set_user_attr(name, value)
        loaded = stored.get_trials(deepcopy=False)
        study.add_trials(loaded)
        queued = {config_id(t.params) for t in settled(loaded)}
        queued |= {config_id(t.system_attrs.get("fixed_params", {})) for t in loaded
                   if t.state == TrialState.WAITING}
        budget = self.budget()

        def enqueue(config: KernelConfig, source: str) -> None:
            if config_id(config) not in queued and self.runs(config):
                study.enqueue_trial(config.to_json(), user_attrs={"source": source})
                queued.add(config_id(config))

        enqueue(self.default, "default")
        if self.job.sampler == "tpe":
            best = self.incumbent(study)
            polish = neighbourhood(best, self.space) if best is not None else ()
            for config, source in [*((c, "neighbour") for c in self.seeds),
                                   *((c, "candidate") for c in self.spec.candidates(
                                       self.problem)),
                                   *((c, "polish") for c in polish),
                                   *((c, "local") for c in neighbourhood(self.default,
                                                                         self.space))]:
                if len(queued) >= budget:
                    break
                enqueue(config, source)
        elif self.job.sampler == "brute":
            for config in self.valid_configs[:budget]:
                enqueue(config, "brute")
        return study

    def search(self) -> SearchState:
        """`start`, then `save`: the new trials are in the stored study when this returns."""
        state = self.start()
        state.save()
        return state

    def start(self) -> SearchState:
        """Measure candidates on the working copy until the budget is spent, the space
        exhausted or the job stopped; the caller saves the state (this saves it only when the
        search raises)."""
        stored = self.open_study()
        study = self.working_copy(stored)
        waiting = {t.number for t in stored.get_trials(deepcopy=False,
                                                       states=(TrialState.WAITING,))}
        loaded = len(stored.get_trials(deepcopy=False))

        def write() -> None:
            trials = study.get_trials(deepcopy=False)
            for t in trials[:loaded]:  # queued in the store before, run here
                if t.number in waiting and t.state.is_finished():
                    _finish_waiting(self.storage, stored.study_name, t)
            stored.add_trials(t for t in trials[loaded:] if t.state.is_finished())

        try:
            self._search(study)
        except BaseException:
            write()
            raise
        exhausted = self._count_valid(self._known + 1) <= self._known  # no valid config unknown
        return SearchState(study, self.budget(), self._counted, self._pruned, exhausted=exhausted,
                           stored=stored, _unsaved=write)

    def _search(self, study: optuna.Study) -> None:
        trials = study.get_trials(deepcopy=False)
        done = measured(trials)
        known = {config_id(t.params): t.number for t in settled(trials)}
        budget = self.budget()
        self._counted, self._pruned, self._skips, self._asks = len(done), 0, 0, 0
        untried = self._untried_in_random_order(known)
        while not self.should_stop():
            batch = self._ask_batch(study, known, budget, untried)
            if not batch:
                break
            if self.prepare is not None and len(batch) > 1:
                self.prepare([config for _, config in batch])
            for i, (trial, config) in enumerate(batch):
                if self.should_stop() or not self._run_trial(study, trial, config):
                    for rest, rest_config in batch[i:]:  # not measured: they do not count
                        study.tell(rest, state=TrialState.FAIL, skip_if_finished=True)
                        known.pop(config_id(rest_config), None)
                    break
        self._known = len(known)

    def _ask_batch(self, study: optuna.Study, known: dict[str, int], budget: int,
                   untried: Iterator[KernelConfig]
                   ) -> list[tuple[optuna.Trial, KernelConfig]]:
        """Up to `job.batch` new valid configs to measure (invalid and repeated suggestions are
        pruned on the way; configs of the batch count as known). The budget is at most the
        valid configs, and every measured or batched one is known, so a space runs out no later
        than the budget does."""
        batch: list[tuple[optuna.Trial, KernelConfig]] = []
        while (len(batch) < self.job.batch and self._counted + len(batch) < budget
               and not self.should_stop()):
            self._asks += 1
            if self._asks > 20 * budget + 100:  # a sampler that never leaves invalid configs
                break
            if self._skips >= SKIP_LIMIT:
                nxt = next((c for c in untried if config_id(c) not in known), None)
                if nxt is not None:
                    study.enqueue_trial(nxt.to_json(), user_attrs={"source": "fallback"})
                self._skips = 0
            trial = study.ask()
            try:  # a value queued from elsewhere may lie outside the choices (Optuna raises)
                params = {name: trial.suggest_categorical(name, list(choices))
                          for name, choices in self.space.items()}
                config = self.spec.parse(self.problem, params)
            except ValueError as e:  # out of the space or against the kernel's constraints
                self._prune(study, trial, "invalid", f"rejected: {e}")
                self._skips += 1
                continue
            cid = config_id(config)
            if cid in known:
                self._prune(study, trial, "duplicate", f"same config as trial {known[cid]}")
                self._skips += 1
                continue
            self._skips = 0
            known[cid] = trial.number
            batch.append((trial, config))
        return batch

    def _run_trial(self, study: optuna.Study, trial: optuna.Trial, config: KernelConfig
                   ) -> bool:
        """Measure one candidate and tell the study; False when the job was stopped under it."""
        outcome = self.evaluate(config, seed=self.seed + trial.number + 1)
        if self.should_stop() and outcome.status in ("crash", "timeout"):
            # The job was stopped under the candidate (its worker killed): not its fault.
            return False
        trial.set_user_attr("outcome", outcome.status)
        if outcome.method:
            trial.set_user_attr("method", outcome.method)
        if outcome.ok:
            assert outcome.median_us is not None
            trial.set_user_attr("median_us", outcome.median_us)
            frozen = study.tell(trial, outcome.median_us)
        else:
            trial.set_user_attr("reason", outcome.reason or outcome.status)
            frozen = study.tell(trial, state=TrialState.PRUNED)
            self._pruned += 1
        self._counted += 1
        if self.on_trial is not None:
            self.on_trial(self.key, frozen, self._best_value(study))
        return True

    @staticmethod
    def _prune(study: optuna.Study, trial: optuna.Trial, outcome: str, reason: str) -> None:
        trial.set_user_attr("outcome", outcome)
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=TrialState.PRUNED)

    @staticmethod
    def _best_value(study: optuna.Study) -> float | None:
        try:
            return study.best_value
        except ValueError:
            return None

    def _untried_in_random_order(self, known: dict[str, int]) -> Iterator[KernelConfig]:
        """The valid configs not known when first asked for (the space is listed then, only
        for a sampler that keeps proposing invalid or measured ones), shuffled."""
        configs = [c for c in self.valid_configs if config_id(c) not in known]
        random.Random(self.seed).shuffle(configs)
        yield from configs

    # -- the winner --------------------------------------------------------------------------
    def runs(self, config: KernelConfig) -> bool:
        """Whether `config` may run on the key's problem: in its space and valid (a config
        seeded from elsewhere may not be: a neighbour's winner, or a candidate with more rows
        than M)."""
        return self.spec.rejects(self.problem, config) is None

    def in_space(self, config: KernelConfig) -> bool:
        """Whether each parameter of `config` is one of the space's choices (exact type and
        value), whatever the constraints say."""
        for name, choices in self.space.items():
            value = getattr(config, name)
            if not any(type(value) is type(choice) and value == choice for choice in choices):
                return False
        return True

    def config_of(self, data: Mapping[str, Any]) -> KernelConfig:
        """The typed config of a trial's params or a recorded config (JSON), as this code reads
        it (`KernelSpec.upgrade`); ValueError where it cannot. Whether it may run here is
        `runs`'s to say."""
        return self.spec.config_type.from_json(self.spec.upgrade(self.problem, data))

    def _completed(self, study: optuna.Study) -> list[tuple[FrozenTrial, KernelConfig]]:
        """The study's completed trials with a time, each with its config, fastest first (ties
        in the canonical order); a trial whose params this code cannot read is left out."""
        complete = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.value is None:
                continue
            try:
                complete.append((t, self.config_of(t.params)))
            except ValueError:
                continue
        return sorted(complete, key=lambda tc: (tc[0].value, self.order(tc[1])))

    def finalists(self, study: optuna.Study) -> list[KernelConfig]:
        """The best `retime_top` distinct measured configs within `retime_within` of the best,
        plus the default when it is valid, and the config this key picked when it was last
        tuned: its search time may have been taken by older code or timing, so a new best
        within reach of it proves nothing until both run side by side."""
        complete = self._completed(study)
        chosen: dict[str, KernelConfig] = {}
        for t, config in complete:
            if t.value > complete[0][0].value * (1 + self.job.retime_within):
                break
            chosen.setdefault(config_id(config), config)
            if len(chosen) == self.job.retime_top:
                break
        if chosen and self.spec.valid(self.problem, self.default):
            chosen.setdefault(config_id(self.default), self.default)
        before = self.previous_winner(study)
        if chosen and before is not None and self.runs(before):
            chosen.setdefault(config_id(before), before)
        return sorted(chosen.values(), key=self.order)

    def incumbent(self, study: optuna.Study) -> KernelConfig | None:
        """The config a resumed search polishes first: the last search's pick where it is a
        config of this space, else the fastest measured one; None for a new study."""
        before = self.previous_winner(study)
        if before is not None and self.in_space(before):
            return before
        complete = self._completed(study)
        return complete[0][1] if complete else None

    def previous_winner(self, study: optuna.Study) -> KernelConfig | None:
        """The config the key's last finished search picked (`mark_done` keeps it, and its
        re-timed finalists, which this code reads where it can), or None if it has none."""
        done = study.user_attrs.get("done") or {}
        if done.get("winner"):
            with contextlib.suppress(ValueError):  # recorded under a space this code lacks
                return self.config_of(done["winner"])
        finalists = []
        for f in done.get("finalists") or []:
            if not f["rounds_us"]:
                continue
            try:
                finalists.append(Measured(self.config_of(f["config"]), tuple(f["rounds_us"])))
            except ValueError:  # recorded under a space this code does not have
                continue
        return pick_winner(finalists, self.order).config if finalists else None

    def retime(self, configs: list[KernelConfig], problems: Sequence[Problem] | None = None,
               *, salt: int = 0) -> tuple[list[Measured], dict[str, str]]:
        """Time the finalists round-robin, each round starting one further along (on the key's
        problems, or those given; `salt` sets other inputs apart); a finalist that fails in any
        round (wrong output on new inputs, timeout, crash) drops out."""
        rounds: dict[str, list[float]] = {config_id(c): [] for c in configs}
        failed: dict[str, str] = {}
        for r in range(self.job.retime_rounds):
            live = [c for c in configs if config_id(c) not in failed]
            for i in range(len(live)):
                config = live[(i + r) % len(live)]
                outcome = self.evaluate(config, seed=self.seed + salt + 1_000_000 * (r + 1) + i,
                                        problems=problems)
                if outcome.ok and outcome.median_us is not None:
                    rounds[config_id(config)].append(outcome.median_us)
                else:
                    failed[config_id(config)] = outcome.reason or outcome.status
        results = [Measured(c, tuple(rounds[config_id(c)])) for c in configs
                   if config_id(c) not in failed and rounds[config_id(c)]]
        return results, failed

    def pick(self, state: SearchState, *, env: Env | None, copy_gbps: float | None) -> Pick:
        """Re-time the finalists and build the key's table entry (None when nothing passed)."""
        configs = self.finalists(state.study)
        if not configs:
            return Pick(None, "no candidate passed its check: " + failures(state.study))
        finalists, failed = self.retime(configs)
        if not finalists:
            return Pick(None, "every finalist failed when re-timed: " + "; ".join(
                failed.values()), failed=failed)
        winner = pick_winner(finalists, self.order)
        checked: dict[int, list[Measured]] = {}
        if self.key.rows:
            winner, checked = self.check_at_rows(winner, finalists)
        default = next((f for f in finalists if f.config == self.default), None)
        us = winner.median_us
        bytes_moved = statistics.fmean(
            self.spec.bytes_moved(dataclasses.replace(self.problem, m=rows))
            for rows in self.key.timed_rows())
        gbps = bytes_moved / (us * 1e3)
        entry = Entry(
            kernel=self.key.kernel, dtype=self.key.dtype, n=self.key.n, m=self.key.m,
            config=winner.config.to_json(), us=us, gbps=gbps,
            default_us=default.median_us if default is not None else us,
            trials=state.counted, kernel_hash=self.spec.kernel_hash,
            frac_copy=gbps / copy_gbps if copy_gbps else None,
            default_config=self.default.to_json(), env=env,
        )
        why = None if default is not None else "the default config did not run; default_us = us"
        return Pick(entry, why, finalists, failed, checked, self.key.timed_rows())

    def check_at_rows(self, winner: Measured, finalists: list[Measured]
                      ) -> tuple[Measured, dict[int, list[Measured]]]:
        """The winner checked at the fewest rows the key's calls have (where it was timed at
        more than one row count), re-timed there beside the runner-up and the default
        (`holds_at`); where it does not hold, those re-timed at each other timed row count too,
        and the one that does best over them taken (`best_over_rows`; the winner where none ran
        at every row count). Returns the finalist taken and the contenders' times by row
        count."""
        others = sorted((f for f in finalists if f.config != winner.config),
                        key=lambda f: (f.median_us, self.order(f.config)))
        contenders = [winner.config, *(f.config for f in others[:1])]
        if self.default != winner.config and any(f.config == self.default for f in finalists):
            contenders.append(self.default)
        contenders = list(dict.fromkeys(contenders))
        rows = self.key.timed_rows()
        if len(contenders) < 2 or len(rows) < 2:  # one row count: the re-timing was the check
            return winner, {}
        served = self.spec.served(self.problem)

        def at(m: int) -> list[Measured]:
            problems = [dataclasses.replace(p, m=m) for p in served]
            return self.retime(contenders, problems, salt=7_000_000 + m)[0]

        checked = {rows[0]: at(rows[0])}
        if holds_at(winner.config, checked[rows[0]]):
            return winner, checked
        checked |= {m: at(m) for m in rows[1:]}
        best = best_over_rows(checked, self.order)
        return next((f for f in finalists if f.config == best), winner), checked


def failures(study: optuna.Study, most: int = 3, width: int = 300) -> str:
    """Why a study's candidates failed: each reason once (cut to `width` characters), the most
    frequent first, with its count where it recurs; `most` of them."""
    reasons = Counter(str(t.user_attrs.get("reason") or outcome_of(t))[:width]
                      for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)))
    listed = [f"{n} x {r}" if n > 1 else r for r, n in reasons.most_common(most)]
    if len(reasons) > most:
        listed.append(f"{len(reasons) - most} more")
    return "; ".join(listed) or "none measured"


@dataclass
class Pick:
    """The outcome of a key: its entry, and the re-timed finalists it was chosen from."""

    entry: Entry | None
    reason: str | None = None
    finalists: list[Measured] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: The contenders re-timed at the key's recorded row counts, by row count
    #: (`KeySearch.check_at_rows`; empty for a key timed at its bucket's edge).
    checked: dict[int, list[Measured]] = field(default_factory=dict)
    #: The row counts the finalists were timed at (`TuneKey.timed_rows`).
    rows: tuple[int, ...] = ()


def mark_done(study: optuna.Study, state: SearchState, pick: Pick, *, by: str = "",
              started: float | None = None) -> None:
    """Record that the key's search is complete for its budget (what `is_done` reads), with the
    finalists' re-timed rounds the winner was picked from, the winner, the row counts they were
    timed at and the check at the recorded ones, who tuned it (`by`: lane and GPU) and when it
    started."""
    study.set_user_attr("done", {
        "budget": state.budget, "trials": state.counted, "at": time.time(), "by": by,
        "started": started,
        "us": None if pick.entry is None else pick.entry.us, "no_result": pick.entry is None,
        "reason": pick.reason,
        "finalists": [{"config": f.config.to_json(), "rounds_us": list(f.rounds_us)}
                      for f in pick.finalists],
        "failed_finalists": pick.failed,
        "winner": None if pick.entry is None else pick.entry.config,
        "rows": list(pick.rows),
        "checked_at_rows": {str(m): [{"config": f.config.to_json(), "rounds_us": list(f.rounds_us)}
                                     for f in timed] for m, timed in pick.checked.items()},
    })


def _finish_waiting(storage: optuna.storages.BaseStorage, name: str, run: FrozenTrial) -> None:
    """Record in the stored study's waiting trial of the same number what became of it in a
    working copy."""
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(name), run.number)
    storage.set_trial_state_values(trial_id, TrialState.RUNNING)
    for name, value in run.params.items():
        dist = run.distributions[name]
        storage.set_trial_param(trial_id, name, dist.to_internal_repr(value), dist)
    for key, value in run.user_attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    storage.set_trial_state_values(trial_id, run.state, run.values)


def done_info(storage: optuna.storages.BaseStorage, name: str) -> dict[str, Any] | None:
    """The study's "done" record, or None when the study is missing or unfinished."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    return storage.get_study_user_attrs(study_id).get("done")
