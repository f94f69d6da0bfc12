"""A shared-memory all-reduce for data-parallel ranks on one machine.

gloo's all-reduce between two processes of one machine goes through loopback
TCP: ~1 ms for the 11k-float gradient of a DroneSwarm policy, and its I/O
threads compete with the ranks for the cores. A PPO update sends one gradient
per minibatch, so on two cores the collectives were where data parallelism lost
its second core (benchmarks/RESULTS.md, "DroneSwarm on two cores"). Here the
ranks of one machine sum through one shared-memory segment instead: a rank
copies its tensor into its own slot, publishes a sequence number, waits until
every rank has published the same number, and adds the slots up.

Layout. One segment: a 64-byte line per rank holding that rank's sequence
number, its pid and one descriptor per bank (int64 each), then two banks of
`world_size` slots of `capacity` bytes. Call k uses bank k % 2. A rank writes
bank k % 2 for call k+2 only after every rank has published k+1, which each did
after it had finished reading call k's bank: two banks and the wait each call
makes anyway are all the protection needed.

Agreement. With each call a rank publishes what it sums (element count and
dtype, one int64) beside its sequence number, and after the wait compares every
rank's with its own: ranks whose tensors differ (a different hidden size on one
rank) raise ValueError on every rank, naming both sides, instead of adding up
unrelated bytes. A call too large for the slots is known to be so by every rank at the same
call (they agree on its size), so they all grow the segment then and sum there.
It costs two stores and one read of world_size words per call.

Equal results. Every rank adds the slots in rank order (slot 0, then + slot 1,
...), so every rank gets the same bits, and the parameters of ranks that apply
the same averaged gradient stay identical, as they must (distributed.py).

Waiting. A rank spins on the other ranks' sequence numbers for 50 us, then
yields its core (`os.sched_yield`) for up to 10 ms, then sleeps in growing
steps up to 1 ms, so a rank that is far ahead costs little CPU. When the ranks
outnumber the cores they may run on, a waiting rank holds a core another rank
needs, so it sleeps at once (two DroneSwarm ranks on one core: 125-130k SPS
sleeping at once, 111k spinning first, 103-121k with gloo). A rank that waits longer than
`timeout` seconds raises TimeoutError; while sleeping it also looks every 0.1 s
whether the late ranks' processes (their pids are in the header) still exist,
and raises at once naming a rank that is gone, so a killed rank does not hold the
others (and torchrun's restart) for `timeout` seconds. Ordering relies on x86's stores being
seen in program order (the slot before its sequence number), as
peregrine.vector.processes does; `supported()` is False elsewhere and the
trainer keeps gloo there.

Segments. Rank 0 creates the segment and tells the others its name through the
process group (one broadcast); once every rank has attached it (a barrier),
rank 0 unlinks the name, so nothing is left behind in /dev/shm whatever way the
job ends. A call larger than the capacity replaces the segment by a bigger one
the same way; every rank makes the same calls with the same sizes (the trainer's
collectives are the same sequence on every rank), so they all do it at the same
call.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import torch

from ..monitor.metrics import pid_alive

_LINE = 64                       # bytes per sequence number (one cache line each)
# Waiting: a wait is the other ranks' jitter (one minibatch's backward against
# another's: 1-2 ms on average with DroneSwarm's ~15 ms gradient steps on two
# cores). A sleeping rank wakes late by up to its last sleep, so it first spins,
# then yields (which costs nothing when no other task wants the core, and hands
# the core over when ranks outnumber cores), and sleeps only after 10 ms.
_SPIN_SECONDS = 50e-6
_YIELD_SECONDS = 10e-3
_MAX_SLEEP = 1e-3                # sleeps double from 10 us up to this
_MIN_CAPACITY = 1 << 16          # bytes per slot at least
_LIVENESS_PERIOD = 0.1           # seconds between looks at late ranks' processes
# Header words of a rank's line: sequence number, pid, descriptor of bank 0, of bank 1.
_SEQUENCE, _PID, _DESCRIPTOR = 0, 1, 2
# dtype -> code in a descriptor (count << 8 | code); 0 is "none published yet".
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(_DTYPES, start=1)}


def supported() -> bool:
    """True where the busy-wait's ordering holds (x86: stores are seen in order)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


