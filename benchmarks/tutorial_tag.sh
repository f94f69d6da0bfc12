#!/bin/bash
# The C-env tutorial's Tag (docs/c_envs.md): the scaffold's multi-agent env, installed as a
# plugin, trained on five fresh seeds with the config it ships, each evaluated on 100
# episodes (seed 1000), beside a random policy. Run from the repository root:
#   bash benchmarks/tutorial_tag.sh          -> runs/tag-tutorial/, summary on stdout
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=runs/tag-tutorial
mkdir -p "$OUT"
rm -rf "$OUT/tag" && $PY -m peregrine.cli new-env tag --multi-agent --dir "$OUT" > /dev/null
$PY -m pip install --quiet --no-build-isolation --no-deps --no-index "$OUT/tag"
for s in 1 2 3 4 5; do
  $PY -m peregrine.cli train tag --seed $s --detach --run-dir "$OUT/s$s" --overwrite \
      --train.tensorboard false > "$OUT/train-$s.log"
  $PY -m peregrine.cli eval --policy "$OUT/s$s" --episodes 100 --seed 1000 --json > "$OUT/eval-$s.json"
done
$PY -m peregrine.cli eval tag --policy random --episodes 100 --seed 1000 --json > "$OUT/eval-random.json"
$PY - "$OUT" <<'PYTHON'
import json, statistics, sys
out = sys.argv[1]
rows = {s: json.load(open(f"{out}/eval-{s}.json"))["mean"] for s in range(1, 6)}
for s, mean in rows.items():
    print(f"seed {s}: return {mean['episode_return']:.3f}, steps to tag {mean['episode_length']:.2f}, tagged {mean['tagged']:.2f}")
returns = [m["episode_return"] for m in rows.values()]
lengths = [m["episode_length"] for m in rows.values()]
print(f"median return {statistics.median(returns):.3f} (worst {min(returns):.3f}); median steps "
      f"to tag {statistics.median(lengths):.2f} (worst {max(lengths):.2f})")
print("random policy:", json.load(open(f"{out}/eval-random.json"))["mean"])
PYTHON
