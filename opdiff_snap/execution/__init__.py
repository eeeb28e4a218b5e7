"""Job -> Outcome: prepare a flat module, export (cached), load, time, isolate.

Import from the modules (`job`, `pool`, `prepare`, `runner`, ...): this package's own
import loads nothing, so a parent that only reads outcomes never imports torch."""
