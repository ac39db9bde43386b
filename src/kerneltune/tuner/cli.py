"""`kerneltune tune`, `export`, `import` and `merge`; `tables` (the machine's own tables, which
tune, import and merge refresh) and `misses` (the keys the runtime met untuned here).

This module is imported whenever the `kerneltune` command starts, so everything heavy (torch,
Optuna, SQLAlchemy) is imported inside the commands.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kerneltune._store_errors import store_errors
from kerneltune.tuner.protocol import TIMING_MS  # light: the standard library alone

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from optuna.trial import FrozenTrial
    from rich.console import Console

    from kerneltune.runtime.record import Miss
    from kerneltune.table import ConfigValue
    from kerneltune.tuner.job import Job, TuneKey
    from kerneltune.tuner.runner import JobReport, KeyReport

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", "--db", envvar="KERNELTUNE_DATABASE_URL", show_envvar=True,
        help="SQLAlchemy URL of the store (results and Optuna studies) "
        "(default: an SQLite file in the user's data directory).",
    ),
]

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def default_precompile(workers: int) -> int:
    """Compile processes per worker: none under the interpreter (nothing to compile), else the
    CPUs shared out among the workers, at most 8."""
    from kerneltune.tuner.runner import interpreter_only

    if interpreter_only():
        return 0
    return max(1, min(8, (os.cpu_count() or 2) // workers - 1))


def tune(
    preset: Annotated[list[str], typer.Option(
        "--preset", "-p", help="Model family whose sizes to tune (repeatable), e.g. llama3-8b, "
        "qwen2.5-7b, common, all; see --list-presets.")] = [],  # noqa: B006 - typer's way
    kernel: Annotated[list[str], typer.Option(
        "--kernel", "-k", help="Kernel name, or 'module:attr' of a KernelSpec (repeatable) "
        "(default: every registered kernel).")] = [],  # noqa: B006
    dtype: Annotated[list[str], typer.Option(
        "--dtype", "-d", help="float32, float16 or bfloat16 (repeatable; default: bfloat16).")
    ] = [],  # noqa: B006
    n: Annotated[list[int], typer.Option(
        "--n", "-n", help="Hidden size (repeatable), added to the presets' sizes.")] = [],  # noqa: B006
    m: Annotated[list[int], typer.Option(
        "--m", "-m", help="Row count, rounded up to its power-of-two bucket (repeatable) "
        "(default: every bucket 1..65536).")] = [],  # noqa: B006
    trials: Annotated[int, typer.Option(
        help="Measured candidates per key (0 with --sampler brute: the whole space).")] = 40,
    sampler: Annotated[str, typer.Option(help="tpe, brute or random.")] = "tpe",
    workers: Annotated[int, typer.Option(
        min=1, help="Benchmark worker processes: one per visible GPU (interpreter workers on "
        "a CPU).")] = 1,
    database_url: DatabaseUrl = None,
    time_budget: Annotated[float | None, typer.Option(
        help="Seconds for the whole job; unfinished keys resume on the next run.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the samplers and of the inputs.")] = 0,
    compile_timeout: Annotated[float, typer.Option(
        help="Seconds a candidate may take to build inputs, compile and run once.")] = 180.0,
    run_timeout: Annotated[float, typer.Option(
        help="Seconds a candidate may take to be checked and timed.")] = 60.0,
    retime_rounds: Annotated[int, typer.Option(
        min=1, help="Interleaved rounds when re-timing the finalists.")] = 3,
    retime_within: Annotated[float, typer.Option(
        min=0.0, help="Re-time runners-up only within this fraction of the best search time "
        "(the default config always).")] = 0.08,
    timing_ms: Annotated[float, typer.Option(
        min=0.1, help="GPU milliseconds of graph replays per candidate timing (at least 10 "
        "replays).")] = TIMING_MS,
    precompile: Annotated[int | None, typer.Option(
        min=0, help="Processes per worker compiling each batch of candidates ahead of timing "
        "(default: the CPUs shared out among the workers, at most 8; none under the "
        "interpreter).")] = None,
    batch: Annotated[int | None, typer.Option(
        min=1, help="Candidates asked of the sampler at a time (default: as many as "
        "--precompile processes, else 1).")] = None,
    device: Annotated[str | None, typer.Option(
        help="File results under this device name (default: the worker's GPU model).")] = None,
    seed_table: Annotated[list[Path], typer.Option(
        "--seed-table", help="A tuned table (e.g. another GPU's) whose config for each key is "
        "tried right after the default (repeatable).")] = [],  # noqa: B006
    keys: Annotated[Path | None, typer.Option(
        "--keys", exists=True, dir_okay=False, help='Tune these keys alone, listed in a JSON '
        'file: [{"kernel": ..., "n": ..., "m": ..., "dtype": ...}, ...] (dtype: bfloat16 where '
        'absent), in place of -k, -d, -n, -m and -p. With more --trials than a key has '
        'measured, its search goes on.')] = None,
    from_misses: Annotated[bool, typer.Option(
        "--from-misses", help="Tune the keys the runtime recorded as untuned on this machine's "
        "GPU (or --device's; see `kerneltune misses`), at their recorded M buckets and row "
        "counts, in place of -k, -d, -n, -m, -p and --keys.")] = False,
    follow: Annotated[str | None, typer.Option(
        "--follow", metavar="URL", help="Work for the config service at URL: tune the keys its "
        "runtimes reported untuned on this machine's GPU (or --device's), the most-met first, "
        "at their reported row counts, publish each round's entries with --token, and go on "
        "(Ctrl-C stops), in place of -k, -d, -n, -m, -p, --keys and --from-misses.")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", envvar="KERNELTUNE_WRITE_TOKEN", help="The service's write token, for "
        "--follow.")] = None,
    once: Annotated[bool, typer.Option(
        "--once", help="With --follow: tune what is queued now, publish it, then exit.")] = False,
    pause: Annotated[float, typer.Option(
        min=0.0, help="With --follow: seconds between looks when nothing is queued.")] = 30.0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    as_json: JsonOption = False,
    list_presets: Annotated[bool, typer.Option(
        "--list-presets", help="List the presets and their sizes, then exit.")] = False,
) -> None:
    """Tune kernels per (device, kernel, dtype, N, M bucket) and store the best configs.

    Interrupted jobs resume; processes and hosts on one PostgreSQL URL share the keys. The
    results then refresh this machine's own table for the device (`kerneltune tables`), which
    the runtime reads. With --follow URL, a fleet's tuning worker: the keys its runtimes
    reported untuned, tuned and published, round after round. With --json, each job's report
    (its device, status and every key's outcome and entry) is printed as one JSON line in
    place of the table.
    """
    from rich.console import Console

    from kerneltune.table import m_bucket
    from kerneltune.tuner.job import M_BUCKETS, PRESETS, Job, preset_sizes, read_keys, resolve_spec

    console = Console(stderr=True)
    if list_presets:
        for name, sizes in PRESETS.items():
            typer.echo(f"{name:18} {' '.join(map(str, sizes))}")
        return
    from kerneltune.kernels import REGISTRY

    compilers = default_precompile(workers) if precompile is None else precompile

    def make_job(kernels: list[str], dtypes: list[str], ns: list[int], ms: list[int],
                 only: list[tuple[str, str, int, int]],
                 rows: Mapping[tuple[str, str, int, int], Sequence[int]]) -> Job:
        return Job(
            kernels=kernels or sorted(REGISTRY), ns=[*preset_sizes(preset), *ns],
            dtypes=dtypes or ["bfloat16"],
            m_buckets=sorted({m_bucket(v) for v in ms}) if ms else M_BUCKETS, only=only,
            rows=rows, trials=trials, sampler=sampler, seed=seed, time_budget_s=time_budget,
            compile_timeout_s=compile_timeout, run_timeout_s=run_timeout,
            retime_rounds=retime_rounds, retime_within=retime_within, timing_ms=timing_ms,
            device=device, seed_tables=[str(p) for p in seed_table],
            precompile=compilers, batch=batch or max(1, compilers),
        )

    def listed_job(listed: list[tuple[str, str, int, int]],
                   rows: Mapping[tuple[str, str, int, int], Sequence[int]]) -> Job:
        """The job of these keys alone (kernel name or reference, dtype, N, M bucket)."""
        only = [(resolve_spec(k).name, d, nn, mm) for k, d, nn, mm in listed]
        return make_job(sorted({k for k, _, _, _ in listed}), sorted({d for _, d, _, _ in listed}),
                        sorted({v for _, _, v, _ in listed}), sorted({v for *_, v in listed}),
                        only, {(resolve_spec(k).name, d, nn, mm): r
                               for (k, d, nn, mm), r in rows.items()})

    try:
        if follow is not None and (keys is not None or from_misses or kernel or dtype or n or m
                                   or preset):
            raise ValueError("--follow takes its keys from the service: give it without -k, -d, "
                             "-n, -m, -p, --keys or --from-misses")
        if once and follow is None:
            raise ValueError("--once goes with --follow URL")
        if follow is not None:
            if not token:
                raise ValueError("--follow publishes results: give the service's write token "
                                 "with --token or KERNELTUNE_WRITE_TOKEN")
            # a job of one key checks the options before the service is asked
            job = make_job(sorted(REGISTRY)[:1], [], [1], [], [], {})
        else:
            if from_misses and (keys is not None or kernel or dtype or n or m or preset):
                raise ValueError("--from-misses lists the keys: give it without -k, -d, -n, "
                                 "-m, -p or --keys")
            recorded = _recorded_keys(device) if from_misses else None
            if from_misses and not recorded:
                typer.echo("no untuned keys recorded for this GPU: nothing to tune", err=True)
                return
            if recorded:
                job = listed_job([k.key for k in recorded], {k.key: k.rows for k in recorded})
            elif keys is not None:
                if kernel or dtype or n or m or preset:
                    raise ValueError("--keys lists the keys: give it without -k, -d, -n, -m or "
                                     "-p")
                job = listed_job(read_keys(keys.read_text()), {})
            else:
                job = make_job(kernel, dtype, n, m, [], {})
        job.specs()
        job.seed_configs()
    except (ValueError, OSError) as e:  # TableError is a ValueError
        raise typer.BadParameter(str(e)) from e

    from kerneltune.storage import default_database_url

    url = database_url or default_database_url()

    def run_job(job: Job) -> JobReport:
        """Run `job` with the progress bar, show its summary and refresh the local table."""
        from kerneltune.tuner.runner import JobRunner

        resume = "; keys tuned before stay stored, and the same command resumes once it answers"
        with store_errors(url, then=resume), _RichProgress(console, enabled=progress) as bar:
            report = JobRunner(job, url, workers=workers, progress=bar).run()
        if as_json:
            typer.echo(json.dumps(report_to_dict(report)))
        else:
            out = Console()
            _summary(out if out.is_terminal else Console(width=200), report)  # logs: whole rows
        with store_errors(url):
            _refresh_local(url, [report.device])
        return report

    if follow is not None:
        _follow(follow, token or "", device or _this_device(), url, listed_job, run_job,
                console, once=once, pause_s=pause)
        return
    report = run_job(job)
    if report.status == "failed":
        raise typer.Exit(1)
    if report.status != "done":
        console.print("[yellow]not finished: run the same command again to resume[/]")
        raise typer.Exit(2)


def _follow(base: str, token: str, device: str, url: str,
            listed_job: Callable[..., Job], run_job: Callable[[Job], JobReport],
            console: Console, *, once: bool, pause_s: float) -> None:
    """`tune --follow`: a `Follower` whose rounds are tune jobs of the queued keys at their
    reported row counts (`listed_job`, `run_job`); its errors, one line and exit status 1.
    Ctrl-C in a round stops the job as it stops `tune`: what is finished is published, and the
    exit status is 2 (not finished); Ctrl-C while it waits, exit status 130."""
    from kerneltune.storage import MissReport
    from kerneltune.tuner.follow import Follower, FollowError, Service

    failed = False

    def tune_round(queued: list[MissReport]) -> bool:
        nonlocal failed
        console.print(f"tuning {len(queued)} keys the fleet met untuned on {device}: "
                      + ", ".join(f"{q} (met by {q.processes} process"
                                  f"{'es' if q.processes != 1 else ''})" for q in queued),
                      highlight=False)
        job = listed_job([q.key for q in queued], {q.key: q.rows for q in queued})
        job.device = device
        report = run_job(job)
        failed = failed or report.status == "failed"
        return report.status == "done"

    follower = Follower(Service(base, token), device, tune_round, url,
                        say=lambda line: console.print(line, highlight=False),
                        once=once, pause_s=pause_s)
    try:
        with store_errors(url):
            follower.run()
    except FollowError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        follower.stop.set()
        typer.echo("stopped", err=True)
        raise typer.Exit(130) from None
    if failed:
        raise typer.Exit(1)
    if follower.stop.is_set():
        console.print("[yellow]not finished: run the same command again to go on[/]")
        raise typer.Exit(2)


def export(
    device: Annotated[str | None, typer.Option(
        help="GPU model name as stored (default: this machine's device).")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="File to write (default: standard output).")] = None,
    database_url: DatabaseUrl = None,
    current: Annotated[bool, typer.Option(
        "--current", help="Only the entries tuned on the running kernel code (a table to ship: "
        "the runtime never uses a stale one).")] = False,
) -> None:
    """Write a device's tuned table as JSON (the format the runtime and the service read)."""
    from kerneltune import storage, table

    if device is None:
        from kerneltune.env import device_name

        device = device_name()
    with store_errors(database_url):
        engine = storage.make_engine(database_url)
        try:
            storage.migrate(engine)
            with storage.session_factory(engine)() as session:
                tuned = storage.export_table(session, device)
        except storage.UnknownDeviceError:
            typer.echo(f"no results for device {device!r}", err=True)
            raise typer.Exit(1) from None
        finally:
            engine.dispose()
    if current:
        from kerneltune.kernels import current_entries

        tuned = current_entries(tuned)
    if output is None:
        sys.stdout.write(table.dumps(tuned))
    else:
        table.save(tuned, output)
        typer.echo(f"{output}: {len(tuned.entries)} entries for {device}", err=True)


def import_tables(
    files: Annotated[list[Path], typer.Argument(
        exists=True, dir_okay=False, help="Table JSON files (e.g. from `kerneltune export`).")],
    database_url: DatabaseUrl = None,
) -> None:
    """Store the entries of tuned tables; a faster stored result of the same kernel code is
    kept, and an entry of other code than the running one never replaces a result.

    All or nothing: every file is read and every entry checked before any is stored. A file
    that is not a table, or any entry whose kernel is unknown or whose config its kernel
    refuses at the entry's own key (a parameter outside the space, of the wrong type, missing
    or unknown; the constraints broken), is listed, one line each with why, nothing is
    stored, and the exit status is 1. What the store then holds for each table's GPU refreshes
    this machine's own table for it (`kerneltune tables`)."""
    from kerneltune import storage, table
    from kerneltune.kernels import REGISTRY, running_hashes
    from kerneltune.resolution import entry_named, refused_entries

    try:
        tables = [(f, table.load(f)) for f in files]  # all valid before any is stored
    except table.TableError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    refused = [f"{path}: entries[{i}] ({entry_named(e)}): {why}"
               for path, tuned in tables for i, e, why in refused_entries(tuned.entries, REGISTRY)]
    if refused:
        for line in refused:
            typer.echo(line, err=True)
        typer.echo(f"{len(refused)} entries refused; nothing imported", err=True)
        raise typer.Exit(1)
    with store_errors(database_url):
        engine = storage.make_engine(database_url)
        try:
            storage.migrate(engine)
            session_maker = storage.session_factory(engine)
            for path, tuned in tables:
                with session_maker.begin() as session:
                    changed = storage.import_table(session, tuned, running_hashes())
                typer.echo(f"{path}: {changed} of {len(tuned.entries)} entries stored for "
                           f"{tuned.device}")
        finally:
            engine.dispose()
        _refresh_local(database_url, [tuned.device for _, tuned in tables])


def merge(
    source: Annotated[str, typer.Argument(
        help="The store to merge in: an SQLAlchemy URL, or the path of an SQLite file.")],
    database_url: DatabaseUrl = None,
) -> None:
    """Merge another store into this one: the trials of its searches that this one lacks, and
    its results as `import` stores them (a workers' store that could not share this one).

    Exits 2 where a study of both stores could not take the other's trials, or where a result
    is refused (an unknown kernel, or a config its kernel refuses at the result's own key, as
    `import` refuses it): each is named, one line with why; the rest is merged. What this store
    then holds for the merged GPUs refreshes this machine's own tables (`kerneltune tables`)."""
    from kerneltune.kernels import running_hashes
    from kerneltune.storage import default_database_url, normalize_url
    from kerneltune.tuner.merge import merge_stores, same_store

    source_url = source if "://" in source else f"sqlite:///{Path(source).resolve()}"
    parsed = normalize_url(source_url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        typer.echo(f"no store at {source}: {parsed.database} is not a file", err=True)
        raise typer.Exit(1)
    target = database_url or default_database_url()
    if same_store(source_url, target):
        typer.echo(f"{source} is the store to merge into", err=True)
        raise typer.Exit(1)
    with store_errors(source_url, target):
        report = merge_stores(source_url, target, running_hashes())
        _refresh_local(target, report.devices)
    typer.echo(f"studies: {report.studies_copied} copied, {report.studies_extended} extended by "
               f"{report.trials_added} trials; results: {report.results_stored} of "
               f"{report.results_read} stored")
    for name, why in report.studies_skipped.items():
        typer.echo(f"skipped {name}: {why}", err=True)
    for line in report.results_refused:
        typer.echo(f"refused {line}", err=True)
    if report.results_refused:
        typer.echo(f"{len(report.results_refused)} results refused; the others were merged",
                   err=True)
    if report.studies_skipped or report.results_refused:
        raise typer.Exit(2)


def tables(
    remove: Annotated[str | None, typer.Option(
        "--remove", metavar="GPU", help="Delete this GPU's local table (its name as listed, or "
        "its file name).")] = None,
) -> None:
    """List this machine's own tuned tables, one per GPU, or remove one.

    They live in the data directory (KERNELTUNE_DATA_DIR, default ~/.local/share/kerneltune);
    every tune job, import and merge refreshes them, and the runtime reads them after
    KERNELTUNE_TABLE."""
    from kerneltune.runtime import local

    if remove is not None:
        try:
            removed = local.remove_table(remove)
        except ValueError as e:  # a name with no letters or digits
            raise typer.BadParameter(str(e)) from e
        if removed is None:
            typer.echo(f"no local table for {remove!r} in {local.data_dir() / local.TABLES}",
                       err=True)
            raise typer.Exit(1)
        typer.echo(f"removed {removed}")
        return
    from rich.console import Console
    from rich.table import Table

    from kerneltune.kernels import running_hashes

    found = local.local_tables()
    if not found:
        typer.echo(f"no local tables in {local.data_dir() / local.TABLES}")
        return
    running = running_hashes()
    out = Table(title="local tables", show_lines=False)
    for col in ("GPU", "path", "entries", "current"):
        out.add_column(col, justify="right" if col in ("entries", "current") else "left",
                       overflow="fold")
    for t in found:
        if t.table is None:
            out.add_row(t.device, str(t.path), "-", "-", end_section=False)
            continue
        out.add_row(t.device, str(t.path), str(len(t.table.entries)), str(len(t.current(running))))
    console = Console()
    (console if console.is_terminal else Console(width=200)).print(out)
    for t in found:
        if t.error:
            typer.echo(f"{t.path}: unreadable ({t.error})", err=True)


def misses(
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="GPU model name (default: this machine's).")] = None,
    as_json: JsonOption = False,
) -> None:
    """List the keys the runtime met untuned on a GPU, most processes first.

    Those it resolved other than exactly (a nearest shape, another dtype, the default), with the
    row counts met; `kerneltune tune --from-misses` tunes them. Each process that resolved a key
    counts once."""
    from dataclasses import asdict

    from kerneltune.runtime import local, record

    device = gpu or _this_device()
    found = record.read(local.misses_path(device), device).ranked()
    if as_json:
        typer.echo(json.dumps({"device": device, "keys": [asdict(k) for k in found]}, indent=1))
        return
    if not found:
        typer.echo(f"no untuned keys recorded for {device}")
        return
    from rich.console import Console
    from rich.table import Table

    out = Table(title=f"{device}: keys met untuned")
    for col in ("kernel", "dtype", "N", "M bucket", "processes", "rows", "resolved as"):
        out.add_column(col, justify="right" if col in ("N", "M bucket", "processes") else "left")
    for k in found:
        out.add_row(k.kernel, k.dtype, str(k.n), str(k.m), str(k.processes),
                    " ".join(map(str, k.rows)), f"{k.match} ({k.source})")
    console = Console()
    (console if console.is_terminal else Console(width=200)).print(out)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
    app.command("export")(export)
    app.command("import")(import_tables)
    app.command("merge")(merge)
    app.command("tables")(tables)
    app.command("misses")(misses)


