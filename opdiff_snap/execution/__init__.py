"""Job -> Outcome: prepare a flat module, export (cached), load, time, isolate."""

from .job import Outcome, Task, WorkerContext
from .pool import WorkerPool
from .prepare import FlatModule, Prepared, flat_module, prepare_call, restore_outputs
from .runner import Job, run_job

__all__ = ["Job", "Outcome", "Task", "WorkerContext", "WorkerPool", "Prepared", "FlatModule", "flat_module", "prepare_call",
           "restore_outputs", "run_job"]
