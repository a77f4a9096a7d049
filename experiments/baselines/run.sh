#!/usr/bin/env bash
# GRPO (the README's first command), RLOO (advantage=rloo) and PPO with a value head
# (algorithm=ppo) on the embedded model, seeds 0, 1, 2, each with the fast strength suite in
# its before/after table. Usage: bash experiments/baselines/run.sh <steps for the ppo arm>
# [output dir] [grpo runs to reuse]: PPO's steps are chosen so that its wall-clock matches
# GRPO's 45 steps; a directory of finished GRPO runs (seed0..2, as experiments/games/run.sh
# makes them under positions/) is linked instead of running that arm again.
set -euo pipefail
cd "$(dirname "$0")/../.."
ppo_steps=${1:?give the number of steps for the ppo arm}
out=${2:-outputs/baselines_study}
reuse=${3:-}
py=.venv/bin/python
mkdir -p "$out"
if [ -n "$reuse" ] && [ ! -e "$out/grpo" ]; then ln -s "$(realpath "$reuse")" "$out/grpo"; fi
for arm in grpo rloo ppo; do
  for s in 0 1 2; do
    run="$out/$arm/seed$s"
    mkdir -p "$out/$arm"
    [ -f "$run/outcome.json" ] && continue
    aside="$run.set-aside-$(date +%Y%m%d-%H%M%S)"  # the failed run kept, not overwritten
    [ -e "$run" ] && mv "$run" "$aside" && { [ ! -e "$run.log" ] || mv "$run.log" "$aside.log"; }
    case $arm in
      grpo) extra=() ;;
      rloo) extra=(advantage=rloo) ;;
      ppo) extra=(algorithm=ppo "steps=$ppo_steps") ;;
    esac
    t=$SECONDS
    $py -m rookworld.train seed=$s "${extra[@]}" hydra.run.dir="$run" > "$run.log" 2>&1
    echo "$arm seed $s: $((SECONDS - t)) s" | tee -a "$out/times.txt"
  done
done
$py experiments/arms_table.py "$out" grpo rloo ppo
