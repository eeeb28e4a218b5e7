"""The one run loop that record, check and add-references share.

    plan -> work (jobs, and results decided without running) -> pool -> judge -> sinks

A command supplies the work as an iterator of `Result` (decided from the plan alone:
SKIPPED, KEPT, NO_GOLDEN...) and `(Job, context)` pairs, and a `judge` that turns a
job's context and its Outcome into a Result. `drive` pulls the work lazily, so results
decided without running reach the sinks in plan order between the running ones, and
hands every Result to one sink (a `Sinks`: the run's history file, the list the report
is made from, the caller's listener).

What a run selects and how its jobs run are the requests' `Selection` and `Running`
(run/requests.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from ..compare.results import Listener, Result
from ..execution.job import Outcome
from ..execution.pools import Pool
from ..execution.runner import Job
from ..history.writer import RunWriter

C = TypeVar("C")


class Sinks:
    """Where each result of a run goes, in order: the run's history file (set when the
    run starts), the results the report is made from, the caller's listener."""

    def __init__(self, listener: Listener | None = None, writer: RunWriter | None = None,
                 annotate: Callable[[Result], None] | None = None):
        self.listener = listener
        self.writer = writer
        self.annotate = annotate   # sets what the result's own job cannot know (its expected verdict)
        self.results: list[Result] = []

    def __call__(self, result: Result) -> None:
        if self.annotate is not None:
            self.annotate(result)
        if self.writer is not None:
            self.writer.item(result.to_json())
        self.results.append(result)
        if self.listener:
            self.listener(result)


@dataclass
class Pipeline(Generic[C]):
    """One run's work through a pool: `judge(context, outcome)` makes each job's Result.
    `again(job, outcome, result)`, where given, may answer a job to run instead of taking
    that result (a test whose batch-compiled artifact did not PASS, run alone): those run
    after the rest, and their results are the ones kept."""

    judge: Callable[[C, Outcome], Result]
    sink: Callable[[Result], None]
    again: Callable[[Job, Outcome, Result], Job | None] | None = None

    def drive(self, pool: Pool, work: Iterable[Result | tuple[Job, C]]) -> None:
        """Run the work's jobs in `pool` (closed at the end) and hand every result to the sink."""
        pending: dict[str, tuple[Job, C]] = {}
        retries: list[Job] = []

        def jobs() -> Iterator[Job]:
            for thing in work:
                if isinstance(thing, Result):
                    self.sink(thing)
                    continue
                job, context = thing
                pending[job.key] = (job, context)
                yield job

        with pool:
            for outcome in pool.run(jobs()):
                job, context = pending.pop(outcome.key)
                result = self.judge(context, outcome)
                retry = self.again(job, outcome, result) if self.again is not None else None
                if retry is None:
                    self.sink(result)
                else:
                    pending[retry.key] = (retry, context)
                    retries.append(retry)
            for outcome in pool.run(retries):
                self.sink(self.judge(pending.pop(outcome.key)[1], outcome))
