"""`peregrine` with row-keyed action sampling, for the distributed exactness test.

Data-parallel ranks draw their actions from their own generators (see
peregrine/train/distributed.py), so a 2-rank run and a 1-process run sample
different actions by design. This entry point replaces the categorical draw's
uniform numbers with a hash of (global row, draw number): the same for a row
whether it lives in rank r of W or in one process holding every row, so the
test can check everything else (env slices, advantages, gradient averaging,
optimizer, schedule) for equality.

    python tests/dist_worker.py train cartpole ...          # one process
    torchrun --nproc-per-node 2 tests/dist_worker.py train cartpole ...

With PEREGRINE_TEST_RAISE=RANK:UPDATE in the environment, rank RANK raises a
RuntimeError when it starts update UPDATE (counted from 0), for the failure test.
"""
import os
import sys

import numpy as np
import torch

from peregrine.cli import main
from peregrine.train.policy import Policy
from peregrine.train.ppo import Trainer

_draws = [0]


def _row_keyed_uniform(rows: int) -> torch.Tensor:
    rank = int(os.environ.get("RANK", "0"))
    with np.errstate(over="ignore"):
        x = np.arange(rank * rows, (rank + 1) * rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x += np.uint64(_draws[0] + 1) * np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(31)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(29)
    _draws[0] += 1
    return torch.from_numpy((x >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24))


def _sample_categorical(logits, generator):
    """The trainer's own inverse-CDF draw, fed row-keyed uniforms."""
    return Policy._categorical_from(logits, _row_keyed_uniform(logits.shape[0]).unsqueeze(1))


def install() -> None:
    """Row-keyed draws from now on in this process, counted from the first."""
    _draws[0] = 0
    Policy._sample_categorical = staticmethod(_sample_categorical)


def inject_failure(spec: str) -> None:
    """Rank `r` of "r:u" raises when it starts update u; other ranks train on."""
    rank, update = (int(part) for part in spec.split(":"))
    if int(os.environ.get("RANK", "0")) != rank:
        return
    plain_update = Trainer.update

    def update_or_raise(self):
        if self.updates == update:
            raise RuntimeError(f"injected failure at update {update}")
        return plain_update(self)
    Trainer.update = update_or_raise


if __name__ == "__main__":
    install()
    if os.environ.get("PEREGRINE_TEST_RAISE"):
        inject_failure(os.environ["PEREGRINE_TEST_RAISE"])
    sys.exit(main())
