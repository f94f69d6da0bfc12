"""Multiprocessing: worker processes stepping blocks of envs over shared memory.

Layout. ONE multiprocessing.shared_memory segment holds the seven row buffers
of all workers (worker w owns rows [w*R, (w+1)*R)), then one 64-byte line per
worker holding its command flag, then one line holding a shutdown word. Each
worker builds its block of envs (see recipe.py) *inside* the worker, writing
straight into its rows: a native batch's C loop writes into shared memory
(zero-copy), and no env or thread pool ever crosses a fork.

Protocol. The parent writes STEP (or MESSAGE, after sending the message on
the worker's pipe) into the worker's flag; the worker busy-waits on the flag,
does the work and writes DONE (or ERROR, after sending the traceback). Waiting
on either side busy-waits on the flags for a few tens of microseconds, then
backs off to sleeping on a semaphore (one per worker to wake it, one shared
for "something finished"), so idle workers cost no CPU and a sleeping side
wakes in one futex hand-off instead of a polling interval. A semaphore token
only means "look at the flags again"; the flags are the truth. Steps never
touch the pipes. Each flag has one writer at a time (the parent while the
worker is idle, the worker while it is busy). Busy-waiting relies on stores
becoming visible in program order: true on x86. On weaker memory models
(ARM) only the semaphore path is a full barrier; a spinning reader there
would need an explicit fence, which Python cannot issue.

Batches. With batch_size == num_envs, `step` sends to every worker and
returns the shared buffers themselves. With batch_size < num_envs, `send` /
`recv` keep `num_envs - batch_size` envs stepping while the caller works:
`recv` returns the first `batch_size / envs_per_worker` workers to finish,
ordered by worker index; when they are a contiguous run of workers the
returned arrays are views of the shared buffers (zero-copy), otherwise they
are gathered into batch buffers.

Plain scripts. With "spawn" and "forkserver" every worker re-imports the main
script before it runs anything; a script that creates the vector env at its top
level, without an `if __name__ == "__main__":` guard, would make every worker
start workers of its own, which multiprocessing refuses with a raw traceback in
each worker. Before starting any worker the parent looks at where it was called
from: top-level code of the main script outside such a guard is refused with a
RuntimeError saying what to do (`unguarded_main_call`). A worker that still ends
this way (code run through exec, say) makes the parent's error say so.

Failure. A worker exception reaches the parent as WorkerError carrying the
worker's traceback (the worker keeps serving). A worker that dies (a signal,
os._exit) is noticed within ~50 ms by polling the process sentinels while
waiting: WorkerDiedError, and the whole vector env is closed. A worker that
hangs (a step that never returns) cannot be told from a slow one, so by
default the parent waits (Ctrl-C still works), warning once a wait after
STALL_SECONDS (60 s) with the workers named; with `timeout=SECONDS` a
command unanswered for that long raises WorkerTimeoutError, and the workers
are killed and the segment freed as for a dead worker. `close()`,
garbage collection, interpreter exit and Ctrl-C stop every worker.

Lifetime. Workers ignore SIGINT and SIGTERM: Ctrl-C and a scheduler's
preemption belong to the parent (a trainer saves its checkpoint through them),
even where they reach the whole process group. They die with the parent
instead (lifetime.py): the kernel kills them when it dies (Linux, when the env
was made on the parent's main thread), and a watcher thread ends them
otherwise, so a worker stuck inside an env's step is no orphan either. The
segment's name is unlinked from /dev/shm as soon as every worker has mapped it
(the mapping lives on until the last process unmaps it), so no way of ending,
`kill -9` of every process included, leaves it behind; the semaphores' names
are removed by Python's resource tracker once the parent and workers are gone.

Shared-memory space. The segment lives in /dev/shm, a tmpfs that Docker makes
64 MiB by default. tmpfs allocates pages when they are first touched, so a
segment larger than the free space was created without complaint and a worker
(or the parent) died of SIGBUS seconds later, on the first write past the end of
the space. Before any worker starts, the segment's size is compared with
/dev/shm's free space (os.statvfs) and refused (ShmSpaceError, a ValueError)
with the `docker run --shm-size=SIZE` that fits it, SIZE computed from the
buffers; the segment's pages are then reserved at once (posix_fallocate), so
space taken by someone else later cannot turn into a SIGBUS inside the run. A
worker that still dies of SIGBUS gets an error that says shared memory ran out.
"""
from __future__ import annotations

import ast
import errno
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from multiprocessing import get_context, shared_memory
from typing import Any

import numpy as np

from ..envs.native.batch import ResetResult, StepResult
from .base import VectorBase
from .common import (BUFFER_NAMES, Buffers, EpisodeStats, available_cores, check_count,
                     merge_sums, resolve_seed, slice_buffers, stats_to_sums,
                     warn_if_oversubscribed)
from .lifetime import die_with_parent, watch_parent
from .recipe import EnvRecipe