# ------------------------------------------------------------------------ the local tables


def _this_device() -> str:
    from kerneltune.env import device_name

    return device_name()


def _recorded_keys(device: str | None) -> list[Miss]:
    """The keys recorded untuned on `device` (default: this machine's GPU) whose kernel is
    registered, most processes first, with their row counts."""
    from kerneltune.kernels import REGISTRY
    from kerneltune.runtime import local, record

    device = device or _this_device()
    found = record.read(local.misses_path(device), device).ranked()
    for k in found:
        if k.kernel not in REGISTRY:
            typer.echo(f"skipping {k.kernel} {k.dtype} n={k.n} m={k.m}: not a registered kernel",
                       err=True)
    return [k for k in found if k.kernel in REGISTRY]


def _refresh_local(url: str | None, devices: list[str]) -> None:
    """Bring the store's results for `devices` into the machine's own tables, one line each; a
    data directory that cannot be written is said, and fails nothing (the store holds them)."""
    from kerneltune.tuner.merge import refresh_local_tables

    try:
        done = refresh_local_tables(url, devices)
    except (OSError, TimeoutError) as e:
        typer.echo(f"local table not refreshed: {e}", err=True)
        return
    for r in done:
        typer.echo(f"local table {r.path}: {r.written} entries written, {r.entries} in all "
                   f"for {r.device}", err=True)


