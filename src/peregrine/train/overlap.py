"""Overlapped PPO (`train.overlap = true`): rollout k+1 is collected while update k learns.

Why two processes. On a small MLP the trainer's time is Python and torch
per-op overhead, not arithmetic. A second thread would share the GIL with the
learner and gain little; torch's own intra-op threads (`train.torch_threads 2`)
made the throughput config slower (benchmarks/RESULTS.md). So this module
splits one update's two halves across two processes, each with one torch
thread:

* the *actor* (a spawned process) owns the env batch and a copy of the policy;
  it runs the synchronous trainer's own `Trainer.collect` (env step, forward,
  sampling, storage writes) into rollout storage in shared memory;
* the *learner* (this process, `OverlapTrainer`) computes the advantages and
  runs the PPO epochs on that storage, as `Trainer.learn` does.

Rollout storage and weights are double-buffered shared-memory tensors: rollout
k lives in buffer k % 2, and the weights it is collected with in slot k % 2.
Control messages go over one pipe; a dead actor is seen at once through its
process sentinel (an error naming its exit code, not a hang), an exception in
the actor comes back as `ActorError` with its traceback.

The fixed schedule, and why results do not depend on timing. At the start of
update k the learner (holding weights theta_k) publishes theta_k and asks for
rollout k+1, then waits for rollout k and learns on it. So rollout k+1 is
always collected with theta_k, never with whatever weights happen to be there:
a one-update policy lag (rollout 0 and 1 both use theta_0). The actor's
sampling generator, the learner's minibatch generator and the env's streams
(re-derived from (seed, rollout index) as in the synchronous trainer) are
each advanced by one process in a fixed order, so a seed gives the same run
twice. It is not the synchronous run: the lag changes which data each update
sees.

The off-policy correction, explicit. Before learning on rollout k (behaviour
policy mu = theta_{k-1}), a forward pass of the current policy pi = theta_k
over the rollout (in minibatch-sized chunks) gives its log-probs and values.
Advantages are then GAE with V-trace-style clipped importance weights
w = min(1, pi(a|s) / mu(a|s)) on every TD error and trace
(`advantages.compute_gae(importance=...)`) and the current critic's values;
value targets are those advantages plus the current values. The PPO ratio
stays against mu's stored log-probs, as in the synchronous trainer. With no
lag (pi = mu) every weight is 1 and this is exactly synchronous PPO's
advantage. The recorded `importance_weight` (mean w) shows how far behind the
data was. Measured alternatives (CartPole, steps to a mean return of 475,
seeds 1-3, benchmarks/RESULTS.md): taking the PPO ratio against pi
("decoupled" PPO) with or without the weights, and no correction at all
(stored values and plain GAE) each needed more steps on some seed.

Truncated rows are bootstrapped in the actor with the behaviour critic (as
the env step happens there); that reward is then fixed data.

Checkpoints stay exact. At an update boundary the next rollout is already
requested; `state_dict` waits for it, and saves it (its storage buffer and
statistics) with the actor's state after it (env instances, sampling
generator). Resuming restores both, so the run continues bit for bit.

An emulated env steps in the actor itself by default (vec.backend "auto" is
"serial" under overlap: on two cores the actor and the learner already fill
them); `vec.backend = "multiprocessing"` gives the actor worker processes of its
own, for machines with cores to spare beyond those two.

Not supported with overlap (refused by the compatibility table,
config.INCOMPATIBLE): recurrent policies, observation/reward normalisation
(their statistics live in the actor), kickstarting, a device env batch or a
CUDA learner, an env object or an env callable without an import path (the
actor makes its own env from the config), several ranks.
The learner's process also builds the env batch once, only to read its
spaces and row count; it is never stepped.

What it is worth, measured (benchmarks/RESULTS.md, "Overlap"): learning is
78-86% of an update's CPU time on the CartPole throughput config and on
DroneSwarm, and the correction forward adds to it, so overlap can shorten an
update by only 2-8%; data parallelism (`--nproc`) splits the learning itself.
Hence synchronous PPO stays the default and this path is opt-in.

Time split of a record: `env` and `forward` are the actor's seconds (env step,
and the rest of its rollout); `learn` the learner's (correction forward, GAE,
epochs); `wait` the learner's seconds blocked on the actor, and `overlap`
the rollout seconds hidden behind learning (env + forward - wait).
"""
from __future__ import annotations

