"""Job -> Outcome: prepare a flat module, export (cached), load, time, isolate."""

from .job import Job, Outcome
from .pool import WorkerPool
from .prepare import FlatModule, Prepared, flat_module, prepare_call, restore_outputs
from .runner import run_job

__all__ = ["Job", "Outcome", "WorkerPool", "Prepared", "FlatModule", "flat_module", "prepare_call",
           "restore_outputs", "run_job"]
