"""Run a program in a new session as another user: `python -m eventos.local.drop_exec UID GID SIG --
PROGRAM ARGS…` (UID -1: stay who we are; SIG > 0: the signal the program gets when the process
that started it dies).

The embedded PostgreSQL runs as an unprivileged user when we are root. Changing credentials
between fork and exec of a busy process with threads is not safe (glibc's setxid broadcast;
a fault run's restart of PostgreSQL died of SIGSEGV there, with a `preexec_fn` and with Popen's
`user=` alike), so the busy process only spawns this fresh, single-threaded one
(`posix_spawn`, no fork handlers), which changes what it must and execs the program.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    uid, gid, sig = (int(a) for a in argv[:3])
    if argv[3] != "--" or len(argv) < 5:
        raise SystemExit("usage: python -m eventos.local.drop_exec UID GID SIG -- PROGRAM ARGS...")
    os.setsid()
    if uid >= 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if sig > 0:  # after the credentials change, which would clear it
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    os.execv(argv[4], argv[4:])


if __name__ == "__main__":
    main(sys.argv[1:])