import copy
import signal
import time
import traceback
from multiprocessing.connection import wait as wait_for

import torch
import torch.multiprocessing as torch_mp

from ..envs.native.batch import EpisodeStats
from . import environment
from .advantages import fill_advantages
from .config import check_features
from .ppo import Trainer

STARTUP_SECONDS = 300.0    # env creation and imports in the spawned actor


class ActorError(RuntimeError):
    """An exception in the actor process; the message holds its traceback."""


class ActorDiedError(RuntimeError):
    """The actor process exited without being asked to (killed, crashed)."""


def _share(storage) -> None:
    """Moves every tensor of a RolloutStorage into shared memory (views follow)."""
    for value in vars(storage).values():
        if isinstance(value, torch.Tensor):
            value.share_memory_()


def _storage_tensors(storage) -> dict:
    """The rollout columns of a storage buffer by name (what a checkpoint saves)."""
    return {name: value for name, value in vars(storage).items()
            if isinstance(value, torch.Tensor) and name not in ("advantages", "returns")}


def _stats_dict(stats) -> dict:
    return {"count": int(stats.count), "mean": dict(stats.mean), "std": dict(stats.std)}


class OverlapTrainer(Trainer):
    """`Trainer` whose rollouts come from an actor process, one update ahead.

    Same interface as `Trainer` (update, state_dict, load_state_dict, close);
    `config.train.overlap` must be true. See the module docstring.
    """

    def __init__(self, config, env=None, teacher=None, dist=None):
        if not config.train.overlap:
            raise ValueError("OverlapTrainer needs train.overlap = true")
        check_features(config, teacher_object=teacher is not None, env_object=env is not None,
                       several_ranks=dist is not None)
        self.actor = self.connection = None
        super().__init__(config)
        try:
            self._start_actor()
        except BaseException:
            self.close()
            raise

    # ---- the actor process ------------------------------------------------------------
    def _start_actor(self) -> None:
        from ..vector.processes import unguarded_main_call
        found = unguarded_main_call()
        if found is not None:
            raise RuntimeError(f"train.overlap starts a spawned actor process, which re-imports "
                               f"the main script {found[0]}; put the code that trains (line "
                               f"{found[1]}) under `if __name__ == \"__main__\":`")
        self.buffers = [self.storage, copy.deepcopy(self.storage)]
        for storage in self.buffers:
            _share(storage)
        # The policy input after each rollout's last step (its last value for GAE).
        self.last_inputs = [torch.zeros_like(self.storage.obs[0]).share_memory_()
                            for _ in range(2)]
        self.weight_slots = [{name: tensor.detach().clone().share_memory_()
                              for name, tensor in self.policy.state_dict().items()}
                             for _ in range(2)]
        context = torch_mp.get_context("spawn")
        self.connection, child = context.Pipe()
        self.actor = context.Process(
            target=_actor_main, name="peregrine-overlap-actor", daemon=True,
            args=(self.config, self.buffers, self.last_inputs, self.weight_slots, child))
        self.actor.start()
        child.close()
        self._expect("ready", timeout=STARTUP_SECONDS)
        self._requested: set[int] = set()      # rollout indices asked for (done or not)
        self._received: dict[int, tuple] = {}  # rollout index -> its "rollout" message

    def _send(self, *message) -> None:
        try:
            self.connection.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._raise_dead()

    def _raise_dead(self):
        self.actor.join(timeout=1.0)
        # An actor that failed sent its traceback before exiting: report that, not the exit.
        try:
            while self.connection.poll():
                message = self.connection.recv()
                if message[0] == "error":
                    raise ActorError(f"the overlap actor process failed:\n{message[1]}")
        except (EOFError, OSError):
            pass
        raise ActorDiedError(f"the overlap actor process exited unexpectedly (exit code "
                             f"{self.actor.exitcode}); the run cannot continue")

    def _expect(self, kind: str, timeout: float | None = None) -> tuple:
        """The actor's next message, which must be of `kind`; raises on its death,
        its error, or `timeout` seconds without a message."""
        ready = wait_for([self.connection, self.actor.sentinel], timeout)
        if not ready:
            raise ActorDiedError(f"the overlap actor sent nothing for {timeout:.0f} s")
        if self.connection not in ready:   # dead, and nothing left to read
            self._raise_dead()
        try:
            message = self.connection.recv()
        except (EOFError, ConnectionResetError):
            self._raise_dead()
        if message[0] == "error":
            raise ActorError(f"the overlap actor process failed:\n{message[1]}")
        if message[0] != kind:
            raise RuntimeError(f"overlap actor protocol: expected {kind!r}, got {message[0]!r}")
        return message

    def _request(self, index: int) -> None:
        """Asks for rollout `index` (once), collected with the current weights."""
        if index in self._requested:
            return
        slot = self.weight_slots[index % 2]
        for name, tensor in self.policy.state_dict().items():
            slot[name].copy_(tensor)
        self._send("collect", index, index % 2)
        self._requested.add(index)

    def _rollout(self, index: int) -> tuple:
        """The message of rollout `index`, waiting for the actor if needed."""
        while index not in self._received:
            message = self._expect("rollout")
            self._received[message[1]] = message
        return self._received[index]

    # ---- one update -------------------------------------------------------------------
    def update(self) -> dict:
        k = self.updates
        start, cpu_start = time.perf_counter(), time.process_time()
        self._request(k)                    # only after a resume or at the start
        if k + 1 < self.total_updates:
            self._request(k + 1)            # with theta_k, overlapping this update
        _, _, env_seconds, actor_seconds, actor_cpu, stats = self._rollout(k)
        del self._received[k]
        learn_start = time.perf_counter()
        self.storage = self.buffers[k % 2]
        self._minibatches = self.storage.flat_minibatches
        importance = self.advantages()
        losses = self.learn()
        losses["importance_weight"] = importance
        end = time.perf_counter()
        waited = learn_start - start
        rollout_seconds = env_seconds + actor_seconds
        split = {"env": env_seconds, "forward": actor_seconds, "learn": end - learn_start,
                 "wait": waited, "overlap": max(rollout_seconds - waited, 0.0)}
        self.elapsed += end - start
        self.cpu_seconds += time.process_time() - cpu_start + actor_cpu
        self.updates += 1
        self.global_step += self.global_batch_size
        return self._record(split, losses, end - start, EpisodeStats(**stats))

    @torch.no_grad()
    def advantages(self) -> float:
        """The lag-corrected advantages of the current buffer (module docstring);
        returns the mean importance weight over live rows."""
        t, storage = self.config.train, self.storage
        n = storage.size
        columns = {"obs": storage.obs.view(n, *storage.obs.shape[2:]),
                   "actions": storage.actions.view(n, *storage.actions.shape[2:])}
        if storage.action_mask is not None:
            columns["action_mask"] = storage.action_mask.view(n, -1)
        logprobs, values = storage.advantages.view(n), storage.returns.view(n)  # scratch
        # Chunks of a minibatch: whole-rollout intermediates would be fresh pages
        # (page faults) on every update.
        chunk = t.minibatch_size
        for begin in range(0, n, chunk):
            part = self.evaluate({name: column[begin:begin + chunk]
                                  for name, column in columns.items()}, entropy=False)
            logprobs[begin:begin + chunk] = part.logprobs
            values[begin:begin + chunk] = part.values
        with self.autocast:
            last_value = self.policy.value(self.last_inputs[self.updates % 2]).float()
        importance = torch.sub(logprobs.view_as(storage.logprobs), storage.logprobs)
        importance.exp_().clamp_(max=1.0)
        storage.values.copy_(values.view_as(storage.values))
        fill_advantages(storage, last_value, t.gamma, t.gae_lambda, importance=importance)
        live = storage.live
        return float(importance.mean()) if bool(live.all()) else \
            float(importance[live].mean()) if bool(live.any()) else 1.0

    # ---- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict:
        k = self.updates
        pending = None
        if k in self._requested:    # the next rollout is part of the state: wait for it
            message = self._rollout(k)
            pending = {"columns": {name: tensor.clone() for name, tensor
                                   in _storage_tensors(self.buffers[k % 2]).items()},
                       "last_input": self.last_inputs[k % 2].clone(),
                       "message": list(message[1:5]), "stats": message[5]}
        self._send("state")
        actor = self._expect("state")[1]
        state = super().state_dict()
        state["env_state"] = actor["env_state"]
        state["next_starts"] = actor["next_starts"]
        state["overlap"] = {"actor_generator": actor["generator"], "pending": pending}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        overlap = state.get("overlap") or {}
        self._send("load", {"env_state": state.get("env_state"),
                            "generator": overlap.get("actor_generator"),
                            "next_starts": state["next_starts"], "updates": self.updates})
        self._expect("loaded")
        self._requested, self._received = set(), {}
        pending = overlap.get("pending")
        if pending is not None:
            k = self.updates
            for name, tensor in _storage_tensors(self.buffers[k % 2]).items():
                tensor.copy_(pending["columns"][name])
            self.last_inputs[k % 2].copy_(pending["last_input"])
            self._requested.add(k)
            self._received[k] = ("rollout", *pending["message"], pending["stats"])

    def close(self) -> None:
        """Stops the actor (asked, then terminated after a few seconds) and the env."""
        actor, self.actor = getattr(self, "actor", None), None
        if actor is not None:
            if actor.is_alive():
                try:
                    self.connection.send(("stop",))
                except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                    pass
                actor.join(timeout=5.0)
            if actor.is_alive():
                actor.terminate()
                actor.join(timeout=5.0)
            if actor.is_alive():
                actor.kill()
                actor.join()
        if getattr(self, "connection", None) is not None:
            self.connection.close()
            self.connection = None
        super().close()