class LocalAllReduce:
    """In-place sum over the ranks of one machine, through shared memory.

    `exchange(value)` is rank 0's `value` on every rank and `barrier()` waits for
    every rank: the process group's own collectives, used only to set up a segment.
    """

    def __init__(self, rank: int, world_size: int, exchange, barrier, timeout: float = 60.0):
        if not supported():
            raise RuntimeError(f"the shared-memory all-reduce needs an x86 CPU, this one is "
                               f"{platform.machine()!r}; use train.dist_backend = 'gloo'")
        self.rank, self.world_size, self.timeout = rank, world_size, float(timeout)
        self._exchange, self._barrier = exchange, barrier
        # Spin and yield only when every rank can have a core of its own.
        self._busy_wait = world_size <= len(os.sched_getaffinity(0)) \
            if hasattr(os, "sched_getaffinity") else world_size <= (os.cpu_count() or 1)
        self._shm = None
        self._capacity = 0
        self._calls = 0
        self._allocate(_MIN_CAPACITY)

    # ---- the segment -------------------------------------------------------------
    def _allocate(self, capacity: int) -> None:
        capacity = -(-max(capacity, _MIN_CAPACITY) // _LINE) * _LINE    # whole lines
        header = self.world_size * _LINE
        size = header + 2 * self.world_size * capacity
        created = None
        if self.rank == 0:
            created = shared_memory.SharedMemory(create=True, size=size)
            name = self._exchange(created.name)
        else:
            name = self._exchange(None)
        shm = created if created is not None else _attach(name)
        self._barrier()                 # every rank holds a mapping ...
        if created is not None:
            created.unlink()            # ... so the name can go now
        self._barrier()
        self._release()
        self._shm, self._capacity = shm, capacity
        lines = np.frombuffer(shm.buf, np.int64, count=header // 8).reshape(self.world_size,
                                                                             _LINE // 8)
        # Each rank's sequence number, one cache line apart; the new segment starts at 0.
        self._sequence = lines[:, _SEQUENCE]
        self._pids = lines[:, _PID]
        self._descriptors = (lines[:, _DESCRIPTOR], lines[:, _DESCRIPTOR + 1])
        self._pids[self.rank] = os.getpid()
        self._calls = 0
        self._offsets = [[header + (bank * self.world_size + r) * capacity
                          for r in range(self.world_size)] for bank in (0, 1)]
        self._views = {}                # (dtype, numel) -> both banks' slot tensors

    def _slots(self, bank: int, dtype: torch.dtype, numel: int) -> list:
        banks = self._views.get((dtype, numel))
        if banks is None:
            banks = self._views[(dtype, numel)] = [
                [torch.frombuffer(self._shm.buf, dtype=dtype, count=numel, offset=offset)
                 for offset in offsets] for offsets in self._offsets]
        return banks[bank]

    def _release(self) -> None:
        if self._shm is not None:
            # The slot tensors (torch.frombuffer) do not keep the mapping alive, so
            # they must not outlive it: they never leave this object, and go first.
            self._sequence = self._views = self._pids = self._descriptors = None
            try:
                self._shm.close()
            except BufferError:
                # A NumPy view of the sequence numbers is still alive (the frame of a
                # wait that was interrupted, say): the mapping goes with the process;
                # its name is already unlinked.
                pass
            self._shm = None

    def close(self) -> None:
        self._release()

    # ---- the collective ----------------------------------------------------------
    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (CPU, contiguous) becomes the sum of every rank's `tensor`;
        returns it. Every rank must call with the same shape and dtype, in the same
        order as its other collectives: ValueError on every rank otherwise."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("the shared-memory all-reduce takes contiguous CPU tensors")
        flat = tensor.view(-1)
        numel = flat.numel()
        code = _DTYPE_CODES.get(flat.dtype)
        if code is None:
            raise ValueError(f"the shared-memory all-reduce sums {[str(d) for d in _DTYPES]}, "
                             f"not {flat.dtype}")
        descriptor = numel << 8 | code
        fits = numel * flat.element_size() <= self._capacity
        self._calls += 1
        call = self._calls
        bank = call % 2
        slots = self._slots(bank, flat.dtype, numel) if fits and numel else None
        with torch.no_grad():
            if slots is not None:
                slots[self.rank].copy_(flat)
            self._descriptors[bank][self.rank] = descriptor
            self._sequence[self.rank] = call      # published after the slot's stores
            self._wait(call)
            published = self._descriptors[bank].tolist()    # world_size ints: ~0.3 us
            if published.count(descriptor) != self.world_size:
                self._refuse(call, published)
            if not fits:        # every rank saw the same size: all grow here, and sum there
                self._allocate(2 * numel * flat.element_size())
                return self.all_reduce_(tensor)
            if slots is not None:
                flat.copy_(slots[0])
                for other in slots[1:]:
                    flat.add_(other)
        return tensor

    def _refuse(self, call: int, descriptors: list) -> None:
        def what(descriptor):
            dtype = _DTYPES[(descriptor & 0xFF) - 1] if descriptor & 0xFF else None
            return f"{descriptor >> 8} {str(dtype).replace('torch.', '')} values"
        others = [f"rank {r} sums {what(d)}" for r, d in enumerate(descriptors)
                  if d != descriptors[0]]
        raise ValueError(f"rank {self.rank}: collective {call}: rank 0 sums "
                         f"{what(descriptors[0])} but {', '.join(others)}; the ranks' configs "
                         f"differ (or their calls are out of step), and their sums would be "
                         f"meaningless")

    def _wait(self, call: int) -> None:
        sequence = self._sequence
        if int(sequence.min()) >= call:
            return
        start = time.perf_counter()
        pause = 10e-6
        next_look = start + _LIVENESS_PERIOD
        while True:
            if int(sequence.min()) >= call:
                return
            now = time.perf_counter()
            waited = now - start
            if self._busy_wait and waited < _SPIN_SECONDS:
                continue
            if self._busy_wait and waited < _YIELD_SECONDS:
                os.sched_yield()
                continue
            late = [r for r in range(self.world_size) if int(sequence[r]) < call]
            if now > next_look:
                next_look = now + _LIVENESS_PERIOD
                gone = [(r, int(self._pids[r])) for r in late
                        if self._pids[r] > 0 and not pid_alive(int(self._pids[r]))]
                if gone:
                    del sequence
                    rank, pid = gone[0]
                    raise RuntimeError(f"rank {self.rank}: rank {rank} (pid {pid}) is gone: its "
                                       f"process ended before collective {call}")
            if waited > self.timeout:
                del sequence    # the traceback must not hold a view: close() could not unmap
                raise TimeoutError(f"rank {self.rank}: rank(s) {late} did not reach collective "
                                   f"{call} within train.dist_timeout = {self.timeout:g} s")
            time.sleep(pause)
            pause = min(2 * pause, _MAX_SLEEP)


def _attach(name: str) -> shared_memory.SharedMemory:
    """Maps rank 0's segment without registering it with this process's resource
    tracker (rank 0 owns and unlinks it; before Python 3.13 every attach registered
    it, and the tracker would then try to unlink it again at exit)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    shm = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 - see docstring
    return shm
