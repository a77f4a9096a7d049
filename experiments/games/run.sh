#!/usr/bin/env bash
# Episode GRPO (task_mix=games) against single-position GRPO (the README's first command) on
# the embedded model, seeds 0, 1, 2, each with the fast strength suite in its before/after
# table. Usage: bash experiments/games/run.sh <steps for the games arm> [output dir]
# (the games arm's steps are chosen so that its wall-clock matches the default run's).
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:?give the number of steps for the games arm}
out=${2:-outputs/games_study}
py=.venv/bin/python
mkdir -p "$out"
for arm in positions games; do
  for s in 0 1 2; do
    run="$out/$arm/seed$s"
    mkdir -p "$out/$arm"
    [ -f "$run/outcome.json" ] && continue
    extra=()
    [ "$arm" = games ] && extra=(task_mix=games "steps=$steps")
    t=$SECONDS
    $py -m rookworld.train seed=$s "${extra[@]}" hydra.run.dir="$run" > "$run.log" 2>&1
    echo "$arm seed $s: $((SECONDS - t)) s" | tee -a "$out/times.txt"
  done
done
$py experiments/arms_table.py "$out" positions games