# ------------------------------------------------------------------------------- display


def _short(key: TuneKey) -> str:
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(key.dtype, key.dtype)
    return f"{key.kernel} {dtype} n={key.n} m={key.m}"


def _config_text(config: Mapping[str, ConfigValue]) -> str:
    """A table entry's config (its JSON) on one line."""
    return " ".join(f"{k}={v}" for k, v in config.items())


class _RichProgress:
    """The job's progress as a rich progress bar (keys done / total, trials, best so far)."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.enabled = enabled
        self.bar = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("keys · {task.fields[trials]} trials"),
            TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
            console=console, disable=not enabled, transient=False,
        )
        self.task = self.bar.add_task("tuning", total=None, trials=0, status="")
        self._lock = threading.Lock()
        self._trials = 0

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def job_started(self, device: str, keys: list[TuneKey], budget: int) -> None:
        self.bar.update(self.task, total=len(keys), description=f"tuning on {device}")

    def key_started(self, key: TuneKey, lane: int) -> None:
        self.bar.update(self.task, status=f"{_short(key)}")

    def trial_finished(self, key: TuneKey, trial: FrozenTrial, best_us: float | None) -> None:
        with self._lock:
            self._trials += 1
            best = f", best {best_us:.1f} µs" if best_us is not None else ""
            self.bar.update(self.task, trials=self._trials,
                            status=f"{_short(key)}: trial {trial.number}{best}")

    def key_finished(self, report: KeyReport) -> None:
        self.bar.advance(self.task)


def report_to_dict(report: JobReport) -> dict[str, object]:
    """A job's report as `tune --json` prints it: each key's outcome, and its entry as a table
    file holds it (null where none was stored)."""
    from kerneltune.table import entry_to_dict

    return {"device": report.device, "run_id": report.run_id, "status": report.status,
            "keys": [{"kernel": r.key.kernel, "dtype": r.key.dtype, "n": r.key.n, "m": r.key.m,
                      "status": r.status, "reason": r.reason, "trials": r.trials,
                      "pruned": r.pruned, "entry": r.entry and entry_to_dict(r.entry)}
                     for r in report.keys]}


def _summary(console: Console, report: JobReport) -> None:
    from rich.table import Table

    t = Table(title=f"{report.device}: {report.status}", show_lines=False)
    t.add_column("key", no_wrap=True)
    t.add_column("best config")
    for col in ("µs", "GB/s", "× default", "trials"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("status")
    for r in report.keys:
        e = r.entry
        status = r.status + (f" ({r.reason})" if r.reason else "")
        if e is None:
            t.add_row(_short(r.key), "-", "-", "-", "-", str(r.trials), status)
        else:
            t.add_row(_short(r.key), _config_text(e.config), f"{e.us:.2f}", f"{e.gbps:.4g}",
                      f"{e.speedup:.2f}", str(e.trials), status)
    console.print(t)
    console.print(f"{report.count('tuned')} tuned, {report.count('done')} already done, "
                  f"{report.count('failed')} failed, {report.count('incomplete')} incomplete"
                  + (f" · run {report.run_id}" if report.run_id is not None else ""))