DONE, STEP, MESSAGE, ERROR, STARTING = 0, 1, 2, 3, 4
_LINE = 64
# Spin windows. Measured on a shared, oversubscribed 2-core machine: spinning
# longer than a few tens of microseconds only steals CPU from whoever holds the
# result (200 us windows made a step 5-10x slower than sleeping at once), while
# a semaphore wake-up costs ~10-30 us. The parent spins only when every worker
# and the parent can have a core of their own.
_WORKER_SPIN_SECONDS = 50e-6   # worker: busy-wait this long for the next command
_PARENT_SPIN_SECONDS = 10e-6   # parent: busy-wait this long for results (if cores allow)
_LIVENESS_PERIOD = 0.05        # parent: check worker processes this often while waiting
_PARENT_CHECK_PERIOD = 0.5     # worker: check the parent this often while sleeping
_MAX_TRACEBACK = 32_000
STALL_SECONDS = 60.0    # a wait this long without a timeout set warns once (StallWarning)
# Where Peregrine's own modules live: an exception raised there is one of its checks.
_PACKAGE = os.path.realpath(os.path.join(os.path.dirname(__file__), "..")) + os.sep


GUARD_ADVICE = ('put the code that runs the script under `if __name__ == "__main__":` (spawn '
                'and forkserver workers re-import the main script), or pass start_method="fork" '
                'if nothing in this process runs threads')


def _is_main_guard(node) -> bool:
    """`if __name__ == "__main__":` (either operand order)."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq)):
        return False
    operands = [node.test.left, *node.test.comparators]
    return (any(isinstance(o, ast.Name) and o.id == "__name__" for o in operands)
            and any(isinstance(o, ast.Constant) and o.value == "__main__" for o in operands))


def _line_is_guarded(tree, line: int) -> bool:
    """Whether line `line` of the module lies inside an `if __name__ == "__main__":`
    block or a function/class body (code an import does not run)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if not isinstance(node, ast.If) or _is_main_guard(node):
                return True
    return False


