"""The worker pool on a Ray cluster: WorkerPool's contract (`run(tasks)` yields one result
per task, in completion order; CRASH and TIMEOUT through `task.failed`), with each job
sent to a node that has the hardware its preset needs.

- The parent plans, reads goldens, judges and writes history exactly as with the local
  pool; only where a task runs changes. It pickles each task and hands the bytes to an
  actor on the chosen node (`NodeWorker`, ray_node.py: the job runs in an isolated worker
  subprocess there).
- Routing: `registry.requirements(preset)` names what a task's preset needs (macos,
  apple_silicon, cuda, or a plugin's own names; job.ForPreset). A node advertises each as
  a Ray custom resource of that name (ray_cluster.py). Actors are pinned to such a node
  and ask Ray for a sliver of each resource, so Ray itself would refuse any other node. A
  task no live node can run is UNAVAILABLE with the reason, before anything is submitted.
- Concurrency: a node runs at most as many jobs at once as it advertises CPUs (`ray
  start --num-cpus N`), and keeps at most that many actors warm; an idle actor of
  another family makes room when needed. Each actor is handed its next job while it
  runs the current one (`DEPTH` calls in flight), so the hand-off through Ray and the
  parent's judging overlap the work instead of adding to it. A queued job's timeout
  starts when the job before it on that actor ends.
- A node (or actor) that dies: its in-flight jobs are retried once elsewhere; a job that
  dies twice, or that no other node can take, is CRASH naming the node.

Nothing imports ray until a RayPool is made.
"""

from __future__ import annotations

import os
import pickle
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Sequence

from ..core.verdicts import Verdict
from .job import ForPreset, RanOnNode, Stamped, Task, WithCache
from .pool import STARTUP_TIMEOUT_S
from .ray_cluster import Node, connect, first_line
from .ray_node import NodeWorker

if TYPE_CHECKING:
    from .warmup import WarmUp

SLIVER = 0.001            # of each required resource an actor asks Ray for
ACTOR_GRACE_S = STARTUP_TIMEOUT_S + 60.0   # beyond the job timeout, before the parent gives up on an actor
REFRESH_S = 1.0           # how often the parent re-reads which nodes are alive
DEPTH = 2                 # calls in flight per actor: the running job and the next one


@dataclass
class _Actor:
    handle: Any
    node: Node
    kind: tuple[str, frozenset[str]]   # (preset family, needs)
    inflight: int = 0                  # calls sent and not yet landed
    last_used: float = 0.0

    @property
    def busy(self) -> bool:
        return self.inflight > 0


@dataclass
class _Item:
    task: Task
    needs: frozenset[str]
    family: str
    attempts: int = 0
    avoid: set[str] = field(default_factory=set)   # nodes it died on
    lost: list[str] = field(default_factory=list)  # what happened to it there


@dataclass
class _Flight:
    item: _Item
    actor: _Actor
    deadline: float | None   # None: queued behind the actor's running call


def _needs(task: Task) -> tuple[frozenset[str], str]:
    preset = task.preset if isinstance(task, ForPreset) else None
    if preset is None:
        return frozenset(), ""
    from ..backends.registry import requirements

    return requirements(preset), preset.family


