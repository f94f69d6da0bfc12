"""The shared-memory all-reduce of data-parallel ranks on one machine (local_reduce.py),
exercised by forked processes that set up through a multiprocessing barrier and queue
instead of a torch.distributed process group."""
from __future__ import annotations

import multiprocessing
import os
import time
import traceback

import pytest
import torch

from peregrine.train import distributed, local_reduce

pytestmark = pytest.mark.skipif(not local_reduce.supported(), reason="x86 only")

CONTEXT = multiprocessing.get_context("fork")
WAIT = 120      # seconds: a guard against a hung rank, not a speed requirement


def _values(rank: int, call: int, numel: int, dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * call + rank)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=generator).to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=generator, dtype=dtype)


# (numel, dtype) of each call in order: repeated calls reuse both banks; the 40,000
# float64 (320 kB) call outgrows the first segment and replaces it mid-sequence.
CALLS = ([(11271, torch.float32)] * 30 + [(7, torch.float64), (3, torch.int64),
         (40_000, torch.float64), (5, torch.bfloat16), (0, torch.float32)]
         + [(11271, torch.float32)] * 30)


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def _rank_main(rank, world_size, barrier, names, results, timeout, calls, die=False,
               linger=0.0):
    torch.set_num_threads(1)    # a forked child must not enter the parent's OpenMP pool
    try:
        def exchange(value):
            if rank == 0:
                for _ in range(world_size - 1):
                    names.put(value)
                return value
            return names.get(timeout=WAIT)

        reducer = local_reduce.LocalAllReduce(rank, world_size, exchange,
                                              lambda: barrier.wait(WAIT), timeout)
        segment = reducer._shm.name
        outputs = []
        for call, (numel, dtype) in enumerate(calls):
            tensor = _values(rank, call, numel, dtype)
            assert reducer.all_reduce_(tensor) is tensor
            outputs.append(_bits(tensor))     # bytes: a tensor would travel as a shared fd
        if die:
            os._exit(3)                       # gone without a word, as a killed rank is
        left_behind = os.path.exists(f"/dev/shm/{segment.lstrip('/')}")
        reducer.close()
        results.put((rank, "ok", outputs, left_behind))
        time.sleep(linger)      # alive but silent: a stuck rank, not a dead one
    except BaseException as error:     # reported to the test, not lost in the child
        results.put((rank, type(error).__name__, str(error), traceback.format_exc()))


def _run(world_size, calls=CALLS, timeout=60.0, silent=(), rank_calls=None, die=()):
    """Every rank's (status, ...) result; `rank_calls` maps a rank to its own calls,
    ranks in `silent` make only the first call, ranks in `die` exit after theirs."""
    barrier, names, results = CONTEXT.Barrier(world_size), CONTEXT.Queue(), CONTEXT.Queue()
    rank_calls = rank_calls or {}
    ranks = [CONTEXT.Process(target=_rank_main, args=(
        rank, world_size, barrier, names, results, timeout,
        calls[:1] if rank in silent else rank_calls.get(rank, calls), rank in die,
        3.0 if rank in silent else 0.0))
        for rank in range(world_size)]
    for process in ranks:
        process.start()
    try:
        return dict((r[0], r[1:]) for r in (results.get(timeout=WAIT)
                                            for _ in range(len(ranks) - len(die))))
    finally:
        for process in ranks:
            process.join(WAIT)


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_gets_the_same_sum_in_rank_order(world_size):
    """Each call's result is slot 0 + slot 1 + ... in rank order, bit for bit, on
    every rank, through repeated calls (both banks), mixed dtypes, an empty tensor and
    a call that outgrows the segment; the segment's name is gone from /dev/shm while
    the ranks still use it."""
    results = _run(world_size)
    for rank in range(world_size):
        status, outputs, *rest = results[rank]
        assert status == "ok", rest
        assert rest == [False]          # unlinked at set-up
        for call, ((numel, dtype), got) in enumerate(zip(CALLS, outputs)):
            expected = _values(0, call, numel, dtype)
            for other in range(1, world_size):
                expected = expected + _values(other, call, numel, dtype)
            assert got == _bits(expected), (rank, call)


