"""Looking at processes the tests started (Linux ``/proc``)."""


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
