"""Data-parallel PPO on torch.distributed: one process per rank, started by torchrun.

    torchrun --nproc-per-node 2 -m peregrine train cartpole    # one machine
    peregrine train cartpole --nproc 2                         # the same, through torch.distributed.run
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:PORT --rdzv-id RUN -m peregrine train drone_swarm

What a rank is. Every rank runs the whole Trainer on its own env batch; the
sizes in the config are per rank (`vec.num_envs`, `train.horizon`,
`train.minibatch_size`), so the global batch of one update is
world_size x rows x horizon and one gradient step uses world_size x
minibatch_size samples. `train.total_steps`, the step counter and SPS count the
samples of every rank. Ranks start from the same parameters (same seed) and
apply the same averaged gradient with the same learning rate, so parameters and
optimizer state stay identical without being sent around.

Seeding. A rank's env batch is the slice of a larger one: with W = vec.num_workers
blocks per rank (1 for the native backend), rank r owns the vector units
r*W .. r*W+W-1, and every seed the trainer gives its env goes through
`unit_seed(seed, r*W)`. Because `unit_seed` is additive, rank r's block b is seeded
exactly like block r*W+b of one `vec.backend = "serial"` batch of world_size x
num_envs envs in world_size x W blocks: ranks never share episodes, and two ranks
of n envs see the same episodes as one process of 2n envs split in two blocks.
Action sampling and minibatch order use a generator seeded with
`unit_seed(train.seed, rank)` (rank 0 keeps `train.seed`, so one rank is the plain run).

Gradients: one explicit all-reduce of one flat buffer per minibatch, not DDP.
The trainer calls policy methods other than `forward` (heads, value,
log-prob/entropy), which DDP's forward hooks do not see, and PPO's policies
(10^4 - 10^6 parameters) fit one DDP bucket anyway, so DDP's overlap of
communication with the backward pass would buy nothing. After `backward` the
gradients are concatenated (one `torch.cat`), summed across ranks in one call,
divided by the world size, and each parameter's `.grad` becomes a view of that
buffer (no copy back). Gradient-norm clipping and Adam then see the global
gradient on every rank.

Which collective. `train.dist_backend = "auto"` takes NCCL on CUDA. On the CPU,
when every rank runs on this machine (torchrun's LOCAL_WORLD_SIZE equals the
world size) it sums through shared memory (local_reduce.py: a few tens of
microseconds where gloo's loopback TCP takes about a millisecond, and no I/O
threads competing with the ranks for cores), with a gloo process group kept for
the rare collectives (the run directory's broadcast, checkpoint gathers);
across machines it takes gloo. `"gloo"`, `"shm"` and `"nccl"` force one.

Other collectives, all on small buffers: once per epoch, the advantage sums
(count, sum, sum of squares per minibatch, float64) so that every rank normalises
its share of global minibatch k with the statistics of the whole global minibatch;
once per update, the episode statistics, the loss statistics and the stop flag
(Ctrl-C on any rank stops every rank after the same update); with
`train.target_kl`, the approximate KL once per epoch. Checkpoints gather every
rank's env state and random state to rank 0, which alone writes files.

Where two ranks of n envs differ from one process of 2n envs (the test checks
equality everywhere else):
* Action sampling: each rank draws its own random numbers. Drawing the one-process
  numbers would need every rank to draw those of the whole global batch.
* Minibatches: a global minibatch takes exactly minibatch_size samples from every
  rank (a stratified draw); one process draws a permutation of the whole batch.
  The two coincide when an epoch is one minibatch.
* Agent masks (dead rows): each rank's loss is a mean over its own live samples and
  the ranks' gradients are averaged with equal weights, which is the global mean
  only when the ranks have equal live counts.
* Observation normalisation and reward scaling are refused with several ranks:
  their running statistics are updated every step, and keeping them equal across
  ranks would cost a collective per step.

Agreement. Before anything else every rank's resolved config (less the settings
only rank 0 uses: the run folder, progress lines, TensorBoard) goes to every
rank, and ranks whose configs differ are refused naming the keys: a different
hidden size or learning rate on one rank would otherwise train silently on the
shared-memory sums (which check sizes and dtypes on every call too).

Failure. The process group has `train.dist_timeout` seconds on every
collective; a rank that raises prints its rank and error and exits, and torchrun
then stops the other ranks (it polls every 0.1 s); the shared-memory sums notice
a dead rank's process at once. Only rank 0 writes, atomically (checkpoint.save),
so the last good checkpoint survives any crash. With `--max-restarts K` torchrun
restarts every rank after a failure, up to K times, and the restarted ranks
continue from the last checkpoint (run.py), over a process-group store of their
own restart (`init_process_group`: torchrun's store outlives restarts); SIGTERM to torchrun reaches every
rank, which stop after the same update and save (run.py).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as torch_dist

from ..envs.native.batch import EpisodeStats
# available_cores: affinity and cgroup quota, the count the vector backends use too
from ..vector.common import available_cores, unit_seed, warn_if_oversubscribed
from . import local_reduce
from .config import check_features

# Per-rank entries of a Trainer.state_dict(); everything else is shared by all ranks.
RANK_KEYS = ("torch_rng", "generator", "next_starts", "env_state", "lstm_state",
             "obs_normalizer", "reward_scaler")


def restart_count(environ=os.environ) -> int:
    """How many times torchrun has restarted this job's ranks (0 outside torchrun)."""
    try:
        return int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


