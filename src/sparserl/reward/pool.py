"""Checker processes: run reward checks with a per-check deadline, several at once.

Why processes. A check that runs past its deadline must be stopped, and only a process can be
stopped from outside: a Python thread cannot be killed (an abandoned one keeps a core busy until
sympy gives up), and math-verify's own timeouts use ``signal.alarm``, which works only in the main
thread of a process and shares its one timer with the caller's. So each check runs in the main
thread of a worker process, under two limits:

1. the worker arms its own ``ITIMER_REAL`` for the check's ``timeout``; the handler raises inside
   the check (pure-Python sympy work is interrupted there), the worker answers "timeout" and stays
   alive, ready for the next check;
2. the parent kills (SIGKILL) a worker that has not answered ``KILL_GRACE_S`` after the deadline
   (stuck inside C code that never returns to the interpreter: a regex, a huge integer power) and
   starts a replacement, so no process keeps burning CPU.

A check that passes its deadline gets the outcome ``("timeout", None)``. :meth:`CheckPool.run`
takes a whole batch and keeps every worker busy until the batch is done.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one task (killing one of its
workers breaks the whole pool and every pending future), it does not tell when a queued task
starts (the deadline counts from the start of the check, not from submission), and the
``spawn``/``forkserver`` start methods of ``multiprocessing`` re-import the parent's ``__main__``
(a training script that imports torch) in every worker. The workers here are plain
``python -c`` subprocesses (fork + exec: safe after torch has started threads) that import only
``sparserl.reward`` and math-verify, not torch; they talk to the parent over a socket pair with
``multiprocessing.connection`` framing. A worker is ready about 1.3 s after it starts (importing
math-verify and one warm-up check; measured on a busy 2-core machine), and starts in the
background. A function new to a worker (a custom reward's module) is imported before its first
check's clock starts, so a slow import does not count against the deadline.

The module-level pool (:func:`get_pool`) is created lazily, reused, re-created in a forked child,
and shut down at exit. Its size is ``SPARSERL_REWARD_WORKERS`` or ``min(4, max(2, cpus // 2))``.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait_conns
from typing import Any

__all__ = ["CheckPool", "get_pool", "shutdown_pool", "in_worker", "default_workers", "KILL_GRACE_S", "Outcome"]

log = logging.getLogger(__name__)

#: seconds a worker may overrun a check's deadline before it is killed and replaced.
KILL_GRACE_S = 0.5
#: seconds a new worker may take to import and warm up before it counts as failed.
START_TIMEOUT_S = 60.0
#: consecutive start failures after which a batch gives up (its checks get "error").
MAX_START_FAILURES = 3

#: ``("ok", value)`` | ``("timeout", None)`` | ``("error", "Type: message")``.
Outcome = tuple[str, Any]

_IN_WORKER = False


def in_worker() -> bool:
    """Whether this process is a checker worker (code running there must not start a pool)."""
    return _IN_WORKER


def default_workers() -> int:
    """``$SPARSERL_REWARD_WORKERS``, else ``min(4, max(2, cpu_count // 2))``."""
    env = os.environ.get("SPARSERL_REWARD_WORKERS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            log.warning("SPARSERL_REWARD_WORKERS=%r is not an integer; using the default", env)
    return min(4, max(2, (os.cpu_count() or 2) // 2))


_RESOLVED: dict[str, Callable[..., Any]] = {}


def _resolve(ref: str) -> Callable[..., Any]:
    """``"package.module:attr.path"`` → the object (imported once per process)."""
    fn = _RESOLVED.get(ref)
    if fn is None:
        module_name, _, attr = ref.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        fn = _RESOLVED[ref] = obj
    return fn


# ---------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------


class _Deadline(BaseException):
    """Raised by the worker's timer inside a check (BaseException: library code catching
    ``Exception`` cannot swallow it)."""


def _die_with_parent(poll_s: float = 0.5) -> None:
    """End this worker when the parent process dies, even mid-check: a daemon thread watches the
    parent pid. (Not PR_SET_PDEATHSIG: it fires when the parent *thread* that started the worker
    ends, which killed workers started from a short-lived thread.)"""

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _run_one(ref: str, args: tuple, timeout: float | None) -> Outcome:
    def _on_alarm(signum, frame):
        raise _Deadline()

    try:
        fn = _resolve(ref)  # outside the deadline: a first import may take seconds
        if timeout is not None and timeout > 0:
            signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return "ok", fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Deadline:
        return "timeout", None
    except BaseException as e:  # any failure of a check is reported, never fatal
        return "error", f"{type(e).__name__}: {str(e)[:500]}"


def _worker_main(fd: int, preload: Sequence[str]) -> None:
    """Body of a worker process: warm up, say ready, then answer checks until told to stop."""
    global _IN_WORKER
    _IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    _die_with_parent()
    conn = Connection(fd)
    for ref in preload:
        try:
            _resolve(ref)()
        except Exception as e:
            print(f"sparserl reward worker: preload {ref} failed: {e}", file=sys.stderr)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task_id, ref, args, timeout, path = msg
        if path is not None:
            sys.path[:] = path
        if ref not in _RESOLVED:  # first use of ref here: import it, then say so
            try:
                _resolve(ref)
            except BaseException:  # reported by _run_one below
                pass
            conn.send(("started", task_id))
        status, value = _run_one(ref, args, timeout)
        try:
            conn.send((task_id, status, value))
        except (EOFError, OSError):
            return
        except Exception as e:  # an unpicklable result
            conn.send((task_id, "error", f"result not transferable: {type(e).__name__}: {e}"))


_BOOT = (
    "import os, sys; sys.path[:0] = [p for p in os.environ.pop('_SPARSERL_SYS_PATH', '')"
    ".split(os.pathsep) if p]; from sparserl.reward.pool import _worker_main; "
    "_worker_main(int(sys.argv[1]), sys.argv[2:])"
)


# ---------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, preload: Sequence[str]):
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        env["_SPARSERL_SYS_PATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(child_sock.fileno()), *preload],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
            )
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.started = time.monotonic()
        self.ready = False
        self.task: tuple[int, float] | None = None  # (index in the batch, kill time)
        self.sys_path: list[str] | None = None
        self.refs: set[str] = set()  # functions this worker has imported

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5.0)
        except Exception:  # already gone
            pass
        try:
            self.conn.close()
        except OSError:
            pass


class CheckPool:
    """A fixed number of checker processes, started lazily (see the module docstring).

    ``preload``: ``"module:function"`` refs each worker calls once before it says ready (imports
    and warm-up, so that the first check does not pay them inside its deadline).
    """

    def __init__(self, workers: int | None = None, preload: Sequence[str] = ()):
        self.size = max(1, int(workers or default_workers()))
        self.preload = tuple(preload)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the missing workers without waiting for them (they warm up in the background)."""
        with self._lock:
            self._fill()

    def _fill(self) -> None:
        if self._closed:
            raise RuntimeError("CheckPool is closed")
        while len(self._workers) < self.size:
            try:
                self._workers.append(_Worker(self.preload))
            except Exception as e:  # cannot start processes here: fewer workers
                log.error("cannot start a reward worker: %s: %s", type(e).__name__, e)
                break

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers.remove(w)
        if not self._closed:
            self._fill()

    def resize(self, workers: int) -> None:
        """Grow to ``workers`` processes (the pool never shrinks)."""
        with self._lock:
            self.size = max(self.size, int(workers))

    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        """Stop every worker (idle ones are asked to exit, busy or starting ones are killed)."""
        if os.getpid() != self._pid:
            return  # an inherited copy in a forked child: the parent owns the processes
        with self._lock:
            self._closed = True
            polite = [w for w in self._workers if w.ready and w.task is None]
            for w in polite:
                try:
                    w.conn.send(None)
                except Exception:
                    pass
            end = time.monotonic() + 1.0
            for w in polite:
                try:
                    w.proc.wait(timeout=max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            for w in self._workers:
                w.kill()  # busy, still starting, or slow to leave
            self._workers = []

    # -- work -----------------------------------------------------------------------------------
    def run(self, calls: Sequence[tuple[str, tuple]], timeout: float | None) -> list[Outcome]:
        """Run ``fn(*args)`` for each ``(ref, args)`` of ``calls`` (``ref`` = ``"module:function"``),
        each under ``timeout`` seconds (None: no limit); returns one :data:`Outcome` per call,
        in order. Never raises for a failing, crashing or hanging check."""
        n = len(calls)
        out: list[Outcome | None] = [None] * n
        if n == 0:
            return []
        with self._lock:
            self._fill()
            todo = deque(range(n))
            path = list(sys.path)
            start_failures = 0
            limit = float("inf") if timeout is None or timeout <= 0 else timeout + KILL_GRACE_S
            while todo or any(w.task is not None for w in self._workers):
                # hand work to idle, ready workers
                for w in list(self._workers):
                    if not todo:
                        break
                    if not w.ready or w.task is not None:
                        continue
                    i = todo.popleft()
                    ref, args = calls[i]
                    try:
                        w.conn.send((i, ref, tuple(args), timeout, path if w.sys_path != path else None))
                    except (OSError, EOFError):  # the worker died while idle
                        todo.appendleft(i)
                        self._replace(w)
                        continue
                    except Exception as e:  # arguments that cannot be pickled
                        out[i] = ("error", f"arguments not transferable: {type(e).__name__}: {e}")
                        continue
                    w.sys_path = path
                    # a function new to this worker is imported first ("started" comes after it,
                    # and resets the clock): the import is not part of the check's deadline
                    grace = 0.0 if ref in w.refs else START_TIMEOUT_S
                    w.refs.add(ref)
                    w.task = (i, time.monotonic() + limit + grace)
                if not todo and all(w.task is None for w in self._workers):
                    break
                if todo and (not self._workers or start_failures >= MAX_START_FAILURES):
                    log.error("reward workers fail to start; %d checks score as errors", len(todo))
                    while todo:
                        out[todo.popleft()] = ("error", "reward workers failed to start")
                    if not any(w.task is not None for w in self._workers):
                        break
                # wait for an answer, a ready message, or the next deadline
                waiting = [w for w in self._workers if w.task is not None or not w.ready]
                due = [w.task[1] if w.task is not None else w.started + START_TIMEOUT_S for w in waiting]
                wait_s = max(0.0, min(due) - time.monotonic()) if due else 0.0
                by_conn = {w.conn: w for w in waiting}
                for conn in _wait_conns(list(by_conn), min(wait_s, 3600.0)):
                    w = by_conn[conn]
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        code = w.proc.poll()
                        if w.task is not None:
                            out[w.task[0]] = ("error", f"reward worker died (exit code {code})")
                        elif not w.ready:
                            start_failures += 1
                            log.warning("reward worker failed to start (exit code %s)", code)
                        self._replace(w)
                        continue
                    if msg[0] == "ready":
                        w.ready = True
                        start_failures = 0
                    elif msg[0] == "started":
                        if w.task is not None and w.task[0] == msg[1]:
                            w.task = (msg[1], time.monotonic() + limit)
                    elif w.task is not None and msg[0] == w.task[0]:
                        out[msg[0]] = (msg[1], msg[2])
                        w.task = None
                # kill what overran its deadline (or never started)
                now = time.monotonic()
                for w in list(self._workers):
                    if w.task is not None and now >= w.task[1]:
                        out[w.task[0]] = ("timeout", None)
                        log.debug("reward check %d overran its deadline: worker %d killed", w.task[0], w.proc.pid)
                        self._replace(w)
                    elif not w.ready and w.task is None and now >= w.started + START_TIMEOUT_S:
                        start_failures += 1
                        log.warning("reward worker %d did not start within %.0f s", w.proc.pid, START_TIMEOUT_S)
                        self._replace(w)
        return [o if o is not None else ("error", "not run") for o in out]


# ---------------------------------------------------------------------------------------------
# The module-level pool
# ---------------------------------------------------------------------------------------------

_POOL: CheckPool | None = None
_POOL_LOCK = threading.Lock()
_ATEXIT = False
#: what every worker of the shared pool imports and warms up before it says ready.
DEFAULT_PRELOAD = ("sparserl.reward.math:warm_up",)


def get_pool(workers: int | None = None) -> CheckPool:
    """The shared pool (created on first use, re-created after a fork, grown to ``workers``)."""
    global _POOL, _ATEXIT
    with _POOL_LOCK:
        if _POOL is None or _POOL._pid != os.getpid() or _POOL._closed:
            _POOL = CheckPool(workers, preload=DEFAULT_PRELOAD)
            if not _ATEXIT:
                atexit.register(shutdown_pool)
                _ATEXIT = True
        elif workers and workers > _POOL.size:
            _POOL.resize(workers)
        return _POOL


def shutdown_pool() -> None:
    """Stop the shared pool's workers (registered with ``atexit``; a later use starts new ones)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()