def unguarded_main_call() -> tuple[str, int] | None:
    """(path, line) of the main script's top-level statement that led to this
    call when that statement runs on import (no `__main__` guard around it); None
    when the call comes from guarded or imported code, or the script is unknown."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not path.endswith(".py"):
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main)
                                     and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    return None if _line_is_guarded(tree, line) else (path, line)


def _refuse_unguarded_start(start_method: str) -> None:
    if start_method == "fork":
        return
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # We are a worker re-importing an unguarded script (the parent could not tell).
        raise RuntimeError(f"peregrine.vector: this process is a {start_method} worker "
                           f"importing the main script, which creates a Multiprocessing env "
                           f"at its top level; {GUARD_ADVICE}")
    found = unguarded_main_call()
    if found is not None:
        path, line = found
        raise RuntimeError(f"peregrine.vector: Multiprocessing with start_method="
                           f"{start_method!r} is created at the top level of the script "
                           f"{path} (line {line}) with no `if __name__ == \"__main__\":` guard; "
                           f"every worker would run that line again on start-up. To fix it, "
                           f"{GUARD_ADVICE}.")


class WorkerError(RuntimeError):
    """An exception raised inside a worker; the message holds its traceback (each
    failed worker's). `summary` names the first one and its last line ("in vector env
    worker 1: ValueError: env 8 returned a reward that is not a finite number: nan");
    `env_traceback` its traceback when the exception was raised in the env's own code
    (empty when one of Peregrine's checks refused what the env returned, which the
    summary says whole)."""

    def __init__(self, message: str, summary: str = "", env_traceback: str = ""):
        super().__init__(message)
        self.summary = summary or message
        self.env_traceback = env_traceback


class StallWarning(RuntimeWarning):
    """Workers have not answered for STALL_SECONDS with no timeout set: a hung env?"""


class WorkerDiedError(RuntimeError):
    """A worker process exited unexpectedly (killed by a signal, os._exit, ...)."""


class WorkerTimeoutError(WorkerDiedError):
    """A worker did not answer within the vector env's `timeout`; it was killed."""


class ShmSpaceError(ValueError):
    """/dev/shm has no room for the shared buffers (a Docker container's 64 MiB
    default, say): refused before any worker starts."""


SHM_DIR = "/dev/shm"
_MIB = 1 << 20


def shm_space(path: str = SHM_DIR) -> tuple[int, int] | None:
    """(free bytes, total bytes) of the shared-memory filesystem; None where there
    is none to ask (not Linux)."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize, info.f_blocks * info.f_frsize


def shm_size_advice(needed: int, space: tuple[int, int] | None = None) -> str:
    """`docker run --shm-size=SIZE` with a SIZE that holds what is in /dev/shm now
    plus `needed` bytes, with a quarter on top, rounded up to 64 MiB."""
    space = shm_space() if space is None else space
    used = 0 if space is None else max(0, space[1] - space[0])
    size = -(-(used + needed) * 5 // 4 // (64 * _MIB)) * 64 * _MIB
    size = max(size, 128 * _MIB)
    text = f"{size // 1024 // _MIB}g" if size % (1024 * _MIB) == 0 else f"{size // _MIB}m"
    return f"docker run --shm-size={text}"


def check_shm_space(needed: int, what: str = "the vector env's shared buffers") -> None:
    """ShmSpaceError when /dev/shm has fewer than `needed` bytes free."""
    space = shm_space()
    if space is None or needed <= space[0]:
        return
    free, total = space
    raise ShmSpaceError(
        f"{what} need {needed / _MIB:.1f} MiB of shared memory, but {SHM_DIR} has "
        f"{free / _MIB:.1f} MiB free (of {total / _MIB:.1f} MiB); workers would die of SIGBUS "
        f"when it runs out. In a container, give it more: {shm_size_advice(needed, space)} "
        f"(Kubernetes: an emptyDir with medium: Memory mounted at {SHM_DIR}); or lower "
        f"vec.num_envs")


def _reserve(shm: shared_memory.SharedMemory, size: int) -> None:
    """Allocates the segment's pages now (tmpfs allocates on first touch), so a full
    /dev/shm is an error here instead of a SIGBUS later. A no-op where the
    platform or filesystem cannot."""
    fd = getattr(shm, "_fd", -1)
    if fd < 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.ENOMEM):
            raise ShmSpaceError(
                f"the vector env's shared buffers need {size / _MIB:.1f} MiB of shared memory, "
                f"but {SHM_DIR} ran out while reserving them; in a container, give it more: "
                f"{shm_size_advice(size)}; or lower vec.num_envs") from None
        # EOPNOTSUPP, EINVAL: a filesystem without fallocate; pages come on first touch


def _layout_segment(layout, num_workers):
    """Byte offsets of every buffer, the flags and the shutdown word."""
    offsets, offset = {}, 0
    for name in BUFFER_NAMES:
        shape, dtype = layout[name]
        offsets[name] = (offset, shape, np.dtype(dtype).str)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        offset += (nbytes + _LINE - 1) // _LINE * _LINE
    flags_offset = offset
    shutdown_offset = flags_offset + num_workers * _LINE
    return offsets, flags_offset, shutdown_offset, shutdown_offset + _LINE


def _views(buf, offsets):
    return {name: np.frombuffer(buf, np.dtype(dtype), int(np.prod(shape)), offset).reshape(shape)
            for name, (offset, shape, dtype) in offsets.items()}


def _flag(buf, offset):
    return buf[offset:offset + 4].cast("i")


# ---- the worker --------------------------------------------------------------

@dataclass(frozen=True)
class WorkerSpec:
    """Everything worker `index` of a Multiprocessing env is given when it starts:
    where its rows and its flag live, what to build there and how to reach the
    parent. It is the worker process's only argument; multiprocessing pickles it
    while spawning, which is what lets the pipe end and the semaphores travel."""

    index: int                  # which worker: its rows are [index, index + 1) * rows_per_worker
    segment_name: str           # the shared-memory segment holding every worker's rows
    offsets: dict               # buffer name -> (byte offset, shape, dtype string)
    flags_offset: int           # byte offset of worker 0's command flag (one line per worker)
    shutdown_offset: int        # byte offset of the shutdown word
    recipe: bytes               # the EnvRecipe, cloudpickled (a callable may be a lambda)
    envs_per_worker: int
    envs_per_unit: int          # envs one call of the user's callable makes (1 when native)
    agents_per_env: int
    rows_per_worker: int
    seed: int | None            # the vector env's seed; every unit derives its own
    parent_pid: int             # the process that owns the env
    start_method: str           # multiprocessing's: a forkserver child's parent is the server
    main_thread: bool           # forked by the parent's main thread (so PDEATHSIG is safe)
    connection: Any             # this worker's end of its pipe (messages, replies, tracebacks)
    wake: Any                   # semaphore, parent -> this worker: "look at your flag"
    done: Any                   # semaphore shared by every worker -> parent: "something finished"
    spin_seconds: float = _WORKER_SPIN_SECONDS   # busy-wait before sleeping on `wake`


def _worker_main(spec: WorkerSpec) -> None:
    # Ctrl-C and preemption belong to the parent, which stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()      # the env's process, or the forkserver that forked us
    if spec.start_method != "forkserver" and parent != spec.parent_pid:
        return                 # the parent died before this worker got going
    if spec.main_thread:
        die_with_parent(parent)
    watch_parent(parent, _PARENT_CHECK_PERIOD)
    conn, done = spec.connection, spec.done
    shm = shared_memory.SharedMemory(name=spec.segment_name)
    flag = _flag(shm.buf, spec.flags_offset + spec.index * _LINE)
    shutdown = _flag(shm.buf, spec.shutdown_offset)
    block = views = rows = None
    try:
        views = _views(shm.buf, spec.offsets)
        first, stop = spec.index * spec.rows_per_worker, (spec.index + 1) * spec.rows_per_worker
        rows = {name: array[first:stop] for name, array in views.items()}
        try:
            import cloudpickle
            recipe = cloudpickle.loads(spec.recipe)
            block = recipe.build_block(spec.index, spec.envs_per_worker, spec.envs_per_unit,
                                       spec.agents_per_env, rows, spec.seed)
        except BaseException:
            _report(conn, flag, done)
            return
        flag[0] = DONE
        done.release()
        step = block.step
        while True:
            command = _wait_for_command(flag, shutdown, spec.wake, parent, spec.spin_seconds)
            if command == STEP:
                try:
                    step()
                    flag[0] = DONE
                except Exception:
                    _report(conn, flag, done)
                    continue
            elif command == MESSAGE:
                try:
                    conn.send(("ok", _handle(block, conn.recv())))
                    flag[0] = DONE
                except Exception:
                    _report(conn, flag, done)
                    continue
            else:
                return
            done.release()
    finally:
        if block is not None:
            block.close()
        block = views = rows = None
        flag.release()
        shutdown.release()
        try:
            shm.close()
        except BufferError:
            pass


def _wait_for_command(flag, shutdown, wake, parent, spin_seconds):
    """Busy-waits a little for STEP/MESSAGE, then sleeps on the wake semaphore;
    None when it is time to exit (shutdown, or the parent `parent` is gone)."""
    command = flag[0]
    if command == STEP or command == MESSAGE:
        return command
    spin_until = time.perf_counter() + spin_seconds
    while True:
        command = flag[0]
        if command == STEP or command == MESSAGE:
            break
        if shutdown[0]:
            return None
        if time.perf_counter() > spin_until:
            # A token means "look again": stale ones (commands caught while
            # spinning) only cost one extra look.
            if not wake.acquire(timeout=_PARENT_CHECK_PERIOD) and os.getppid() != parent:
                return None  # the parent is gone: nobody will ever send work
    while wake.acquire(False):  # drop tokens of commands already seen
        pass
    return command


def _report(conn, flag, done):
    """Sends the exception being handled to the parent: its traceback, its last line,
    and whether Peregrine's own code raised it (a check refusing what the env returned)."""
    kind, error, trace = sys.exc_info()
    text = traceback.format_exc()
    if len(text) > _MAX_TRACEBACK:
        text = text[:2000] + "\n...\n" + text[-(_MAX_TRACEBACK - 2000):]
    frames = traceback.extract_tb(trace)
    ours = bool(frames) and os.path.realpath(frames[-1].filename).startswith(_PACKAGE)
    summary = traceback.format_exception_only(kind, error)[-1].strip()
    try:
        conn.send(("error", text, summary, ours))
    finally:
        flag[0] = ERROR
        done.release()


def _handle(block, message):
    kind = message[0]
    if kind == "reset":
        block.reset(message[1])
        return None
    if kind == "stats":
        return stats_to_sums(block.episode_stats(message[1]))
    if kind == "seed_streams":
        block.seed_streams(message[1])
        return None
    if kind == "get_state":
        return block.get_state(message[1])
    if kind == "set_state":
        block.set_state(message[1], message[2])
        return None
    if kind == "raise":  # for tests: an exception inside the worker
        raise RuntimeError(message[1])
    raise ValueError(f"unknown message {kind!r}")


# ---- the parent ----------------------------------------------------------------

class _sigint_deferred:
    """Blocks SIGINT in the main thread for a short critical section; a Ctrl-C
    arriving meanwhile is delivered (as KeyboardInterrupt) right after it."""

    def __enter__(self):
        self.active = threading.current_thread() is threading.main_thread()
        if self.active:
            self.previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    def __exit__(self, *exc):
        if self.active:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.previous)


