"""Worker tasks with real-format UPIDs (the format PVE uses).

A mutation registers a task, returns its UPID at once, and the state change is
applied when the simulated duration has elapsed, exactly like a forked PVE worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Callable

from gateway.sim.errors import ApiError
from gateway.sim.state import Cluster, Task

log = logging.getLogger("pvegate.sim.tasks")

UPID_RE = re.compile(
    r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
    r"([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$"
)

# the work function returns extra log lines; raising ApiError fails the task with its message
Work = Callable[[], list[str] | None]

# Finished tasks the simulator keeps (PVE rotates its task index too): a soak or a benchmark must not
# grow it, nor the task list it sorts per request, without end. A dropped UPID reads "no such task", as
# one Proxmox rotated out does. Running tasks are never dropped.
TASK_HISTORY = 5_000


def make_upid(node: str, pid: int, pstart: int, starttime: int, wtype: str, wid: str, user: str) -> str:
    return f"UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{wtype}:{wid}:{user}:"


class TaskManager:
    def __init__(self, cluster: Cluster, duration: Callable[[], float], history: int = TASK_HISTORY) -> None:
        self.cluster = cluster
        self.duration = duration
        self.history = history
        self._pids = itertools.count(0x000F0000 + int(time.time()) % 0x10000)
        self._running: set[asyncio.Task[None]] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}  # upid -> its worker, for stop()
        self._finishers: dict[str, Callable[[bool], None] | None] = {}

    def start(
        self,
        node: str,
        wtype: str,
        wid: str,
        user: str,
        work: Work,
        first_log: list[str] | None = None,
        seconds: float | None = None,
        on_finish: Callable[[bool], None] | None = None,
        begin: Work | None = None,
    ) -> Task:
        """Fork a worker. `begin` runs at once inside the worker (take locks, check
        conflicts); an ApiError there fails the task immediately, as in PVE."""
        now = time.time()
        n = self.cluster.nodes[node]
        pid = next(self._pids)
        # pstart is the process start in clock ticks since boot (USER_HZ=100)
        pstart = int((now - n.boot_time) * 100) & 0xFFFFFFFFF
        starttime = int(now)
        upid = make_upid(node, pid, pstart, starttime, wtype, wid, user)
        task = Task(upid=upid, node=node, pid=pid, pstart=pstart, starttime=starttime, type=wtype, id=wid, user=user)
        task.log.extend(first_log or [])
        self._rotate()
        self.cluster.tasks[upid] = task
        if begin is not None:
            try:
                task.log.extend(begin() or [])
            except ApiError as e:
                task.status = "stopped"
                task.exitstatus = e.message
                task.endtime = starttime
                task.log.append(f"TASK ERROR: {e.message}")
                self.cluster.touch()
                return task
            self.cluster.touch()
        dur = self.duration() if seconds is None else seconds
        t = asyncio.get_running_loop().create_task(self._run(task, work, dur, on_finish))
        self._running.add(t)
        self._workers[upid] = t
        t.add_done_callback(self._running.discard)
        t.add_done_callback(lambda _t: self._workers.pop(upid, None))
        self._finishers[upid] = on_finish
        return task

    def _rotate(self) -> None:
        """At `history` tasks, drop the oldest finished ones down to nine tenths of it (the dict keeps the
        order they started in; a tenth at a time, so a start does not scan the history each time)."""
        tasks = self.cluster.tasks
        if len(tasks) < self.history:
            return
        drop = len(tasks) - self.history * 9 // 10
        for upid in [u for u, t in tasks.items() if t.status != "running"][:drop]:
            del tasks[upid]

    def stop(self, upid: str) -> bool:
        """Interrupt a running worker as PVE's task stop does (SIGTERM): what it did stays
        done, the task ends with an error. False when it is not running."""
        worker = self._workers.pop(upid, None)
        task = self.cluster.tasks.get(upid)
        if worker is None or task is None or task.status != "running":
            return False
        worker.cancel()
        task.status = "stopped"
        task.exitstatus = "interrupted by signal"
        task.endtime = int(time.time())
        task.log += ["received interrupt", "TASK ERROR: interrupted by signal"]
        finish = self._finishers.pop(upid, None)
        if finish is not None:
            finish(False)
        self.cluster.touch()
        return True

    async def _run(self, task: Task, work: Work, seconds: float, on_finish: Callable[[bool], None] | None) -> None:
        await asyncio.sleep(seconds)
        ok = True
        try:
            extra = work() or []
            task.log.extend(extra)
            task.exitstatus = "OK"
            task.log.append("TASK OK")
        except ApiError as e:
            ok = False
            task.exitstatus = e.message
            task.log.append(f"TASK ERROR: {e.message}")
        except Exception as e:  # a simulator bug must still end the task
            log.exception("task %s crashed", task.upid)
            ok = False
            task.exitstatus = f"simulator error: {e}"
            task.log.append(f"TASK ERROR: {task.exitstatus}")
        task.status = "stopped"
        task.endtime = int(time.time())
        self._finishers.pop(task.upid, None)
        if on_finish:
            on_finish(ok)
        self.cluster.touch()

    async def drain(self) -> None:
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
