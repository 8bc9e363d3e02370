"""Where a vLLM engine's processes run on a CPU machine (docs/serving-vllm.md, section 5, the "Placement" item).

On the CPU, vLLM binds the model worker's OpenMP threads to cores of their own (`VLLM_CPU_OMP_THREADS_BIND`; on a
two-core machine its default gives the worker one core and one OpenMP thread). The worker's other threads, the
engine core, the API server and the client are left free to run anywhere, so they take turns on the worker's core
and every step waits for them. `pin_apart` keeps the worker's threads on the worker's cores and moves everything
else onto the others: the same placement for the serving profile's in-process engine (sim.measure) and for a
`vllm serve` under load, so that a step costs there what it cost where it was measured.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

WORKER_TAG = "Worker"  # vLLM titles its model worker VLLM::Worker (or VLLM::Worker_<rank>), which /proc/PID/comm shows


def threads_of(pid: int) -> list[int]:
    """Every thread of process `pid` (none when it is gone)."""
    try:
        return [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def process_name(pid: int) -> str:
    """The process's name as the kernel shows it (/proc/PID/comm: vLLM names its engine core and worker)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return "?"


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses
        if fields and fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return sorted(out)


def bound_cpus(pids: list[int]) -> set[int]:
    """The CPUs vLLM bound the workers' OpenMP threads to: the union of the affinities of their threads that may
    not run everywhere (the binding narrows exactly those; the other threads keep the whole machine). Empty when
    nothing is bound (`VLLM_CPU_OMP_THREADS_BIND=nobind`)."""
    every = set(os.sched_getaffinity(0))
    bound: set[int] = set()
    for pid in pids:
        for thread in threads_of(pid):
            try:
                cpus = set(os.sched_getaffinity(thread))
            except OSError:
                continue
            if cpus < every:
                bound |= cpus
    return bound


def pin_apart(members: list[int], *, with_self: bool = True) -> dict[str, Any] | None:
    """Every thread of the workers among `members` onto the cores vLLM bound their OpenMP threads to; every thread
    of the other members (engine core, API server) and, `with_self`, of this process (the client, or the measuring
    engine core) onto the remaining cores. Threads started later inherit their starter's cores. Returns the two
    sets and the processes moved, or None where there is no bound worker or no core is left for the rest (nothing is
    moved then), or where a thread could not be moved: the threads moved before it stay moved, so the placement may
    then be half applied (`restore` puts this process's threads back on the cores it had)."""
    workers = [pid for pid in members if WORKER_TAG in process_name(pid)]
    worker_cpus = bound_cpus(workers)
    others = set(os.sched_getaffinity(0)) - worker_cpus
    if not workers or not worker_cpus or not others:
        return None
    rest = [pid for pid in members if pid not in workers]
    if with_self and os.getpid() not in rest:
        rest.append(os.getpid())
    try:
        for pids, cpus in ((workers, worker_cpus), (rest, others)):
            for pid in pids:
                for thread in threads_of(pid):
                    try:
                        os.sched_setaffinity(thread, cpus)
                    except ProcessLookupError:
                        continue  # the thread ended between the listing and now
    except OSError:
        return None
    return {
        "worker": sorted(worker_cpus),
        "others": sorted(others),
        "processes": {process_name(pid): ("worker" if pid in workers else "others") for pid in workers + rest},
    }


def restore(cpus: set[int]) -> None:
    """Every thread of this process back onto `cpus` (what it had before `pin_apart`). A process started while
    this one is pinned inherits its cores: the next server must start from the whole machine, or vLLM binds its
    worker inside the client's cores and every process of it shares one core."""
    for thread in threads_of(os.getpid()):
        try:
            os.sched_setaffinity(thread, cpus)
        except ProcessLookupError:
            continue
