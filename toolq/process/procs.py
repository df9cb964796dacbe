"""Starting child processes that never outlive toolq.

Linux's ``PR_SET_PDEATHSIG`` kills a child when the thread that forked it
exits, so every child is forked from one daemon thread that lives as long as
the process (:class:`Spawner`), with the death signal armed before ``exec``.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn that makes the child die with its parent (Linux only).

    ``prctl`` is looked up here, in the parent, so that the child between fork
    and exec only makes the call.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)

    return preexec


class Spawner:
    """Forks every server from one daemon thread that lives as long as the process.

    A daemon thread is never joined: it exists until the process exits, after
    the atexit handlers have stopped the servers gracefully. It is recreated
    in a forked child, where the parent's thread does not exist.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()

    def popen(self, launch: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._pid != os.getpid():
                self._requests = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._run, args=(self._requests,), name="toolq-valkey-spawner"
                )
                thread.daemon = True
                thread.start()
                self._pid = os.getpid()
            future: Future[subprocess.Popen[bytes]] = Future()
            self._requests.put((launch, future))
        return future.result()

    @staticmethod
    def _run(
        requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ],
    ) -> None:
        while True:
            launch, future = requests.get()
            try:
                future.set_result(launch())
            except BaseException as exc:
                future.set_exception(exc)


#: The process-wide spawner.
spawner = Spawner()


def descendants(pid: int) -> list[int]:
    """Every live (not zombie) descendant of ``pid``, parents before children (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found