@dataclass
class _WorkerHandle:
    """The parent's side of one worker."""

    flag: memoryview            # its command flag in the segment
    process: Any = None
    connection: Any = None      # the parent's end of its pipe
    wake: Any = None            # its wake semaphore


class _Resources:
    """Everything a Multiprocessing env owns, in one place: the segment, its
    shutdown word, the shared "done" semaphore and one _WorkerHandle per worker.
    Creation fills it, and `close()` (reached by garbage collection too, without
    the env) frees all of it, walking the same list."""

    def __init__(self):
        self.shm = None
        self.shutdown = None
        self.done = None
        self.workers: list[_WorkerHandle] = []

    def close(self):
        workers, self.workers = self.workers, []
        if self.shutdown is not None:
            try:
                self.shutdown[0] = 1
            except ValueError:
                pass
        for worker in workers:
            if worker.wake is not None:
                worker.wake.release()
        started = [w.process for w in workers if w.process is not None]
        deadline = time.monotonic() + 2.0
        for process in started:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in started:
            if process.is_alive():     # workers ignore SIGTERM: straight to SIGKILL
                process.kill()
                process.join(1.0)
            try:
                process.close()
            except ValueError:
                pass
        for worker in workers:
            if worker.connection is not None:
                worker.connection.close()
            worker.flag.release()
        if self.shutdown is not None:
            self.shutdown.release()
        self.shutdown = self.done = None
        shm, self.shm = self.shm, None
        if shm is not None:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
            try:
                shm.close()
            except BufferError:
                # Arrays the caller still holds map the segment: it is already
                # unlinked, and the mapping goes away with the last of them.
                shm._buf = None
                shm._mmap = None
                shm.close()


