"""Independent pieces of a run side by side on one Spark session.

A run's Spark jobs are mostly small and latency bound (planning, scheduling, file listings, renames):
on a warm session, work that does not depend on other work finishes sooner next to it than after it.
Spark accepts jobs from several threads of one session, with a local session, a cluster or Spark
Connect alike.
"""

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# What a thread set up for its Spark jobs (the job tags naming its asset, see resources/spark.py) and
# its side-by-side threads must set up again: Spark keeps job tags per thread.
_inherited = threading.local()


def inherit_in_threads(key: str, setup: Callable[[], None]) -> None:
    """Have ``setup`` run again in every thread ``side_by_side`` starts from this one (and theirs);
    it replaces the setup this thread had under ``key``."""
    _inherited.calls = {**getattr(_inherited, "calls", {}), key: setup}


def _inheriting(call: Callable[[], T], setups: dict[str, Callable[[], None]]) -> Callable[[], T]:
    def run() -> T:
        for setup in setups.values():
            setup()
        _inherited.calls = dict(setups)
        return call()

    return run


# Enough to hide the latency of small jobs; more only queues jobs on the same executors.
DEFAULT_WORKERS = 4


def side_by_side(calls: Sequence[Callable[[], T]], *, name: str, workers: int = DEFAULT_WORKERS) -> list[Future[T]]:
    """Start every call in its own thread (at most ``workers`` at once); return once all have ended,
    failed or not, their futures in the order of ``calls``."""
    if not calls:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(calls))), thread_name_prefix=name) as pool:
        setups = dict(getattr(_inherited, "calls", {}))
        futures = [pool.submit(_inheriting(call, setups)) for call in calls]
    return futures


def results(futures: Sequence[Future[T]]) -> list[T]:
    """The futures' results in order; the first failure (in that order) is raised."""
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]