def _actor_main(config, buffers, last_inputs, weight_slots, connection) -> None:
    """The actor process: a `Trainer` used only for its env, policy copy and
    `collect`, serving the learner's requests in order until told to stop or the
    learner goes away."""
    # Ctrl-C reaches the whole process group; the learner decides how the run ends
    # (finish the update, save with this process's state, then stop it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The learner starts this process as a daemon (ended with it), and multiprocessing
    # refuses children to a daemon lest they be orphaned. An env on the multiprocessing
    # backend starts worker processes here; each dies with its parent (vector/lifetime.py:
    # the kernel's parent-death signal and a parent watch), so it may.
    torch_mp.current_process().daemon = False
    actor = None
    try:
        actor = Trainer(config)
        actor.storage = buffers[0]          # its own storage is never used
        seed = config.train.seed
        connection.send(("ready",))
        while True:
            command, *arguments = connection.recv()
            if command == "stop":
                break
            if command == "collect":
                index, buffer = arguments
                start, cpu_start = time.perf_counter(), time.process_time()
                actor.policy.load_state_dict(weight_slots[buffer])
                actor.storage = buffers[buffer]
                if actor.exact_resume:
                    environment.reseed_streams(actor.env, seed, index)
                env_seconds = actor.collect()
                last_inputs[buffer].copy_(actor.pipeline.current())
                stats = _stats_dict(actor.env.episode_stats(clear=True))
                seconds = time.perf_counter() - start
                connection.send(("rollout", index, env_seconds, seconds - env_seconds,
                                 time.process_time() - cpu_start, stats))
            elif command == "state":
                connection.send(("state", {
                    "env_state": environment.snapshot(actor.env) if actor.exact_resume else None,
                    "generator": actor.generator.get_state(),
                    "next_starts": actor.rollout_state.starts.clone()}))
            elif command == "load":
                _load_actor(actor, arguments[0], seed)
                connection.send(("loaded",))
            else:
                raise RuntimeError(f"unknown overlap actor command {command!r}")
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass                                # the learner is gone: nothing to report to
    except BaseException:  # noqa: BLE001 - reported to the learner, which raises it
        try:
            connection.send(("error", traceback.format_exc()))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
    finally:
        if actor is not None:
            actor.close()
        connection.close()


def _load_actor(actor, state: dict, seed: int) -> None:
    """The actor's side of a resume: env instances, sampling generator, episode starts."""
    if state["env_state"] is not None and actor.exact_resume:
        environment.restore(actor.env, state["env_state"])
    else:
        actor.env.reset(seed=environment.stream_seed(seed, state["updates"]) & 0x7FFFFFFFFFFFFFFF)
        state["next_starts"].fill_(True)
    if state["generator"] is not None:
        actor.generator.set_state(state["generator"])
    actor.rollout_state.starts = state["next_starts"].clone()
    actor.env.episode_stats(clear=True)