class Multiprocessing(VectorBase):
    """`num_workers` processes, each stepping `num_envs / num_workers` envs in
    its rows of one shared-memory segment (see the module docstring)."""

    def __init__(self, recipe: EnvRecipe, num_envs: int, num_workers: int = 1,
                 batch_size: int | None = None, seed: int | None = None, overwork: bool = False,
                 start_method: str = "spawn", timeout: float | None = None) -> None:
        if timeout is not None and not (isinstance(timeout, (int, float))
                                        and not isinstance(timeout, bool) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, "
                             f"got {timeout!r}")
        self._timeout = None     # start-up (imports, env construction) is not timed
        if start_method not in ("spawn", "forkserver", "fork"):
            raise ValueError(f"start_method must be 'spawn', 'forkserver' or 'fork', "
                             f"got {start_method!r}")
        _refuse_unguarded_start(start_method)
        cores = available_cores()
        if isinstance(num_workers, int) and not overwork:
            warn_if_oversubscribed(
                num_workers, "workers",
                f"Set vec.num_workers to at most {cores} (--vec.num-workers {cores}, or "
                f"\"auto\": one per core); from Python, Multiprocessing(..., overwork=True) "
                f"says it is intended and silences this.", stacklevel=3)
        self._parent_spin = _PARENT_SPIN_SECONDS if num_workers < cores else 0.0
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close)
        facts = recipe.probe()
        layout = self._setup(recipe, facts, num_envs, num_workers, batch_size)
        offsets, flags_offset, shutdown_offset, size = _layout_segment(layout, self.num_workers)
        check_shm_space(size)     # before any worker starts: a clear refusal, not a SIGBUS
        self._segment_size = size
        resources = self._resources
        resources.shm = shared_memory.SharedMemory(create=True, size=size)
        _reserve(resources.shm, size)
        buf = resources.shm.buf
        self._bind(Buffers(**_views(buf, offsets)))
        resources.workers = [_WorkerHandle(_flag(buf, flags_offset + w * _LINE))
                             for w in range(self.num_workers)]
        resources.shutdown = _flag(buf, shutdown_offset)
        self._workers = resources.workers
        # The busy-wait loops read the flags through this tuple (no attribute lookups).
        self._flags = tuple(worker.flag for worker in self._workers)
        for flag in self._flags:
            flag[0] = STARTING
        self._pending_reply = [False] * self.num_workers
        self._all_workers = list(range(self.num_workers))
        self._unsettled = []     # workers of an interrupted synchronous command
        self._inflight = []      # workers sent work whose result was not yet seen
        self._ready = []         # finished workers not yet returned by recv, in finish order
        self._batch = None       # workers returned by the last recv
        self._env_ids_all = np.arange(self.num_envs)
        self._gather = None
        self._replies = {}
        import cloudpickle
        recipe_bytes = cloudpickle.dumps(recipe)
        context = get_context(start_method)
        # one token per finished command, any worker
        self._done = resources.done = context.Semaphore(0)
        self._enable_exact_state()
        try:
            self._start_workers(context, offsets, flags_offset, shutdown_offset, recipe_bytes,
                                seed)
            self._wait(list(range(self.num_workers)))
            # Every worker has mapped the segment: its name can go (see Lifetime).
            resources.shm.unlink()
        except BaseException:
            self.close()
            raise
        self._timeout = timeout

    def _start_workers(self, context, offsets, flags_offset, shutdown_offset, recipe_bytes,
                       seed):
        # Children inherit an ignored SIGINT, so Ctrl-C during their start-up
        # cannot kill them half-way; the parent alone handles Ctrl-C.
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
        try:
            for index, handle in enumerate(self._workers):
                parent_conn, child_conn = context.Pipe()
                handle.wake = context.Semaphore(0)
                handle.connection = parent_conn
                spec = WorkerSpec(
                    index=index, segment_name=self._resources.shm.name, offsets=offsets,
                    flags_offset=flags_offset, shutdown_offset=shutdown_offset,
                    recipe=recipe_bytes, envs_per_worker=self.envs_per_worker,
                    envs_per_unit=self.envs_per_unit, agents_per_env=self.agents_per_env,
                    rows_per_worker=self.rows_per_worker, seed=seed, parent_pid=os.getpid(),
                    start_method=context.get_start_method(), main_thread=main_thread,
                    connection=child_conn, wake=handle.wake, done=self._done)
                process = context.Process(target=_worker_main, args=(spec,), daemon=True,
                                          name=f"peregrine-worker-{index}")
                try:
                    process.start()
                finally:
                    child_conn.close()
                handle.process = process
        finally:
            if main_thread:
                signal.signal(signal.SIGINT, previous)

    # ---- waiting -------------------------------------------------------------------
    def _check_alive(self):
        sentinels = [w.process.sentinel for w in self._workers]
        dead = mp_connection.wait(sentinels, timeout=0)
        if not dead:
            return
        worker = sentinels.index(dead[0])
        if self._flags[worker][0] == ERROR:
            return  # it reported an error before exiting: let the caller read it
        process = self._workers[worker].process
        process.join(0.1)
        code, pid = process.exitcode, process.pid
        how = (f"was killed by signal {signal.Signals(-code).name}" if code is not None
               and code < 0 else f"exited with code {code}")
        hint = ""
        if code == -signal.SIGBUS:
            hint = (f". SIGBUS here means shared memory ran out: {SHM_DIR} is full (a "
                    f"container's 64 MiB default, or other programs' segments); in a "
                    f"container, give it more: {shm_size_advice(self._segment_size)}; "
                    f"or lower vec.num_envs")
        elif code == 1 and self._flags[worker][0] == STARTING:
            hint = (f". It died while starting, before building its envs: if the main "
                    f"script creates this env when imported, {GUARD_ADVICE}")
        self.close()
        raise WorkerDiedError(f"worker {worker} (pid {pid}) {how}; the vector env "
                              f"is closed{hint}")

    def _wait(self, workers, count=None):
        """Waits until `count` (default all) of `workers` are DONE; returns them
        in finishing order. Raises WorkerError (after the others finish) or
        WorkerDiedError."""
        self._ensure_open()
        count = len(workers) if count is None else count
        pending = list(workers)
        finished, errors = [], []
        flags, done = self._flags, self._done
        start = time.perf_counter()
        spin_until = start + self._parent_spin
        next_check = start + _LIVENESS_PERIOD
        give_up = None if self._timeout is None else start + self._timeout
        stall_at = start + STALL_SECONDS if give_up is None else None
        while len(finished) < count or (errors and pending):
            progressed = False
            for worker in pending:
                state = flags[worker][0]
                if state == DONE:
                    finished.append(worker)
                    progressed = True
                elif state == ERROR:
                    errors.append(worker)
                    progressed = True
            if progressed:
                pending = [w for w in pending if w not in finished and w not in errors]
                if errors and len(finished) + len(errors) >= len(workers):
                    break
                continue
            now = time.perf_counter()
            if now < spin_until:
                continue
            if now > next_check:
                self._check_alive()
                next_check = now + _LIVENESS_PERIOD
                if give_up is not None and now > give_up:
                    self._timed_out(pending)
                if stall_at is not None and now > stall_at:
                    stall_at = None     # once a wait
                    warnings.warn(StallWarning(
                        f"vector env worker(s) {pending} have not answered for "
                        f"{now - start:.0f} s: an env whose step or reset never returns? "
                        f"Ctrl-C stops (twice, in training); vector.make(timeout=SECONDS) "
                        f"makes a stall an error"), stacklevel=2)
            # Sleep until some worker finishes something (a token may be stale:
            # then this is one extra look at the flags).
            done.acquire(timeout=_LIVENESS_PERIOD)
        while done.acquire(False):  # drop tokens of results already seen
            pass
        for worker in finished:
            if self._pending_reply[worker]:
                self._pending_reply[worker] = False
                status, payload = self._workers[worker].connection.recv()
                self._replies[worker] = payload
        if errors:
            messages, first = [], None
            for worker in errors:
                self._pending_reply[worker] = False
                _status, text, summary, ours = self._workers[worker].connection.recv()
                flags[worker][0] = DONE
                messages.append(f"--- worker {worker} ---\n{text}")
                first = first or (f"in vector env worker {worker}: {summary}", "" if ours else text)
            self._inflight = [w for w in self._inflight if w not in errors]
            raise WorkerError("exception in a vector env worker:\n" + "\n".join(messages), *first)
        return finished

    def _timed_out(self, pending):
        pids = [self._workers[w].process.pid for w in pending]
        for worker in pending:   # a hung worker would not see the shutdown word
            self._workers[worker].process.kill()
        self.close()
        raise WorkerTimeoutError(f"worker(s) {pending} (pid {pids}) did not answer within "
                                 f"timeout={self._timeout:g} s; they were stopped and the "
                                 "vector env is closed")

    def _ensure_open(self):
        if not self._finalizer.alive:
            raise RuntimeError("the vector env is closed")

    def _message(self, workers, message):
        """Sends `message` to `workers` (after earlier work ends); returns their replies."""
        self._ensure_open()
        self._settle()
        self._replies = {}
        self._unsettled = list(workers)
        # A Ctrl-C between a pipe write and its flag would desynchronise the
        # pipe from the flags: hold SIGINT back for those few microseconds.
        with _sigint_deferred():
            for worker in workers:
                handle = self._workers[worker]
                handle.connection.send(message)
                self._pending_reply[worker] = True
                handle.flag[0] = MESSAGE
                handle.wake.release()
        self._finish(workers)
        return [self._replies[w] for w in workers]

    def _message_all(self, message):
        return self._message(range(self.num_workers), message)

    def _finish(self, workers):
        """Waits for a synchronous command. If the wait is interrupted (Ctrl-C
        caught by the caller), `_unsettled` keeps the workers so the next
        command first waits for them and drops their replies."""
        try:
            self._wait(workers)
        except WorkerError:
            self._unsettled = []  # _wait raises only once every worker is done
            raise
        self._unsettled = []

    def _settle(self, include_async: bool = True):
        """Waits for all outstanding work: replies of interrupted commands are
        dropped, results of asynchronous steps stay queued for recv."""
        if self._unsettled:
            self._finish(self._unsettled)
        if include_async and self._inflight:
            finished = self._wait(self._inflight)
            self._ready.extend(finished)
            self._inflight = []

    # ---- the synchronous interface ---------------------------------------------------
    def reset(self, seed: int | None = None) -> ResetResult:
        self._message_all(("reset", None if seed is None else resolve_seed(seed)))
        self._inflight, self._ready, self._batch = [], [], None
        return self.observations, {}

    def step(self, actions: np.ndarray) -> StepResult:
        if self.batch_size != self.num_envs:
            raise ValueError(f"step() steps every env; with batch_size ({self.batch_size}) < "
                             f"num_envs ({self.num_envs}) use send() and recv()")
        self._ensure_open()
        if self._unsettled:
            self._settle()
        if actions is not self.actions:
            self._check_actions(actions, self.num_agents)
            self.actions[...] = actions
        workers = self._all_workers
        self._unsettled = workers
        for handle in self._workers:
            handle.flag[0] = STEP
            handle.wake.release()
        self._finish(workers)
        return self.observations, self.rewards, self.terminals, self.truncations, {}

    # ---- the asynchronous interface ------------------------------------------------------
    def async_reset(self, seed: int | None = None) -> None:
        """Resets every env; the following recv() returns the first batch."""
        self.reset(seed)
        self._ready = list(range(self.num_workers))

    def send(self, actions: np.ndarray) -> None:
        """Steps the envs returned by the last recv() with `actions` (their rows)."""
        self._ensure_open()
        if self._batch is None:
            raise RuntimeError("send() must follow recv() (call async_reset() then recv() first)")
        if self._unsettled:
            self._settle(include_async=False)
        batch, self._batch = self._batch, None
        rows = len(batch) * self.rows_per_worker
        if self._contiguous(batch):
            start = batch[0] * self.rows_per_worker
            target = self.actions[start:start + rows]
            if not _same_memory(actions, target):   # written in place: nothing to copy
                self._check_actions(actions, rows)
                target[...] = actions
        else:
            self._check_actions(actions, rows)
            self.actions[self._rows(batch)] = actions
        self._inflight.extend(batch)  # first: an interrupted loop below loses nothing
        self._command_step(batch)

    def recv(self) -> tuple:
        """(observations, rewards, terminals, truncations, infos, env_ids, masks) of
        the next batch_size envs to finish; env_ids are env indices (rows are
        env_id * agents_per_env + agent)."""
        self._ensure_open()
        if self._batch is not None:
            raise RuntimeError("recv() was called twice without send() in between")
        if self._unsettled:
            self._settle(include_async=False)
        need = self.workers_per_batch - len(self._ready)
        if need > 0:
            if need > len(self._inflight):
                raise RuntimeError("recv() has nothing to wait for: call async_reset() first")
            finished = self._wait(self._inflight, need)
            self._inflight = [w for w in self._inflight if w not in finished]
            self._ready.extend(finished)
        batch = sorted(self._ready[:self.workers_per_batch])
        self._ready = self._ready[self.workers_per_batch:]
        self._batch = batch
        if self._contiguous(batch):
            start = batch[0] * self.rows_per_worker
            stop = start + len(batch) * self.rows_per_worker
            env_start = batch[0] * self.envs_per_worker
            env_ids = self._env_ids_all[env_start:env_start + len(batch) * self.envs_per_worker]
            return (self.observations[start:stop], self.rewards[start:stop],
                    self.terminals[start:stop], self.truncations[start:stop], {}, env_ids,
                    self.masks[start:stop])
        rows = self._rows(batch)
        gather = self._gather_buffers()
        for name in ("observations", "rewards", "terminals", "truncations", "masks"):
            np.take(getattr(self, name), rows, axis=0, out=gather[name])
        env_ids = np.concatenate([self._env_ids_all[w * self.envs_per_worker:
                                                    (w + 1) * self.envs_per_worker]
                                  for w in batch])
        return (gather["observations"], gather["rewards"], gather["terminals"],
                gather["truncations"], {}, env_ids, gather["masks"])

    def _contiguous(self, batch):
        return batch[-1] - batch[0] == len(batch) - 1

    def _rows(self, batch):
        r = self.rows_per_worker
        return np.concatenate([np.arange(w * r, (w + 1) * r) for w in batch])

    def _gather_buffers(self):
        if self._gather is None:
            rows = self.workers_per_batch * self.rows_per_worker
            self._gather = {name: np.empty((rows, *getattr(self, name).shape[1:]),
                                           getattr(self, name).dtype)
                            for name in ("observations", "rewards", "terminals", "truncations",
                                         "masks")}
        return self._gather

    # ---- fixed groups of workers (the trainer's vec.split) ----------------------------------
    def worker_groups(self, count: int) -> list["WorkerGroup"]:
        """The workers as `count` groups of consecutive workers (rows in order), each
        stepped on its own with `WorkerGroup.start` / `finish` while the caller works:
        unlike send/recv, the caller names which group it waits for, so the order of
        a run's steps never depends on which processes finish first."""
        count = check_count("count", count)
        if self.num_workers % count:
            raise ValueError(f"{count} groups need a number of workers divisible by {count}, "
                             f"this env has num_workers={self.num_workers}")
        size = self.num_workers // count
        return [WorkerGroup(self, range(g * size, (g + 1) * size)) for g in range(count)]

    def _start_group(self, workers: range) -> None:
        """Starts a step of `workers` (their rows of `self.actions` already written)."""
        self._ensure_open()
        if self._unsettled:
            self._settle(include_async=False)
        self._inflight.extend(workers)   # first: an interrupted loop below loses nothing
        self._command_step(workers)

    def _command_step(self, workers) -> None:
        """Sets `workers` stepping (their actions already in place); the caller has
        recorded them as in flight."""
        for worker in workers:
            handle = self._workers[worker]
            handle.flag[0] = STEP
            handle.wake.release()

    def _finish_group(self, workers: range) -> None:
        """Waits for the step `_start_group` started (WorkerError / WorkerDiedError)."""
        try:
            self._wait(list(workers))
        finally:
            self._inflight = [w for w in self._inflight if w not in workers]

    # ---- statistics and lifetime ---------------------------------------------------------
    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        return merge_sums(self._message_all(("stats", bool(clear))))

    def _message_one(self, worker: int, message):
        """Sends `message` to one worker (after earlier work ends); returns its reply."""
        return self._message([worker], message)[0]

    def _raise_in_worker(self, worker: int, text: str = "test exception"):
        """Makes `worker` raise inside its loop (for tests of error propagation)."""
        self._message_one(worker, ("raise", text))

    # ---- exact state (native envs; see VectorBase._enable_exact_state) ------------
    def _seed_streams(self, seed: int) -> None:
        self._message_all(("seed_streams", int(seed)))

    def _get_state(self, instance: int):
        worker, local = self._locate(instance)
        return self._message_one(worker, ("get_state", local))

    def _set_state(self, instance: int, state) -> None:
        worker, local = self._locate(instance)
        self._message_one(worker, ("set_state", local, np.asarray(state, np.float64)))

    @property
    def worker_pids(self):
        return [w.process.pid for w in self._workers]

    def __repr__(self):
        # pytest, debuggers and loggers repr `self` in the frames of an __init__ that
        # raised: before _setup has named the batch (batch_size is its last name the
        # repr reads), say so rather than raise AttributeError from inside repr().
        if "batch_size" not in vars(self):
            return f"<{type(self).__name__}, not constructed>"
        return super().__repr__()

    def close(self) -> None:
        """Stops every worker and frees the shared memory; idempotent."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()


class WorkerGroup:
    """Consecutive workers of a Multiprocessing env and their rows, stepped as one
    batch of their own (`Multiprocessing.worker_groups`): the buffers are views of
    the env's shared ones (rows [begin, end)), `start(actions)` checks and writes the
    group's actions and sets its workers stepping, `finish()` waits for them. A
    group's step and another group's overlap; everything else (reset, statistics,
    state) goes through the env, which first waits for any step in flight."""

    def __init__(self, env: Multiprocessing, workers: range):
        self.env, self.workers = env, workers
        self.begin = workers.start * env.rows_per_worker
        self.end = workers.stop * env.rows_per_worker
        self.num_agents = self.end - self.begin
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        for name, view in slice_buffers(env.buffers, self.begin, self.end).items():
            setattr(self, name, view)

    def start(self, actions: np.ndarray) -> None:
        """Writes `actions` (this group's rows) and starts the group's step."""
        if not _same_memory(actions, self.actions):
            self.env._check_actions(actions, self.num_agents)
            self.actions[...] = actions
        self.env._start_group(self.workers)

    def finish(self) -> None:
        """Waits until the group's step is done (its buffers then hold its output)."""
        self.env._finish_group(self.workers)

    def __repr__(self):
        return f"<WorkerGroup workers {self.workers.start}..{self.workers.stop - 1} of {self.env!r}>"


def _same_memory(array, target: np.ndarray) -> bool:
    """Whether `array` is exactly `target`'s memory (a view of the shared actions
    that the caller wrote into): same address, dtype, shape and strides. A fresh
    slice is a new object each time, so identity cannot tell."""
    return (isinstance(array, np.ndarray) and array.dtype == target.dtype
            and array.shape == target.shape and array.strides == target.strides
            and array.ctypes.data == target.ctypes.data)