def test_a_rank_that_never_arrives_times_out_with_a_clear_error():
    """Rank 1 makes one call and stays (stuck, alive); rank 0's second call waits
    train.dist_timeout seconds, then raises naming the missing rank and the timeout."""
    results = _run(2, calls=[(16, torch.float32)] * 2, timeout=0.5, silent=(1,))
    assert results[1][0] == "ok"
    status, message, _ = results[0]
    assert status == "TimeoutError"
    assert "rank(s) [1] did not reach collective 2 within train.dist_timeout = 0.5 s" in message


@pytest.mark.parametrize("other, described", [
    ((12, torch.float32), "rank 1 sums 12 float32"),
    ((10, torch.float64), "rank 1 sums 10 float64"),
    ((0, torch.float32), "rank 1 sums 0 float32"),
    ((100_000, torch.float32), "rank 1 sums 100000 float32")])
def test_ranks_summing_different_sizes_or_dtypes_are_refused_on_every_rank(other, described):
    """Ranks whose tensors differ (another hidden size on one rank, say) used to sum
    garbage silently; each rank now names both sides, whatever the sizes (one that
    would outgrow the segment included), and neither waits for the timeout."""
    calls = [(10, torch.float32), (10, torch.float32)]
    results = _run(2, calls=calls, rank_calls={1: [calls[0], other]}, timeout=30.0)
    for rank in (0, 1):
        status, message, _ = results[rank]
        assert status == "ValueError", message
        assert f"collective 2: rank 0 sums 10 float32 values but {described}" in message
        assert "the ranks' configs differ" in message


def test_a_rank_that_dies_is_named_at_once_not_after_the_timeout():
    """A rank's process that is gone (killed, crashed) fails the others' next sum
    within a fraction of a second, so torchrun's restart is not held up by
    train.dist_timeout."""
    start = time.monotonic()
    results = _run(2, calls=[(16, torch.float32)] * 2, timeout=60.0, silent=(1,), die=(1,))
    status, message, _ = results[0]
    assert status == "RuntimeError", message
    assert "rank 1 (pid" in message and "is gone" in message
    assert time.monotonic() - start < 30


def test_the_backend_choice_takes_shared_memory_only_on_one_machine_and_cpu():
    cpu = torch.device("cpu")
    assert distributed.resolve_backend("auto", cpu, one_machine=True) == "shm"
    assert distributed.resolve_backend("auto", cpu, one_machine=False) == "gloo"
    assert distributed.resolve_backend("shm", cpu, one_machine=True) == "shm"
    assert distributed.resolve_backend("gloo", cpu, one_machine=True) == "gloo"
    with pytest.raises(ValueError, match="'shm' needs every rank on this machine"):
        distributed.resolve_backend("shm", cpu, one_machine=False)
    with pytest.raises(ValueError, match="'shm' sums CPU tensors"):
        distributed.resolve_backend("shm", torch.device("cuda", 0), one_machine=True)
    assert distributed.one_machine({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"})
    assert not distributed.one_machine({"LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"})
    assert not distributed.one_machine({"WORLD_SIZE": "2"})


def test_closing_after_a_timeout_keeps_the_timeout_error():
    """The trainer closes the reducer in its clean-up, while the TimeoutError's
    traceback still holds the wait's view of the sequence numbers: close() must not
    replace that error with a BufferError."""
    reducer = local_reduce.LocalAllReduce(0, 2, lambda value: value, lambda: None,
                                          timeout=0.05)       # rank 1 never comes
    with pytest.raises(TimeoutError):
        try:
            reducer.all_reduce_(torch.ones(4))
        finally:
            reducer.close()
