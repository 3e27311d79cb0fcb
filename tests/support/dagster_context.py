"""A guard against Dagster state that one test leaves behind for the next.

Entering a `DagsterInstance` sets Dagster's current definitions-state storage, a context variable
that holds the instance by weak reference, and leaving it resets the variable to what it was. A
schedule context built with a persistent instance enters a second instance of its own when the
schedule reads `context.instance`, and only closing the context leaves that one. Left open, it is
left when the garbage collector finalizes it, long after the test: the variable is then reset to the
storage of the test's instance, which is gone, and every later `materialize()` in the session fails
with "Attempted to resolve undefined DagsterInstance weakref". That is how CI lost 63 tests at once.

This fixture collects garbage at the end of each test module, fails the module that leaves the
variable set (its last test reports the error), and clears it so that later modules are not harmed.
"""

import gc
from collections.abc import Iterator

import pytest
from dagster._core.storage.defs_state import base


@pytest.fixture(autouse=True, scope="module")
def _no_dagster_storage_left_set() -> Iterator[None]:
    yield
    gc.collect()
    left = base.DefsStateStorage.get()
    if left is not None:
        base._current_storage.set(None)  # Dagster's own reset when a token cannot be used
        pytest.fail(
            f"the module left Dagster's definitions-state storage set ({type(left).__name__}): "
            "a DagsterInstance or a schedule or sensor context was entered and never closed; "
            "use it in a `with` block",
            pytrace=False,
        )
