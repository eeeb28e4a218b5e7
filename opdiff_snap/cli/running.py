"""The commands that run jobs and write the history: record, check, upgrade."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..core import limits
from ..core.errors import OpdiffError
from ..core.limits import FlagError, Number
from ..core.safetext import printable
from ..core.verdicts import NOT_FAILING, PRECEDENCE
from .app import (
    FORMAT_OPTION,
    JOBS,
    NON_NEGATIVE,
    POSITIVE,
    TIMEOUT_S,
    diff_thresholds,
    echo,
    executor_option,
    guarded,
    output_file,
    patterns,
    print_table,
    python_option,
    settings_of,
    writing,
)

REPEATS = Number(limits.REPEATS)
BATCH = Number(limits.BATCH)
WARMUP = Number(limits.WARMUP)
SEED_COUNT = Number(limits.SEED_COUNT)


def parse_seed_list(text: str | None) -> list[int] | None:
    """`--seed-list 0,3,7`: the seeds, each once, in the order given (None when not given)."""
    if not text:
        return None
    seeds = []
    for part in (p for p in text.replace(";", ",").split(",") if p.strip()):
        try:
            seeds.append(int(limits.SEED.parse(part)))
        except ValueError as exc:
            raise OpdiffError(f"--seed-list {text!r}: seed {part.strip()!r}: {exc} (seeds are comma-separated, "
                              "e.g. 0,3,7).") from None
    return list(dict.fromkeys(seeds))  # a seed given twice runs once


def _apply(fn, options: list):
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _jobs_and_selection(fn):
    """How jobs run and which (test, seed) pairs: shared by record, check and upgrade."""
    return _apply(fn, [
        click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores)."),
        click.option("--timeout-s", type=TIMEOUT_S, help="Per-job timeout in seconds (>= 0.1)."),
        click.option("--repeats", type=REPEATS, help="Timed calls per job (median reported)."),
        click.option("--warmup", type=WARMUP, help="Untimed warm-up calls per job."),
        click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable."),
        click.option("--tags", multiple=True, help="Only tests with this tag; repeatable."),
        click.option("--seeds", type=SEED_COUNT, help="Use seeds 0..N-1 instead of each test's."),
        click.option("--seed-list", help="Use exactly these seeds, e.g. 0,3,7."),
    ])


def _batch_option(fn):
    return click.option("--batch", type=BATCH, help="Tests one exporter call may compile together, each then "
                        "loaded and run alone (default 16; 1: export each test alone).")(fn)


def _run_options(fn):
    return _jobs_and_selection(_apply(fn, [
        click.option("--in-process", is_flag=True, help="Run jobs in this process (debugging; no isolation)."),
        click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text"),
        click.option("-v", "--verbose", is_flag=True, help="Print every result, passing ones too."),
    ]))


def _opdiff_options(fn):
    """opdiff's own flags, so its users' commands keep working (see README, Coming from opdiff)."""
    for opt in reversed([
        click.option("--backends", "opdiff_backends", metavar="'A;B'",
                     help="opdiff's form of -b: ';'-separated presets."),
        click.option("--skips", "opdiff_skips", metavar="'ID:PRESET;...'",
                     help="Skip these (test id or prefix*, preset or glob) pairs: SKIPPED with the reason."),
        click.option("--backend-overrides-file", type=click.Path(path_type=Path),
                     help="opdiff's per-preset options file (JSON or YAML: {preset: {options}})."),
        click.option("--backend-overrides-json", help="opdiff's per-preset options as inline JSON."),
        click.option("--num-sampled-inputs", type=SEED_COUNT, help="opdiff's name for --seeds."),
    ]):
        fn = opt(fn)
    return fn


def _parse_skips(text: str | None) -> list[tuple[str, str]]:
    out = []
    for token in (t.strip() for t in (text or "").split(";")):
        if not token:
            continue
        tid, sep, preset = (part.strip() for part in token.partition(":"))
        if not sep or not tid or not preset:
            raise OpdiffError(f"--skips '{token}': write TEST_ID:PRESET pairs separated by ';', e.g. "
                              "'conv_*:onnx_cpu_fp16;gelu:*'.")
        out.append((tid, preset))
    return out


def _overrides_source(file: Path | None, inline: str | None):
    """opdiff's --backend-overrides-file/-json as what get_preset accepts (None if absent)."""
    if file is not None and inline is not None:
        raise OpdiffError("give --backend-overrides-file or --backend-overrides-json, not both.")
    if inline is not None:
        return inline
    if file is None:
        return None
    if file.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise OpdiffError(f"--backend-overrides-file {file}: cannot read it as YAML ({exc}).") from None
        return data if data is not None else {}
    return str(file)