class RayPool:
    """Run tasks on a Ray cluster (`address` "HOST:PORT" or "auto"), or on a Ray instance
    of our own on this machine with `jobs` CPUs (`address` None). `notify` is told what the
    user should know that is no result (a node that died, a job retried)."""

    def __init__(self, address: str | None, jobs: int | None = None, timeout_s: float = 300,
                 notify: Callable[[str], None] | None = None, threads: int = 1):
        self.address = address
        self.n = max(1, int(jobs or os.cpu_count() or 1))
        self.timeout_s = float(timeout_s)
        self.notify = notify or (lambda text: None)
        self.in_process = False
        self.python = None                # the nodes' own interpreters (describe() names them)
        self.threads = threads            # intra-op threads of every job, on every node
        self.started_workers = 0          # actors created (replacements included)
        self.warm: tuple = ()             # the run's presets, warmed up by the actors of their family
        self._ray, self._owned = connect(address, self.n)
        self._actor_class = self._ray.remote(NodeWorker)
        self._nodes: dict[str, Node] = {}
        self._actors: list[_Actor] = []
        self._refreshed = 0.0
        self._refresh(force=True)

    def environment(self) -> dict:
        """The environment of the process that coordinates the run (for the meta line);
        the nodes' library versions are in `describe()`."""
        from ..core.environment import environment

        return environment(threads=self.threads or 0)

    @property
    def where(self) -> str:
        return f"the Ray cluster at {self.address}" if self.address else "the Ray instance started here"

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every actor (each stops its worker subprocess), then leave the cluster (a
        Ray instance of our own stops with it)."""
        if self._ray is None:
            return
        actors, self._actors = self._actors, []
        stops = [a.handle.stop.remote() for a in actors if not a.busy and a.node.alive]
        if stops:
            self._ray.wait(stops, num_returns=len(stops), timeout=10)
        for a in actors:
            self._kill(a)
        if self._owned:
            self._ray.shutdown()
        self._ray = None

    def describe(self) -> dict[str, Any]:
        """For the run's settings: where it ran, and the nodes it could use."""
        return {"executor": f"ray://{self.address}" if self.address else "ray",
                "nodes": [{"node": n.id, "host": n.host, "ip": n.ip, "resources": n.offered()}
                          for n in self._nodes.values() if n.alive]}

    def unavailable(self, preset) -> str | None:
        """Why no node of the cluster can run `preset` (None: one can)."""
        from ..backends.registry import requirements

        needs = requirements(preset)
        self._refresh(force=True)
        return None if self._candidates(needs) else self._no_node(needs)

    # ------------------------------------------------------------ nodes
    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._refreshed < REFRESH_S:
            return
        self._refreshed = now
        for info in self._ray.nodes():
            node_id = info["NodeID"]
            if info.get("Alive"):
                node = self._nodes.get(node_id)
                if node is None:
                    self._nodes[node_id] = Node(node_id, info.get("NodeManagerHostname") or "?",
                                                 info.get("NodeManagerAddress") or "?",
                                                 dict(info.get("Resources") or {}))
                else:
                    node.resources = dict(info.get("Resources") or node.resources)
            elif node_id in self._nodes and self._nodes[node_id].alive:
                self._nodes[node_id].alive = False
                self._actors = [a for a in self._actors if a.node.id != node_id or a.busy]

    def _candidates(self, needs: frozenset[str]) -> list[Node]:
        return [n for n in self._nodes.values() if n.alive and n.offers(needs)]

    def _busy(self, node: Node) -> int:
        return sum(1 for a in self._actors if a.node is node and a.busy)

    def _no_node(self, needs: frozenset[str]) -> str:
        alive = [n for n in self._nodes.values() if n.alive]
        gone = [n for n in self._nodes.values() if not n.alive and n.offers(needs)]
        what = (f"advertises {' and '.join(sorted(needs))} with a CPU" if needs else "has a CPU to run jobs on")
        text = (f"no live node of {self.where} {what} (nodes: "
                f"{'; '.join(n.advertised() for n in alive) or 'none'})")
        if gone:
            text += f"; {', '.join(n.label for n in gone)}, which did, died during the run"
        example = "{" + ", ".join(f'"{n}": 1' for n in sorted(needs)) + "}" if needs else None
        start = (f"ray start --address {self.address or 'HEAD:PORT'}"
                 + (f" --resources '{example}'" if example else " --num-cpus N"))
        return f"{text}. Add such a node with `{start}` (docs/distributed.md)"

    # ------------------------------------------------------------ actors
    def _actor(self, node: Node, item: _Item) -> _Actor:
        """An idle actor of the item's kind on `node`, made when there is none (retiring an
        idle one of another kind when the node already keeps as many as it has slots)."""
        kind = (item.family, item.needs)
        mine = [a for a in self._actors if a.node is node]
        for a in mine:
            if a.kind == kind and not a.busy:
                return a
        idle = sorted((a for a in mine if not a.busy), key=lambda a: a.last_used)
        if len(mine) >= node.slots and idle:
            self._retire(idle[0])
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        handle = self._actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False),
            num_cpus=0, resources={node.resource_for(n): SLIVER for n in item.needs},
            max_restarts=0, max_task_retries=0,
        ).remote(self.timeout_s, node.slots, _cache_arg(item.task), self.warm_for(item), self.threads)
        self.started_workers += 1
        actor = _Actor(handle, node, kind)
        self._actors.append(actor)
        return actor

    def prestart(self, warm: Sequence[WarmUp] = (), jobs: int | None = None) -> None:
        """Actors start with their first job's kind; each warms up the run's presets of its family."""
        self.warm = tuple(warm)

    def warm_for(self, item: _Item) -> tuple:
        return tuple(w for w in self.warm if w.preset.family == item.family)

    def _retire(self, actor: _Actor) -> None:
        if actor in self._actors:
            self._actors.remove(actor)
        actor.handle.stop.remote()
        self._kill(actor)

    def _kill(self, actor: _Actor) -> None:
        try:
            self._ray.kill(actor.handle, no_restart=True)
        except Exception:
            pass   # already gone with its node

    # ------------------------------------------------------------ running
    def run(self, tasks: Iterable[Task]) -> Generator[Any, None, None]:
        """Each task's result (see job.Task), in completion order."""
        ray = self._ray
        source = iter(tasks)
        queue: deque[_Item] = deque()
        flights: dict[Any, _Flight] = {}
        exhausted = False
        try:
            while True:
                self._refresh()
                done: list = []
                self._dispatch(queue, flights, done)
                while not exhausted and len(queue) < max(1, 2 * self._capacity()) \
                        and (self._room() or not self._capacity()):
                    try:
                        task = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    needs, family = _needs(task)
                    queue.append(_Item(task, needs, family))
                    self._dispatch(queue, flights, done)
                yield from done
                if not flights:
                    if exhausted and not queue:
                        return
                    if not queue:
                        continue
                    time.sleep(REFRESH_S / 4)   # every slot taken by nothing of ours: wait for nodes
                    self._refresh(force=True)
                    continue
                now = time.monotonic()
                running = [f.deadline for f in flights.values() if f.deadline is not None]
                wait_s = max(0.0, min(min(running, default=now + REFRESH_S) - now, REFRESH_S))
                ready, _ = ray.wait(list(flights), num_returns=1, timeout=wait_s)
                for ref in ready:
                    flight = flights.pop(ref)
                    result = self._landed(flight, ref, queue)
                    if flight.actor in self._actors:
                        self._start_next(flight.actor, flights)
                    else:   # lost with its node or process: what queued behind never ran
                        self._requeue_behind(flight.actor, flights, queue)
                    if result is not None:
                        yield result
                now = time.monotonic()
                for ref, flight in list(flights.items()):
                    if flight.deadline is not None and now >= flight.deadline:
                        del flights[ref]
                        self._requeue_behind(flight.actor, flights, queue)
                        yield self._overdue(flight)
        except GeneratorExit:
            for flight in flights.values():   # the consumer stopped early: abandon what runs
                if flight.actor in self._actors:
                    self._actors.remove(flight.actor)
                self._kill(flight.actor)
            raise
        except BaseException:
            self.close()
            raise

    def _capacity(self) -> int:
        return sum(n.slots for n in self._nodes.values() if n.alive)

    def _free_slot(self) -> bool:
        return any(self._busy(n) < n.slots for n in self._nodes.values() if n.alive)

    def _room(self) -> bool:
        """A free slot, or a running actor that can take its next call now."""
        return self._free_slot() or any(0 < a.inflight < DEPTH for a in self._actors if a.node.alive)

    def _behind(self, item: _Item, nodes: list[Node]) -> _Actor | None:
        """A running actor of the item's kind on one of `nodes` with room for a next call."""
        kind = (item.family, item.needs)
        ready = [a for a in self._actors if a.kind == kind and a.node in nodes and 0 < a.inflight < DEPTH]
        return min(ready, key=lambda a: a.inflight) if ready else None

    def _start_next(self, actor: _Actor, flights: dict) -> None:
        """The actor's call has landed: the call queued behind it starts its clock now."""
        deadline = time.monotonic() + self.timeout_s + ACTOR_GRACE_S
        for flight in flights.values():
            if flight.actor is actor and flight.deadline is None:
                flight.deadline = deadline
                return

    def _requeue_behind(self, actor: _Actor, flights: dict, queue: deque[_Item]) -> None:
        """The actor is being replaced: calls queued behind its running one never started,
        so their items go back to the queue as they were."""
        for ref, flight in list(flights.items()):
            if flight.actor is actor and flight.deadline is None:
                del flights[ref]
                actor.inflight -= 1
                queue.appendleft(flight.item)

    def _dispatch(self, queue: deque[_Item], flights: dict, done: list) -> None:
        """Start every queued item that a free slot can take, in queue order; items no live
        node can run leave the queue as results."""
        for item in list(queue):
            nodes = self._candidates(item.needs)
            if not nodes:
                queue.remove(item)
                done.append(self._unrunnable(item))
                continue
            elsewhere = [n for n in nodes if n.id not in item.avoid]
            pick = [n for n in (elsewhere or nodes) if self._busy(n) < n.slots]
            if pick:
                kind = (item.family, item.needs)
                warm = [n for n in pick if any(a.node is n and a.kind == kind and not a.busy for a in self._actors)]
                actor = self._actor((warm or sorted(pick, key=self._busy))[0], item)
            else:
                behind = self._behind(item, elsewhere or nodes)
                if behind is None:
                    continue
                actor = behind
            try:
                data = pickle.dumps(item.task, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:   # e.g. an unpicklable value in a test's inputs
                queue.remove(item)
                done.append(item.task.failed(Verdict.EXPORT_FAIL, type(exc).__name__,
                                             f"the job could not be sent to a worker: {exc}"))
                continue
            queue.remove(item)
            deadline = None if actor.busy else time.monotonic() + self.timeout_s + ACTOR_GRACE_S
            actor.inflight += 1
            ref = actor.handle.run.remote(item.task.key, data)
            flights[ref] = _Flight(item, actor, deadline)

    def _landed(self, flight: _Flight, ref: Any, queue: deque[_Item]):
        """The result of a finished flight; None when the item went back to the queue."""
        from ray import exceptions as rx

        actor, item = flight.actor, flight.item
        actor.inflight, actor.last_used = max(0, actor.inflight - 1), time.monotonic()
        try:
            reply = self._ray.get(ref)
        except rx.RayTaskError as exc:   # our actor code raised: a bug, not the job's doing
            return self._stamp(item.task.failed(Verdict.CRASH, "RayTaskError",
                                                f"the Ray worker on {actor.node.label} failed: {first_line(exc)}"),
                               actor.node, None)
        except rx.RayError as exc:       # the actor is gone: its node died, or its process did
            return self._lost(flight, exc, queue)
        if reply[0] == "ok":
            return self._stamp(pickle.loads(reply[1]), actor.node, None)
        _, status, error_class, message, pid = reply
        return self._stamp(item.task.failed(Verdict(status), error_class, message), actor.node, pid)

    def _lost(self, flight: _Flight, exc: BaseException, queue: deque[_Item]):
        actor, item, node = flight.actor, flight.item, flight.actor.node
        if actor in self._actors:
            self._actors.remove(actor)
        self._kill(actor)
        self._refresh(force=True)
        if flight.deadline is None:   # it was queued behind the call that was running: never started
            queue.appendleft(item)
            return None
        if "node has died" in str(exc) or "node was terminated" in str(exc):
            node.alive = False   # Ray said so before its node table did
        what = "died" if not node.alive else "lost its Ray worker"
        item.lost.append(f"the Ray node {node.label} {what} while running the job ({first_line(exc)})")
        item.avoid.add(node.id)
        if item.attempts == 0:
            item.attempts = 1
            queue.appendleft(item)
            self.notify(f"{item.lost[-1]}; {item.task.key.replace(chr(0), ' ')} is retried elsewhere")
            return None
        return self._stamp(item.task.failed(Verdict.CRASH, "NodeDied",
                                            "; ".join(item.lost) + "; it had been retried once already"),
                           node, None)

    def _unrunnable(self, item: _Item):
        why = self._no_node(item.needs)
        if item.lost:   # it was running when its node went away, and nothing else can take it
            return item.task.failed(Verdict.CRASH, "NodeDied", "; ".join(item.lost)
                                    + f"; it could not be retried elsewhere: {why}")
        if any(not n.alive and n.offers(item.needs) for n in self._nodes.values()):
            # the cluster had the hardware when the run started: a node lost is a failed run,
            # never a quiet UNAVAILABLE
            return item.task.failed(Verdict.CRASH, "NodeDied", why)
        return item.task.failed(Verdict.UNAVAILABLE, None, why)

    def _overdue(self, flight: _Flight):
        actor = flight.actor
        if actor in self._actors:
            self._actors.remove(actor)
        self._kill(actor)
        waited = self.timeout_s + ACTOR_GRACE_S
        return self._stamp(flight.item.task.failed(
            Verdict.TIMEOUT, "Timeout", f"no result from the Ray worker on {actor.node.label} after "
                                        f"{waited:g} s; it was killed and replaced"), actor.node, None)

    @staticmethod
    def _stamp(result: Any, node: Node, pid: int | None) -> Any:
        if isinstance(result, RanOnNode):
            result.worker_node = node.id
        if pid is not None and isinstance(result, Stamped):
            result.worker_pid = pid
        return result


def _cache_arg(task: Task) -> str | None:
    cache = task.cache_dir if isinstance(task, WithCache) else None
    return str(Path(cache).absolute()) if cache is not None else None