@dataclass(frozen=True)
class Place:
    """This process's place in a run, as torchrun's environment gives it (rank 0
    of 1 outside torchrun); read by `place()`, the one reader of those variables
    besides torchrun's own store set-up."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def launched(self) -> bool:
        """One of several ranks that torchrun started."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def place(environ=os.environ) -> Place:
    """This process's Place (unreadable values count as a process of its own)."""
    try:
        return Place(int(environ.get("RANK", "0")), int(environ.get("WORLD_SIZE", "1")),
                     int(environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return Place()


def local_world_size(environ=os.environ) -> int:
    """How many ranks torchrun started on this machine (1 outside a launch)."""
    try:
        return max(1, int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def launched() -> bool:
    """True in a worker that torchrun started as one of several ranks."""
    return place().launched


def resolve_backend(name: str, device: torch.device, one_machine: bool = False) -> str:
    """The collective path: "nccl", "gloo", or "shm" (a gloo process group, sums
    through shared memory). `one_machine`: every rank runs on this machine."""
    if name == "auto":
        if device.type == "cuda" and torch_dist.is_nccl_available():
            return "nccl"
        if device.type == "cpu" and one_machine and local_reduce.supported():
            return "shm"
        return "gloo"
    if name == "nccl" and device.type != "cuda":
        raise ValueError("train.dist_backend = 'nccl' needs train.device = 'cuda' (or 'auto' "
                         "with a GPU); use 'gloo' or 'auto' on CPU")
    if name == "shm":
        if device.type != "cpu":
            raise ValueError("train.dist_backend = 'shm' sums CPU tensors; it needs "
                             "train.device = 'cpu' (use 'nccl' or 'auto' on CUDA)")
        if not one_machine:
            raise ValueError("train.dist_backend = 'shm' needs every rank on this machine "
                             "(torchrun --nnodes 1); use 'gloo' or 'auto' across machines")
        if not local_reduce.supported():
            raise ValueError("train.dist_backend = 'shm' needs an x86 CPU; use 'gloo' or 'auto'")
    return name


def init_process_group(backend: str, timeout: timedelta) -> None:
    """The default process group, over a store of this restart's own.

    torchrun (torch >= 2.4) keeps one rendezvous TCPStore for the life of the agent
    and hands it to every attempt (TORCHELASTIC_USE_AGENT_STORE), and
    init_process_group's env:// store adds no per-attempt prefix: after a restart
    the default group's keys still hold the killed ranks' Gloo addresses. A
    restarted rank that read its peer's key before the peer republished it
    connected to a dead process and failed after Gloo's retries ("Gloo
    connectFullMesh failed ... Connection refused", ~5 s into the restart), using
    up the restart (issue 35). Prefixing the store with the restart count gives
    every attempt fresh keys. Outside torchrun's shared store: env:// as before."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        torch_dist.init_process_group(backend, timeout=timeout)
        return
    where = place()
    rank, world_size = where.rank, where.world_size
    store = torch_dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                world_size, is_master=False, timeout=timeout)
    store = torch_dist.PrefixStore(f"peregrine/attempt_{restart_count()}/", store)
    torch_dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                  timeout=timeout)


def one_machine(environ=os.environ) -> bool:
    """True when torchrun started every rank on this machine."""
    try:
        return int(environ.get("LOCAL_WORLD_SIZE", "0")) == int(environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False


def check_world_size(state: dict, world_size: int) -> None:
    """ValueError unless the checkpoint `state` was written by `world_size` ranks.

    Resuming with another world size is refused rather than re-split: each rank's
    env batch, its random streams and its sampling generator belong to that rank,
    and the global batch (and so the learning-rate schedule) would change.
    """
    saved = int(state.get("world_size", 1))
    if saved != world_size:
        how = "a single process" if saved == 1 else (
            f"--nproc {saved} (or torchrun with {saved} ranks in all)")
        raise ValueError(f"the checkpoint was written by a run of {saved} rank(s) but this run "
                         f"has {world_size}; resume it with {how}: its env batches and random "
                         f"streams belong to those ranks")


def local_state(state: dict, rank: int = 0, world_size: int = 1) -> dict:
    """The checkpoint `state` as rank `rank` of `world_size` must load it (refused,
    by check_world_size, when the world size differs)."""
    check_world_size(state, world_size)
    if world_size == 1:
        return state
    return {**state, **state["ranks"][rank]}


class _Unset:
    def __repr__(self):
        return "unset"


# Settings only rank 0 acts on: they may differ between ranks' command lines.
RANK_OWN_SETTINGS = ("train.run_dir", "train.progress_interval", "train.tensorboard")


def config_differences(configs: list) -> dict:
    """{key: [value of rank 0, value of rank 1, ...]} for every "section.key" where the
    ranks' configs (Config.to_dict() of each) differ, RANK_OWN_SETTINGS left out."""
    flat = [{f"{section}.{key}": value for section, values in config.items()
             for key, value in values.items()} for config in configs]
    keys = sorted(set().union(*flat) - set(RANK_OWN_SETTINGS))
    missing = _Unset()
    return {key: [values.get(key, missing) for values in flat] for key in keys
            if any(values.get(key, missing) != flat[0].get(key, missing) for values in flat)}


def auto_ranks(config, cores: int) -> tuple[int, list[tuple[str, int]], str]:
    """`--nproc auto`: one rank per available core, with the one-process run's
    batch split over the ranks, so the global batch, the global minibatch and
    so the learning-rate schedule stay those of the config.

    Returns (ranks, per-rank overrides, why): vec.num_envs and
    train.minibatch_size divided by the rank count, and the step and torch
    threads shared out (at least 1 each). The rank count is the largest up to
    `cores` that divides num_envs, minibatch_size and the per-rank batch into
    vec.split halves; 1 (train in this process, config unchanged) when no such
    count above 1 exists, when only one core is available, or when the config
    cannot run on several ranks (check_features, or a backend other than the
    native batch).
    """
    vec, t = config.vec, config.train
    if cores <= 1:
        return 1, [], "one core available"
    try:
        check_features(config, several_ranks=True)
    except ValueError as error:
        return 1, [], f"one process: {error}"
    if vec.backend != "native":
        return 1, [], (f"one process: vec.backend {vec.backend!r} is split over cores by its "
                       f"own workers; auto splits the native batch only")
    ranks = cores
    while ranks > 1 and (vec.num_envs % ranks or t.minibatch_size % ranks
                         or (vec.num_envs // ranks) % max(vec.split, 1)):
        ranks -= 1
    if ranks == 1:
        return 1, [], (f"one process: vec.num_envs {vec.num_envs} and train.minibatch_size "
                       f"{t.minibatch_size} have no common divisor up to {cores}")
    overrides = [("vec.num_envs", vec.num_envs // ranks),
                 ("train.minibatch_size", t.minibatch_size // ranks),
                 ("vec.num_threads", max(1, vec.num_threads // ranks)),
                 ("train.torch_threads", t.torch_threads and max(1, t.torch_threads // ranks))]
    return ranks, overrides, (f"{ranks} ranks (one per available core), each "
                              f"{vec.num_envs // ranks} envs and minibatches of "
                              f"{t.minibatch_size // ranks}: the global batch of one process")


def units_per_rank(config) -> int:
    """How many seed units (vector/recipe.py) one rank's env batch spans, so that each
    rank's units continue the previous rank's and no two ranks share a stream: one
    native batch, a native block per worker, or one unit per env when emulated."""
    vec = config.vec
    if not config.is_native:
        return vec.num_envs
    return 1 if vec.backend in ("native", "device") else vec.num_workers


class DataParallel:
    """This process's place in a data-parallel run, and the collectives the trainer uses.

    Created from the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT); initialises the default process group.
    """

    def __init__(self, config):
        t = config.train
        check_features(config, several_ranks=True)
        where = place()
        self.rank, self.world_size, self.local_rank = where.rank, where.world_size, \
            where.local_rank
        from .ppo import resolve_device
        device = resolve_device(t.device)
        if device.type == "cuda":
            device = torch.device("cuda", self.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        self.device = device
        self.backend = resolve_backend(t.dist_backend, device, one_machine())
        # Collective buffers live where the backend wants them.
        self.comm_device = device if self.backend == "nccl" else torch.device("cpu")
        init_process_group("gloo" if self.backend == "shm" else self.backend,
                           timedelta(seconds=t.dist_timeout))
        self._check_agreement(config)
        self.local = None            # the shared-memory sums ("shm")
        if self.backend == "shm":
            self.local = local_reduce.LocalAllReduce(self.rank, self.world_size, self.broadcast,
                                                     torch_dist.barrier, t.dist_timeout)
        self.units_per_rank = units_per_rank(config)
        self.stop_source = None      # callable -> bool: this rank's stop request
        self.stopping = False        # every rank's agreed stop (after reduce_update)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _check_agreement(self, config) -> None:
        """ValueError on every rank, naming the keys, unless every rank resolved the
        same config (one all-gather at start)."""
        configs = [None] * self.world_size
        torch_dist.all_gather_object(configs, config.to_dict())
        differences = config_differences(configs)
        if differences:
            shown = "; ".join(f"{key}: " + ", ".join(f"rank {rank} {value!r}"
                                                     for rank, value in enumerate(values))
                              for key, values in differences.items())
            raise ValueError(f"the ranks' configs differ in {', '.join(differences)} ({shown}); "
                             f"every rank must train with the same config")

    # ---- seeds ----------------------------------------------------------------
    def env_seed(self, seed: int) -> int:
        """The seed this rank gives its env batch where one process would give `seed`."""
        return unit_seed(seed, self.rank * self.units_per_rank)

    def sampling_seed(self, seed: int) -> int:
        return unit_seed(seed, self.rank)

    # ---- collectives ------------------------------------------------------------
    def all_reduce(self, buffer: torch.Tensor) -> None:
        """`buffer` (on comm_device) becomes its sum over the ranks."""
        if self.local is not None:
            self.local.all_reduce_(buffer)
        else:
            torch_dist.all_reduce(buffer)

    def _sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks of a small tensor (returned on its own device)."""
        buffer = values.to(self.comm_device)
        self.all_reduce(buffer)
        return buffer.to(values.device)

    def gather_rows(self, values: torch.Tensor) -> torch.Tensor:
        """[world_size, numel] of every rank's 1-D `values` in rank order (on their own
        device): each rank writes its row of a zeroed buffer and the sum is taken,
        which adds only zeros to each row, so the rows arrive exactly."""
        buffer = torch.zeros(self.world_size, values.numel(), dtype=values.dtype,
                             device=self.comm_device)
        buffer[self.rank] = values.to(self.comm_device)
        self.all_reduce(buffer)
        return buffer.to(values.device)

    def average_gradients(self, parameters) -> None:
        """One all-reduce of every gradient in one flat buffer; `.grad`s become its views."""
        parameters = [p for p in parameters if p.requires_grad]
        flat = torch.cat([torch.zeros(p.numel(), device=p.device) if p.grad is None
                          else p.grad.reshape(-1) for p in parameters])
        self.all_reduce(flat)
        flat.div_(self.world_size)
        for parameter, grad in zip(parameters, flat.split([p.numel() for p in parameters])):
            parameter.grad = grad.view_as(parameter)

    def advantage_statistics(self, batches, unbiased: bool) -> None:
        """Adds "advantage_stats" = (mean, std) to each minibatch of an epoch: the
        statistics of global minibatch k (every rank's minibatch k), as one process
        would compute over it (std with Bessel's correction when `unbiased`, else the
        population std over live samples)."""
        if not batches:
            return
        rows = []
        for batch in batches:
            advantages = batch["advantages"].double()
            live = batch.get("live")
            weight = torch.ones_like(advantages) if live is None else live.double()
            rows.append(torch.stack([weight.sum(), (advantages * weight).sum(),
                                     (advantages.square() * weight).sum()]))
        count, total, squares = self._sum(torch.stack(rows)).unbind(1)
        mean = total / count.clamp(min=1.0)
        spread = (squares - count * mean.square()).clamp(min=0.0)
        divisor = (count - 1.0).clamp(min=1.0) if unbiased else count.clamp(min=1.0)
        std = (spread / divisor).sqrt()
        for k, batch in enumerate(batches):
            dtype = batch["advantages"].dtype
            batch["advantage_stats"] = (mean[k].to(dtype), std[k].to(dtype))

    def mean(self, value: float) -> float:
        """The mean over ranks of one number (target_kl's early stop)."""
        return float(self._sum(torch.tensor([float(value)], dtype=torch.float64))[0]) / \
            self.world_size

    def reduce_update(self, stats: EpisodeStats, losses: dict, stat_names,
                      memory: tuple[float, float] = (0.0, 0.0)) -> tuple:
        """(episode statistics of every rank's finished episodes, losses averaged over
        ranks); sets `stopping` if any rank asked to stop, and `rank_memory` to every
        rank's `memory` (its peak RSS and its process tree's, MiB; train/resources.py),
        each rank writing its own slots of the sum. One all-reduce."""
        from ..vector.common import stats_to_sums
        count, sums, squares = stats_to_sums(stats)
        names = list(stat_names)
        loss_names = sorted(losses)
        stop = bool(self.stop_source()) if self.stop_source is not None else False
        values = [float(stop), float(count)]
        values += [sums.get(n, 0.0) for n in names] + [squares.get(n, 0.0) for n in names]
        values += [float(losses[n]) for n in loss_names]
        slots = [0.0] * (2 * self.world_size)
        slots[2 * self.rank:2 * self.rank + 2] = [float(memory[0]), float(memory[1])]
        reduced = self._sum(torch.tensor(values + slots, dtype=torch.float64)).tolist()
        self.stopping = reduced[0] > 0
        k = len(names)
        merged = EpisodeStats.from_sums(names, int(round(reduced[1])), reduced[2:2 + k],
                                        reduced[2 + k:2 + 2 * k])
        losses_end = 2 + 2 * k + len(loss_names)
        averaged = {n: v / self.world_size for n, v in zip(loss_names, reduced[2 + 2 * k:losses_end])}
        memory_slots = reduced[losses_end:]
        self.rank_memory = [(memory_slots[2 * r], memory_slots[2 * r + 1])
                            for r in range(self.world_size)]
        return merged, averaged

    def broadcast(self, value):
        """Rank 0's `value` (any picklable object) on every rank."""
        holder = [value]
        torch_dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def gather_state(self, state: dict) -> dict | None:
        """On rank 0: `state` with every rank's per-rank entries under "ranks" and the
        world size; None elsewhere. Every rank must call it at the same update."""
        mine = {key: state[key] for key in RANK_KEYS if key in state}
        gathered = [None] * self.world_size if self.is_main else None
        torch_dist.gather_object(mine, gathered, dst=0)
        if not self.is_main:
            return None
        return {**state, "world_size": self.world_size, "ranks": gathered}

    def report_failure(self, error: BaseException) -> None:
        print(f"peregrine train: rank {self.rank} of {self.world_size} failed: "
              f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
            self.local = None
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def launch(nproc: int, argv, max_restarts: int = 0) -> int:
    """`peregrine train ... --nproc N [--max-restarts K]`: the same command in N ranks
    on this machine, started by torch.distributed.run (a standalone c10d rendezvous
    on a free port), restarted up to K times after a failure. A signal that stops
    the launcher (SIGTERM, SIGINT) is passed to every rank, which save and stop;
    the exit status is then 128 + the signal's number."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import get_args_parser, run
    warn_if_oversubscribed(nproc, "ranks", f"Use at most --nproc {available_cores()}, or "
                           f"--nproc auto (one rank per core, the same global batch).")
    args = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
         "-m", "peregrine", "train", *argv])
    # torchrun's own default for several ranks, set here so that it does not print a
    # four-line notice about it on every launch (each rank sets its threads itself)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        run(args)
    except ChildFailedError as error:
        print(f"peregrine train: {error}", file=sys.stderr, flush=True)
        return 1
    except SignalException as error:
        return 128 + int(error.sigval)
    return 0
