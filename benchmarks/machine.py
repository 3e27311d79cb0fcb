"""What machine a benchmark ran on, for BENCHMARKS.md."""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator


def stop_cleanly_on_sigterm() -> None:
    """Make SIGTERM end the benchmark as Ctrl-C does, through its ``finally`` blocks, which stop the
    servers it started and remove its work folder. By default SIGTERM ends Python at once, and a
    benchmark killed that way left PostgreSQL, MariaDB and a Spark Connect server running."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def describe_machine() -> str:
    """One line: CPU model, cores, memory, OS, Python and Java versions."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = "no java"
    if shutil.which("java"):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
        java = out[0] if out else java
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, {java}"
    )


def describe_code() -> str:
    """The commit the benchmark ran (``git rev-parse``), and whether the tree had uncommitted changes."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "Code: not a git checkout."
    return f"Code: commit {sha}" + (", with uncommitted changes." if dirty else ".")


def write_results(block: str, begin: str, end: str, section: str) -> None:
    """Replace the ``begin``..``end`` block of BENCHMARKS.md with ``block`` (or append it under ``section``),
    with the commit that produced it (``describe_code``) as the block's first line."""
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
    if "Code: commit" not in block:
        body = block.removeprefix(begin).lstrip("\n")
        block = f"{begin}\n{describe_code()}\n\n{body}"
    text = path.read_text()
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _m: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + f"\n\n## {section}\n\n" + block + "\n"
    path.write_text(text)


def _stat_cpu_s(stat_path: str) -> float:
    """User + system CPU seconds from a /proc ``stat`` file (a process's or a thread's)."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (Linux /proc)."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


def _tree(pid: int) -> Iterator[int]:
    """``pid`` and its descendants, breadth first, as /proc lists them; processes gone meanwhile are skipped."""
    queue = [pid]
    while queue:
        current = queue.pop(0)
        try:
            with open(f"/proc/{current}/task/{current}/children") as f:
                queue.extend(int(x) for x in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
        yield current


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants (Linux /proc)."""
    total = 0.0
    for current in _tree(pid):
        try:
            total += process_cpu_s(current)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def find_in_tree(pid: int, comm: str) -> int | None:
    """The first process named ``comm`` (its /proc ``comm``) in ``pid``'s tree, itself included."""
    for current in _tree(pid):
        try:
            with open(f"/proc/{current}/comm") as f:
                if f.read().strip() == comm:
                    return current
        except (FileNotFoundError, ProcessLookupError):
            continue
    return None


# HotSpot's thread names: "C2 CompilerThread0", "C1 CompilerThread0", "GC Thread#0", "G1 Conc#0",
# "G1 Refine#0", "G1 Service", "VM Thread" (safepoint work, GC pauses of the serial parts).
_JIT_THREAD = re.compile(r"C[12] CompilerThre")
_GC_THREAD = re.compile(r"GC Thread|G1 |VM Thread|ParGC|Sweeper")


def jvm_cpu_by_role(pid: int) -> dict[str, float]:
    """A JVM's CPU seconds so far (Linux /proc): ``total`` (every thread, ended ones included),
    ``jit`` (its compiler threads), ``gc`` (collector, VM and code-sweeper threads)."""
    out = {"total": process_cpu_s(pid), "jit": 0.0, "gc": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            cpu = _stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended in between
        if _JIT_THREAD.match(name):
            out["jit"] += cpu
        elif _GC_THREAD.match(name):
            out["gc"] += cpu
    return out
