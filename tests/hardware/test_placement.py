"""sim/hardware/vllm/placement.py on real processes: a stand-in worker (a process named as vLLM names its worker,
one of its threads bound to one core as vLLM binds the OpenMP threads) and a stand-in engine core."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from sim.hardware.vllm.placement import bound_cpus, descendants, pin_apart, process_name, restore, threads_of

CORES = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2 or not os.path.isdir("/proc"), reason="needs Linux and 2 cores")


def start(tmp_path, name: str) -> subprocess.Popen[bytes]:
    """A sleeping process whose /proc name is `name` (the kernel names a process after its executable)."""
    program = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    process = subprocess.Popen([str(program), "30"])
    for _ in range(100):
        if process_name(process.pid) == name:
            return process
        time.sleep(0.01)
    raise AssertionError(f"{name} did not start")


def test_the_worker_keeps_its_bound_core_and_everything_else_moves_off_it(tmp_path):
    worker, core = start(tmp_path, "VllmWorker-0"), start(tmp_path, "EngineCore")
    try:
        assert {worker.pid, core.pid} <= set(descendants(os.getpid()))
        # unbound, there is nothing to keep apart
        assert bound_cpus([worker.pid]) == set() and pin_apart([worker.pid, core.pid], with_self=False) is None
        os.sched_setaffinity(worker.pid, {CORES[-1]})  # as vLLM binds the worker's OpenMP thread
        placed = pin_apart([worker.pid, core.pid], with_self=False)
        assert placed is not None
        assert placed["worker"] == [CORES[-1]] and placed["others"] == CORES[:-1]
        assert placed["processes"] == {"VllmWorker-0": "worker", "EngineCore": "others"}
        assert os.sched_getaffinity(worker.pid) == {CORES[-1]}
        assert os.sched_getaffinity(core.pid) == set(CORES[:-1])
        # a process that is not one of vLLM's workers is never taken for one
        assert pin_apart([core.pid], with_self=False) is None
    finally:
        for process in (worker, core):
            process.kill()
            process.wait()


def test_this_process_moves_with_the_rest(tmp_path):
    worker = start(tmp_path, "VllmWorker-0")
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(worker.pid, {CORES[0]})
        placed = pin_apart([worker.pid])
        assert placed is not None and placed["processes"]["VllmWorker-0"] == "worker"
        assert all(os.sched_getaffinity(thread) == set(CORES[1:]) for thread in threads_of(os.getpid()))
        # a process started now inherits the client's cores (a server would bind its worker inside them) ...
        inherited = start(tmp_path, "inherits")
        assert os.sched_getaffinity(inherited.pid) == set(CORES[1:])
        inherited.kill()
        inherited.wait()
        # ... and one started after `restore` has the whole machine again
        restore(before)
        fresh = start(tmp_path, "fresh")
        assert os.sched_getaffinity(fresh.pid) == before
        fresh.kill()
        fresh.wait()
    finally:
        restore(before)
        worker.kill()
        worker.wait()
