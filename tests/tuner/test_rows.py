"""Keys tuned at the row counts their calls have: timed at a spread of the recorded rows, the
pick checked at the fewest of them beside the runner-up and the default, and replaced by the
contender that does best over the rows where it loses there beyond noise."""

from __future__ import annotations

import dataclasses
import statistics

import optuna
import pytest
from typer.testing import CliRunner

from kerneltune.cli import app
from kerneltune.kernels import REGISTRY, KernelConfig
from kerneltune.runtime import local, record
from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner import search
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.runner import JobRunner
from kerneltune.tuner.search import study_name, timed_problems
from kerneltune.tuner.select import Measured, best_over_rows, canonical_order, holds_at

# ------------------------------------------------------------------ the choosing functions


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class Rows(KernelConfig):
    ROWS: int


SPACE = {"ROWS": [1, 2, 4, 8]}
DEFAULT = Rows(ROWS=1)
ORDER = canonical_order(SPACE, DEFAULT)
PICK, RUNNER_UP = Rows(ROWS=8), Rows(ROWS=4)


def at(config: KernelConfig, *rounds: float) -> Measured:
    return Measured(config, tuple(rounds))


def test_a_pick_no_slower_at_the_fewest_rows_holds():
    assert holds_at(PICK, [at(PICK, 10.0, 10.0), at(DEFAULT, 12.0, 12.1), at(RUNNER_UP, 11, 11)])
    # faster by less than the noise, or than 1%: a tie, which the pick keeps
    assert holds_at(PICK, [at(PICK, 10.0, 10.05), at(DEFAULT, 9.95, 9.96)])
    assert holds_at(PICK, [at(PICK, 10.0, 9.0, 11.0), at(DEFAULT, 9.5, 9.5, 9.5)])


def test_a_pick_slower_at_the_fewest_rows_beyond_noise_does_not_hold():
    assert not holds_at(PICK, [at(PICK, 12.0, 12.1), at(DEFAULT, 10.0, 10.1)])
    assert not holds_at(PICK, [at(PICK, 12.0, 12.1), at(DEFAULT, 13.0), at(RUNNER_UP, 10.0)])
    assert not holds_at(PICK, [at(DEFAULT, 10.0)])  # it did not run there


def test_the_contender_best_over_the_rows_takes_the_key():
    # the pick wins the mean over the rows (the large row count dominates it) but runs the
    # fewest rows 1.4x slower; the default is 5% behind at the most rows: each row count
    # weighing alike, the default does best
    timed = {
        1500: [at(PICK, 14.0), at(RUNNER_UP, 12.0), at(DEFAULT, 10.0)],
        1800: [at(PICK, 12.0), at(RUNNER_UP, 12.0), at(DEFAULT, 12.2)],
        2048: [at(PICK, 100.0), at(RUNNER_UP, 108.0), at(DEFAULT, 105.0)],
    }
    assert statistics.fmean(f.median_us for row in timed.values() for f in row
                            if f.config == PICK) < statistics.fmean(
        f.median_us for row in timed.values() for f in row if f.config == DEFAULT)
    assert best_over_rows(timed, ORDER) == DEFAULT
    # whatever the order they come in
    assert best_over_rows({m: row[::-1] for m, row in reversed(timed.items())}, ORDER) == DEFAULT


def test_ties_over_the_rows_go_to_the_first_in_the_order():
    timed = {3: [at(PICK, 10.0), at(RUNNER_UP, 10.05)], 4: [at(PICK, 20.0), at(RUNNER_UP, 20.0)]}
    assert best_over_rows(timed, ORDER) == RUNNER_UP  # ROWS=4 comes before ROWS=8


def test_only_contenders_measured_at_every_row_count_compete():
    timed = {3: [at(PICK, 10.0), at(DEFAULT, 5.0)], 4: [at(PICK, 20.0)]}
    assert best_over_rows(timed, ORDER) == PICK
    assert best_over_rows({3: [at(PICK, 1.0)], 4: [at(DEFAULT, 1.0)]}, ORDER) is None
    assert best_over_rows({}, ORDER) is None


# -------------------------------------------------------------------------- the tune job


