"""What machine a benchmark ran on, for BENCHMARKS.md."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys


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


def write_results(block: str, begin: str, end: str, section: str) -> None:
    """Replace the ``begin``..``end`` block of BENCHMARKS.md with ``block`` (or append it under ``section``)."""
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
    text = path.read_text()
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _m: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + f"\n\n## {section}\n\n" + block + "\n"
    path.write_text(text)
