"""History files written without running anything, in the documented format
(docs/architecture.md, "History format"): a few hand-made runs (`synth`) and long
synthetic histories with planted changes and their ground truth (`planted`), for the
analytics tests and bench/bench_regressions.py."""
