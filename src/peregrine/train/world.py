"""The env world a run trained in, and how evaluation changes it.

A checkpoint records the env it was trained on and the keywords of `make`
that built its world (`checkpoint.env_kwargs`): that is a fact of the run.
`world_of` turns it, plus an optional preset and config overrides, into the
keywords an evaluation, a render or `checkpoint.make_trained_env` builds the env
with. Torch-free, so scripted evaluation never imports torch.
"""
from __future__ import annotations

from ..envs.registry import ENVS, env_class


def world_of(env_name: str, trained: tuple | None, preset: str | None = None,
             overrides: dict | None = None) -> dict:
    """`peregrine.evaluate.eval_world`'s answer for a policy whose checkpoint world is `trained`, the
    (env name, keywords) pair `train.checkpoint.env_kwargs` reads, or None for a
    policy that is not a checkpoint; for callers that have read it already."""
    overrides = dict(overrides or {})
    checkpoint = trained is not None
    trained_name, trained = trained if checkpoint else (None, {})
    if preset is not None:
        base, source = {"preset": preset}, f"preset {preset}"
        # The agent's own sensors (observation columns a preset does not choose) stay
        # the checkpoint's, or its policy could not read the observations.
        kept = {k: trained[k] for k in _agent_fields(env_name) if k in trained}
        if kept:
            base.update(kept)
            source += " with the checkpoint's " + ", ".join(f"{k}={v!r}" for k, v in kept.items())
    elif checkpoint:
        base = trained
        fields = [f"{k}={v!r}" for k, v in base.items() if k != "preset"]
        source = (f"the checkpoint's own (preset {base.get('preset', 'default')}"
                  + (f", {', '.join(fields)}" if fields else "") + ")")
        if trained_name is None:
            source = "preset default (the checkpoint records no env config)"
    else:
        base, source = {}, "preset default"
    if overrides:
        source += ", overridden: " + ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    return {"kwargs": {**base, **overrides}, "description": source,
            "explicit": preset is not None or bool(overrides)}


def _agent_fields(env_name: str) -> tuple:
    """The env's config fields that describe the agent's observations rather than the
    world (its class's `agent_fields`, e.g. DroneSwarm's obs_report)."""
    return tuple(getattr(env_class(env_name), "agent_fields", ())) if env_name in ENVS else ()