def test_a_key_is_timed_at_a_spread_of_its_recorded_rows_else_at_its_bucket():
    spec = REGISTRY["rmsnorm_fwd"]
    key = TuneKey("GPU", "rmsnorm_fwd", "float32", 16, 8, "rmsnorm_fwd", (5, 6, 7, 8))
    assert key.timed_rows() == (5, 7, 8)
    assert [p.m for p in timed_problems(key, spec)] == [5, 7, 8]
    assert [p.m for p in timed_problems(dataclasses.replace(key, rows=()), spec)] == [8]
    quant = REGISTRY["rmsnorm_quant_fwd"]
    qkey = TuneKey("GPU", "rmsnorm_quant_fwd", "float32", 16, 8, "rmsnorm_quant_fwd", (6,))
    served = quant.served(qkey.problem())
    assert timed_problems(qkey, quant) == [dataclasses.replace(p, m=6) for p in served]
    # rows outside a key's bucket are not its calls'
    job = Job(kernels=["rmsnorm_fwd"], ns=[16], dtypes=["float32"], m_buckets=[8],
              rows={("rmsnorm_fwd", "float32", 16, 8): [3, 9, 6, 5, 6]})
    (only,) = job.keys("GPU")
    assert only.rows == (5, 6)


@pytest.mark.parametrize("holds", [None, False])
def test_a_job_times_a_key_at_its_rows_and_checks_its_pick_at_the_fewest(tmp_path, monkeypatch,
                                                                        holds):
    """The check runs; and, with the pick made to lose at the fewest rows (the interpreter's
    times say nothing of a GPU's), the contenders are re-timed at every timed row count and the
    key goes to one of them."""
    if holds is not None:
        monkeypatch.setattr(search, "holds_at", lambda *args, **kwargs: holds)
    key = ("rmsnorm_fwd", "float32", 16, 8)
    job = Job(kernels=["rmsnorm_fwd"], ns=[16], dtypes=["float32"], m_buckets=[8], only=[key],
              rows={key: [5, 6, 8]}, trials=3, retime_rounds=1, retime_within=100.0)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    report = JobRunner(job, url).run()
    (done,) = report.keys
    assert done.status == "tuned", done.reason
    spec = REGISTRY["rmsnorm_fwd"]
    study = optuna.load_study(study_name=study_name(done.key, spec.kernel_hash), storage=url)
    record = study.user_attrs["done"]
    assert record["rows"] == [5, 6, 8]
    finalists = [f["config"] for f in record["finalists"]]
    assert len(finalists) >= 2
    contenders = record["checked_at_rows"]["5"]
    assert len(contenders) >= 2 and all(len(c["rounds_us"]) == 1 for c in contenders)
    assert {tuple(sorted(c["config"].items())) for c in contenders} <= {
        tuple(sorted(f.items())) for f in finalists}
    assert set(record["checked_at_rows"]) <= {"5", "6", "8"}
    if holds is False:
        assert set(record["checked_at_rows"]) == {"5", "6", "8"}
        assert tuple(sorted(done.entry.config.items())) in {
            tuple(sorted(c["config"].items())) for c in contenders}
    assert record["winner"] == done.entry.config
    entry = done.entry
    bytes_moved = statistics.fmean(spec.bytes_moved(spec.problem(m, 16, "float32"))
                                   for m in (5, 6, 8))
    assert abs(entry.gbps - bytes_moved / (entry.us * 1e3)) < 1e-9 * entry.gbps
    assert report.device == INTERPRETER_DEVICE


def test_from_misses_tunes_a_key_at_its_recorded_rows(tmp_path):
    key = ("rmsnorm_fwd", "float32", 16, 8)
    note = record.Miss(*key, processes=3, rows=[7, 5, 6], match="default", source="default",
                       first_seen=1.0, last_seen=1.0)
    record.write(local.misses_path(INTERPRETER_DEVICE), INTERPRETER_DEVICE, {key: note})
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = CliRunner().invoke(app, ["tune", "--from-misses", "--trials", "2", "--retime-rounds",
                                      "1", "--no-progress", "--db", url])
    assert result.exit_code == 0, result.output
    spec = REGISTRY["rmsnorm_fwd"]
    study = optuna.load_study(storage=url, study_name=study_name(
        TuneKey(INTERPRETER_DEVICE, *key), spec.kernel_hash))
    assert study.user_attrs["done"]["rows"] == [5, 6, 7]