def _run_and_report(ctx, runner, fmt, verbose, fail_on_text, junit, label, expecting=None, summary_md=None):
    """Run, print the summary, write JUnit (and for a check the Markdown summary), exit.
    `expecting`: (expectations, path, update) where a check is held to its expectations
    file (cli/expecting.py)."""
    from .output import ProgressDisplay, exit_code, make_console, parse_fail_on, print_summary, report_json, write_junit

    fail_on = parse_fail_on(fail_on_text)
    strict = settings_of(ctx).strict_expectations
    output_file(Path(junit) if junit else None, "--junit")
    if label.startswith("check"):
        from .summary_md import summary_path

        output_file(summary_path(Path(summary_md) if summary_md else None), "--summary-md")
    console = make_console(sys.stderr if fmt == "json" else sys.stdout)
    with ProgressDisplay(console, None, label, verbose) as progress:
        report = runner(progress)
    standing = None
    if expecting is not None:
        from .expecting import judge

        standing = judge(expecting[0], report.results, fail_on)
    if fmt == "json":
        echo(report_json(report))
    else:
        print_summary(console, report, standing=standing)
    out = console if fmt != "json" else make_console(sys.stderr)
    if expecting is not None and expecting[2]:   # --update-expectations: the file first, then the rest
        from .expecting import write_update

        for line in write_update(expecting[0], report.results, fail_on, expecting[1]):
            out.print(line, highlight=False, markup=False)
    if junit:
        try:
            write_junit(report, Path(junit), fail_on, strict)
        except OSError as exc:
            raise OpdiffError(f"--junit {junit}: cannot write it ({exc.strerror}); the run itself is in "
                              f"{report.path}.") from None
    if report.command == "check":
        _write_summary(report, fail_on, standing, summary_md, strict)
    if expecting is None:
        sys.exit(exit_code(report.results, fail_on))
    if expecting[2]:
        sys.exit(0)
    from .expecting import standing_lines, update_command

    assert standing is not None
    for line in standing_lines(standing, strict, update_command()):
        out.print(line, highlight=False, markup=False)
    sys.exit(1 if standing.fails(strict) else 0)


def _write_summary(report, fail_on, standing, given: Path | None, strict: bool) -> None:
    """The Markdown summary into --summary-md (written anew) or GitHub's step summary
    (appended to, as each step of a job does)."""
    from .summary_md import markdown, summary_path

    target = summary_path(given)
    if target is None:
        return
    try:
        with open(target, "w" if given is not None else "a", encoding="utf-8") as f:
            f.write(markdown(report, fail_on, standing, strict=strict))
    except OSError as exc:
        raise OpdiffError(f"cannot write the Markdown summary to {target} ({exc.strerror or exc}); the run itself "
                          f"is in {report.path}.") from None


def _expecting(ctx, path: Path | None, update: bool):
    """(expectations, path, update) for a check: the file given, else the settings' one if
    it exists (else, without --update-expectations, None: no expectations)."""
    from .. import api
    from ..expectations.entries import Expectations

    settings = settings_of(ctx)
    target = Path(path) if path is not None else Path(settings.expectations)
    if target.is_file():
        return api.load_expectations(target), target, update
    if target.exists():
        named = f"--expectations {path}" if path is not None else f"the expectations file {target} ([tool.opdiff])"
        raise OpdiffError(f"{named}: not a regular file (a directory, a pipe or a device?). Give an "
                          "expectations file; to hold a run to none, give an empty file.")
    if path is not None and not update:
        raise OpdiffError(f"--expectations {path}: no such file. Give an existing expectations file, or write "
                          "one from a run with --update-expectations.")
    return (Expectations([], str(target)), target, True) if update else None


