"""Independent pieces of a run side by side on one Spark session.

A run's Spark jobs are mostly small and latency bound (planning, scheduling, file listings, renames):
on a warm session, work that does not depend on other work finishes sooner next to it than after it.
Spark accepts jobs from several threads of one session, with a local session, a cluster or Spark
Connect alike.
"""

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Enough to hide the latency of small jobs; more only queues jobs on the same executors.
DEFAULT_WORKERS = 4


def side_by_side(calls: Sequence[Callable[[], T]], *, name: str, workers: int = DEFAULT_WORKERS) -> list[Future[T]]:
    """Start every call in its own thread (at most ``workers`` at once); return once all have ended,
    failed or not, their futures in the order of ``calls``."""
    if not calls:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(calls))), thread_name_prefix=name) as pool:
        futures = [pool.submit(call) for call in calls]
    return futures


def results(futures: Sequence[Future[T]]) -> list[T]:
    """The futures' results in order; the first failure (in that order) is raised."""
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]
