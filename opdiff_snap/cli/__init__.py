"""`opdiff` command line. Each command parses flags and calls one function of the API;
app.py holds the group and what the commands share, one module per family of commands."""

from . import analysis, cause, environments, goldens, importing, running, suites
from .app import main

for command in (
    suites.list_presets,
    suites.list_tests,
    suites.validate,
    running.record,
    running.check,
    running.bundle,
    environments.upgrade,
    environments.compare_envs,
    goldens.goldens,
    analysis.runs,
    analysis.query,
    analysis.report,
    analysis.diff_runs,
    analysis.regressions,
    cause.localize,
    cause.repro,
    cause.gradcheck,
    cause.ops,
    importing.import_,
):
    main.add_command(command)

__all__ = ["main"]