@click.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--baseline", default="torch_cpu_fp32", show_default=True, help="Preset that computes the goldens.")
@click.option("--preset-options", help="JSON (string or file) overriding the baseline preset's options.")
@click.option("--force", is_flag=True, help="Re-record goldens that are up to date too.")
@click.option("--fail-on", help="Verdicts that make the exit code 1 (default: BASELINE_FAIL and the like).")
@click.option("--junit", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@_run_options
@_opdiff_options
@executor_option
@click.pass_context
@guarded
def record(ctx, suites, baseline, preset_options, force, fail_on, junit, jobs, timeout_s, repeats, warmup,
           in_process, test_ids, tags, seeds, seed_list, fmt, verbose, opdiff_backends, opdiff_skips,
           backend_overrides_file, backend_overrides_json, num_sampled_inputs) -> None:
    """Record goldens: run the baseline on seeded inputs and store inputs, weights and outputs.

    With no SUITES, records every suite under ./suites. Writes only missing or stale
    goldens unless --force."""
    from .. import api

    if opdiff_backends:
        names = [n.strip() for n in opdiff_backends.split(";") if n.strip()]
        if len(names) != 1:
            raise OpdiffError(f"--backends '{opdiff_backends}': record runs one baseline; give it as "
                              "--baseline PRESET, then `opdiff check -b ...` for the targets.")
        baseline = names[0]
    overrides = _overrides_source(backend_overrides_file, backend_overrides_json)
    if overrides is not None:
        if preset_options:
            raise OpdiffError("give --preset-options or opdiff's --backend-overrides-*, not both.")
        preset_options = overrides
    seeds = _opdiff_seeds(seeds, num_sampled_inputs)
    settings = settings_of(ctx, jobs=jobs, timeout_s=timeout_s, repeats=repeats, warmup=warmup)
    _run_and_report(ctx, lambda listener: api.record(
        list(suites) or None, baseline=baseline, preset_options=preset_options, seeds=seeds,
        seed_list=parse_seed_list(seed_list), test_ids=patterns(test_ids), tags=patterns(tags), force=force,
        skips=_parse_skips(opdiff_skips), in_process=in_process, settings=settings, argv=sys.argv[1:],
        listener=listener),
        fmt, verbose, fail_on, junit, f"record {baseline}")


def _opdiff_seeds(seeds: int | None, num_sampled_inputs: int | None) -> int | None:
    if num_sampled_inputs is not None and seeds is not None and seeds != num_sampled_inputs:
        raise OpdiffError(f"--seeds {seeds} and --num-sampled-inputs {num_sampled_inputs} disagree; give one.")
    return seeds if seeds is not None else num_sampled_inputs


def _preset_options(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, body = value.partition("=")
        if not sep or not name or not body:
            raise OpdiffError(f"--preset-options '{value}': write PRESET=JSON or PRESET=path/to/options.json, "
                              "e.g. onnx_cpu_fp32='{\"opset\": 18}'.")
        out[name] = body
    return out


@click.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("-b", "--backend", "backends", multiple=True,
              help="Target preset; repeatable (see `opdiff list-presets`).")
@click.option("--preset-options", multiple=True, help="PRESET=JSON (string or file path); repeatable.")
@click.option("--atol", type=NON_NEGATIVE, help="Override the absolute tolerance for every comparison.")
@click.option("--rtol", type=NON_NEGATIVE, help="Override the relative tolerance for every comparison.")
@click.option("--baseline-factor", type=NON_NEGATIVE,
              help="Times the baseline's own rounding error a result may differ by (default 4; 0: off).")
@click.option("--precision-factor", type=NON_NEGATIVE,
              help="fp16/bf16: times torch eager's own error at that precision a composite output may reach "
                   "(default 1.75; 0: off).")
@click.option("--resume", "resume", metavar="RUN_ID", help="Finish an interrupted run (see `opdiff runs`).")
@click.option("--no-cache", is_flag=True,
              help="Re-export even when a cached artifact or a cached export/load failure exists.")
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@click.option("--fail-on", help="Comma-separated verdicts that make the exit code 1 (default: all but "
                                + ", ".join(v.value for v in reversed(PRECEDENCE) if v in NOT_FAILING) + ").")
@click.option("--junit", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@click.option("--expectations", "expectations_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The expectations file: results known not to pass (default: expectations.yaml, or "
                   "`expectations` under [tool.opdiff]; none if that file does not exist).")
@click.option("--summary-md", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a Markdown summary here (counts per preset, what needs a look first, the command to "
                   "run next); in GitHub Actions it goes to the job summary without this.")
@click.option("--update-expectations", is_flag=True,
              help="Write this run's failures into the expectations file (keeping reasons written), remove "
                   "entries that pass now, and say what changed; entries of other presets and tests stay.")
@python_option
@click.option("--shard", metavar="K/N", callback=lambda ctx, param, value: _shard(value, ctx, param),
              help="Run the K-th of N shards of the planned jobs (with --run-group).")
@click.option("--run-group", metavar="ID", help="Logical run this run belongs to (the N shards share it).")
@click.option("--require-delegated", is_flag=True,
              help="An op node left off the delegate (ExecuTorch with XNNPACK, CoreML, MPS) fails the result: "
                   "NOT_DELEGATED (per preset: the option require_delegated).")
@_batch_option
@_run_options
@_opdiff_options
@executor_option
@click.pass_context
@guarded
def check(ctx, suites, backends, preset_options, atol, rtol, baseline_factor, precision_factor, resume, no_cache,
          trust_goldens, fail_on, junit, expectations_path, summary_md, update_expectations, python, shard,
          run_group,
          require_delegated, batch, jobs,
          timeout_s, repeats, warmup, in_process, test_ids, tags, seeds, seed_list, fmt, verbose,
          opdiff_backends, opdiff_skips, backend_overrides_file, backend_overrides_json,
          num_sampled_inputs) -> None:
    """Check goldens on target presets: exactly the stored inputs and weights, compared
    with tolerances; one JSONL history file per run in ./store.

    Exit 0 when nothing failed, 1 when a --fail-on verdict occurred, 2 on input errors. With
    an expectations file: 1 only for a failure it does not expect (or expects otherwise),
    or an expected failure that now passes (strict_expectations)."""
    from .. import api

    backends = list(backends) + [n.strip() for n in (opdiff_backends or "").split(";") if n.strip()]
    if not backends:
        raise OpdiffError("check needs a target: -b PRESET (repeatable) or --backends 'A;B' "
                          "(see `opdiff list-presets`).")
    options = _preset_options(preset_options)
    overrides = _overrides_source(backend_overrides_file, backend_overrides_json)
    if overrides is not None:
        if options:
            raise OpdiffError("give --preset-options or opdiff's --backend-overrides-*, not both.")
        options = {name: overrides for name in backends}
    seeds = _opdiff_seeds(seeds, num_sampled_inputs)
    from ..suite.model import Tolerance

    given = (atol, rtol, baseline_factor, precision_factor)
    tol = Tolerance(*given) if any(v is not None for v in given) else None
    settings = settings_of(ctx, jobs=jobs, timeout_s=timeout_s, repeats=repeats, warmup=warmup, batch=batch)
    expecting = _expecting(ctx, expectations_path, update_expectations)
    _run_and_report(ctx, lambda listener: api.check(
        list(suites) or None, backends=backends, preset_options=options,
        seeds=seeds, seed_list=parse_seed_list(seed_list), test_ids=patterns(test_ids), tags=patterns(tags),
        skips=_parse_skips(opdiff_skips), tolerance=tol, resume=resume, in_process=in_process,
        use_cache=not no_cache, trust_goldens=trust_goldens, settings=settings,
        argv=sys.argv[1:], listener=listener, python=python, shard=shard,
        run_group=run_group, require_delegated=require_delegated,
        expectations=expecting[0] if expecting is not None else None),
        fmt, verbose, fail_on, junit, "check" if not shard else f"check shard {shard[0]}/{shard[1]}", expecting,
        summary_md)


def _shard(text: str | None, ctx: click.Context, param: click.Parameter) -> tuple[int, int] | None:
    """--shard K/N, read when the flags are parsed."""
    from ..history.sharding import parse_shard

    try:
        return parse_shard(text) if text else None
    except OpdiffError as exc:
        raise FlagError(str(exc).removeprefix(f"--shard {text!r}: "), text, ctx, param) from None


def _requirements(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--with values, each refused at parse time unless it is an exact NAME==VERSION pin."""
    from ..execution.workerenvs import parse_requirement

    for value in values:
        try:
            parse_requirement(value)
        except OpdiffError as exc:
            raise FlagError(str(exc).removeprefix(f"--with {value!r}: "), value, ctx, param) from None
    return values


def _rounds_options(f):
    f = click.option("--min-ratio", type=NON_NEGATIVE, default=1.1, show_default=True,
                     help="With rounds: a latency change's 95 % interval must lie beyond this ratio.")(f)
    return click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True,
                        help="Alternate the checks (here, there, here, there...) this many rounds and report a "
                             "latency change only when its interval over the rounds clears --min-ratio; 1: one "
                             "check each, diff-runs' threshold.")(f)


class _UpgradeUI:
    """Shows `opdiff upgrade` as it goes: installer lines, then each check's progress."""

    def __init__(self, console, verbose: bool):
        self.console, self.verbose = console, verbose

    def installing(self, line: str) -> None:
        self.console.print(f"  | {printable(line)}", highlight=False, markup=False, soft_wrap=True)

    def check(self, label: str):
        from .output import ProgressDisplay

        self.console.print(f"== {printable(label)}", highlight=False, markup=False, soft_wrap=True)
        return ProgressDisplay(self.console, None, label, self.verbose)

    def reused(self, run_id: str) -> None:
        self.console.print(f"== check here: reusing run {printable(run_id)} (same plan, same versions, newer than "
                           "every golden; --rerun-current runs it again)", highlight=False, markup=False,
                           soft_wrap=True)


@click.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--with", "withs", multiple=True, metavar="PKG==VER", callback=_requirements,
              help="A package version for the other environment; repeatable.")
@click.option("-b", "--backend", "backends", multiple=True, help="Target preset; repeatable.")
@click.option("--preset-options", multiple=True, help="PRESET=JSON (string or file path); repeatable.")
@click.option("--rerun-current", is_flag=True, help="Check this environment again even when a fresh run exists.")
@click.option("--html", type=click.Path(path_type=Path), help="Also write the comparison as one HTML page.")
@_rounds_options
@diff_thresholds
@_batch_option
@_jobs_and_selection
@FORMAT_OPTION
@click.option("-v", "--verbose", is_flag=True, help="Print every result, passing ones too.")
@click.pass_context
@guarded
def upgrade(ctx, suites, withs, backends, preset_options, rerun_current, html, rounds, min_ratio, drift_factor,
            latency_threshold, batch, jobs, timeout_s, repeats, warmup, test_ids, tags, seeds, seed_list, fmt,
            verbose) -> None:
    """Check the goldens in an environment with --with packages replaced, and here; diff the two.

    \b
    opdiff upgrade --with onnxruntime==1.30.0 -b onnx_cpu_fp32
    The environment (this one's pins, the named packages replaced) is built with uv or
    venv + pip under the cache dir and reused by later upgrades with the same requirements.
    Exit 1 when something passes here and not there."""
    from .. import api
    from .output import make_console

    output_file(html, "--html")
    console = make_console(sys.stderr if fmt in ("csv", "json") else sys.stdout)
    settings = settings_of(ctx, jobs=jobs, timeout_s=timeout_s, repeats=repeats, warmup=warmup, batch=batch)
    rep = api.upgrade(list(withs), backends=list(backends), suites=list(suites) or None,
                      preset_options=_preset_options(preset_options), test_ids=patterns(test_ids),
                      tags=patterns(tags), seeds=seeds, seed_list=parse_seed_list(seed_list), settings=settings,
                      argv=sys.argv[1:], rerun_current=rerun_current, drift_factor=drift_factor,
                      latency_threshold=latency_threshold, rounds=rounds, min_ratio=min_ratio,
                      ui=_UpgradeUI(console, verbose))
    how = "reused" if rep.env.reused else f"built with {rep.env.installer}"
    echo(f"\nenvironment {rep.env.root} ({how} in {rep.env.seconds:.1f} s)", err=fmt in ("csv", "json"))
    for title, table in rep.diff.sections():
        print_table(table, fmt, f"{title} ({len(table)})")
    echo(rep.diff.summary(), err=fmt in ("csv", "json"))
    if html:
        with writing(html, "--html"):
            echo(f"wrote {api.write_diff_page(rep.diff, html)}")
    sys.exit(1 if len(rep.diff.newly_failing) else 0)


@click.command("compare-envs")
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--python", "python_b", type=click.Path(path_type=Path), required=True,
              help="Environment B: the interpreter (or environment folder) its workers run under.")
@click.option("--python-a", type=click.Path(path_type=Path), help="Environment A (default: this one).")
@click.option("-b", "--backend", "backends", multiple=True, help="Target preset; repeatable.")
@click.option("--preset-options", multiple=True, help="PRESET=JSON (string or file path); repeatable.")
@_rounds_options
@click.option("--drift-factor", type=POSITIVE, default=10.0, show_default=True, help="max_abs growth that counts.")
@_batch_option
@_jobs_and_selection
@FORMAT_OPTION
@click.option("-v", "--verbose", is_flag=True, help="Print every result, passing ones too.")
@click.pass_context
@guarded
def compare_envs(ctx, suites, python_b, python_a, backends, preset_options, rounds, min_ratio, drift_factor,
                 batch, jobs, timeout_s, repeats, warmup, test_ids, tags, seeds, seed_list, fmt, verbose) -> None:
    """Check the goldens under two environments in interleaved rounds (A, B, A, B, ...) and
    compare: verdicts and drift from the first round, latency from all of them with a 95 %
    interval. The same environment twice (A/A) reports no latency change. Exit 1 when something
    passes in A and not in B.

    \b
    opdiff compare-envs --python /tmp/ort130/bin/python -b onnx_cpu_fp32 --rounds 5
    """
    from .. import api
    from ..run.pipeline import Selection
    from .output import make_console

    console = make_console(sys.stderr if fmt in ("csv", "json") else sys.stdout)
    settings = settings_of(ctx, jobs=jobs, timeout_s=timeout_s, repeats=repeats, warmup=warmup, batch=batch)
    selection = Selection(list(suites) or None, patterns(test_ids), patterns(tags), seeds, parse_seed_list(seed_list))
    rep = api.compare_envs(python_b, backends=list(backends), python_a=python_a, selection=selection,
                           preset_options=_preset_options(preset_options), rounds=rounds, min_ratio=min_ratio,
                           drift_factor=drift_factor, settings=settings, argv=sys.argv[1:],
                           ui=_UpgradeUI(console, verbose))
    for title, table in rep.diff.sections():
        print_table(table, fmt, f"{title} ({len(table)})")
    echo(rep.diff.summary() + f"; latency over {len(rep.pairs)} interleaved rounds "
         f"(95 % interval beyond {min_ratio}x)", err=fmt in ("csv", "json"))
    sys.exit(1 if len(rep.diff.newly_failing) else 0)
