"""Backend and thread settings are scoped: `backend.using()` applies to its own thread (context) only,
`set_backend` sets the process-wide default, and `set_threads` is numba's per-thread count."""
import asyncio
import contextvars
import os
import subprocess
import sys
import threading

import pytest

from fss import DCF, ParameterError, backend

FUSED = [n for n in backend.available() if n != "portable"]
OTHER = FUSED[-1] if FUSED else "auto"  # a choice other than "portable" (the fastest tier, or auto without one)
PARAMS = DCF(8).params


def _run_two(first, second):
    """Runs first(barrier) and second(barrier) in two threads at once; re-raises either's failure."""
    barrier = threading.Barrier(2, timeout=60)
    errors = []

    def wrap(fn):
        def run():
            try:
                fn(barrier)
            except BaseException as exc:  # noqa: BLE001 - reported in the main thread
                errors.append(exc)
                barrier.abort()
        return run

    threads = [threading.Thread(target=wrap(f)) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]


def test_using_in_one_thread_does_not_change_another():
    default = backend.chosen()
    seen = {}

    def inside(barrier):
        with backend.using("portable"):
            barrier.wait()  # 1: the other thread looks while this block is open
            seen["inside"] = (backend.chosen(), backend.current(), backend._fast_for(PARAMS))
            barrier.wait()  # 2
        seen["after"] = backend.chosen()

    def outside(barrier):
        barrier.wait()  # 1
        seen["outside"] = (backend.chosen(), backend.current())
        barrier.wait()  # 2

    _run_two(inside, outside)
    assert seen["inside"] == ("portable", "portable", None)
    assert seen["outside"] == (default, backend.current()) and seen["outside"][0] != "portable"
    assert seen["after"] == default and backend.chosen() == default


def test_two_threads_in_two_blocks_each_see_their_own():
    seen = {}

    def block(name):
        def run(barrier):
            with backend.using(name):
                barrier.wait()
                seen[name] = [backend.chosen() for _ in range(200)]  # while the other block is open
                barrier.wait()
        return run

    _run_two(block("portable"), block(OTHER))
    assert set(seen["portable"]) == {"portable"} and set(seen[OTHER]) == {OTHER}


def test_set_backend_is_the_process_default_and_a_block_keeps_its_choice():
    before = backend.chosen()
    try:
        with backend.using(OTHER):
            backend.set_backend("portable")
            assert backend.chosen() == OTHER  # the block's own choice still holds
            got = []
            t = threading.Thread(target=lambda: got.append(backend.chosen()))
            t.start()
            t.join()
            assert got == ["portable"]  # a thread outside any block sees the new default
            carried = []
            t = threading.Thread(target=contextvars.copy_context().run, args=(lambda: carried.append(backend.chosen()),))
            t.start()
            t.join()
            assert carried == [OTHER]  # copy_context carries a block's choice into a thread
        assert backend.chosen() == "portable"
    finally:
        backend.set_backend(before)
    assert backend.chosen() == before


def test_asyncio_tasks_are_scoped_too():
    async def task(name, started, other_started):
        with backend.using(name):
            started.set()
            await other_started.wait()
            await asyncio.sleep(0)  # both blocks open: each task reads while the other's is too
            seen = backend.chosen()
            await asyncio.sleep(0)
            return seen

    async def main():
        a, b = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(task("portable", a, b), task(OTHER, b, a))

    assert asyncio.run(main()) == ["portable", OTHER]


def test_a_bad_name_leaves_the_choice_alone():
    before = backend.chosen()
    with pytest.raises(ParameterError):
        with backend.using("gpu"):
            raise AssertionError("the block must not run")
    assert backend.chosen() == before


SET_THREADS_IN_A_THREAD = """
import threading
from fss import backend
backend.set_threads(2)
seen = []
def other():
    backend.set_threads(1)
    seen.append(backend.threads())
t = threading.Thread(target=other); t.start(); t.join()
late = []
t = threading.Thread(target=lambda: late.append(backend.threads())); t.start(); t.join()
print(seen[0], backend.threads(), late[0])
"""


def test_set_threads_applies_to_the_calling_thread_only():
    env = dict(os.environ, NUMBA_NUM_THREADS="2")  # two threads to tell apart, on any machine
    out = subprocess.run([sys.executable, "-c", SET_THREADS_IN_A_THREAD], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2", "2"]  # the other thread's 1; this thread's 2; a new thread's default
