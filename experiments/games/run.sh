#!/usr/bin/env bash
# Episode GRPO (task_mix=games and its variants) against single-position GRPO (the README's
# first command) on the embedded model, seeds 0, 1, 2, each with the fast strength suite in
# its before/after table. Runs that succeeded (outcome.json) are skipped.
# Usage: bash experiments/games/run.sh <steps of the episode arms> [output dir] [arm ...]
#   arms: positions (the README's first command), games (self-play, python-chess as the
#   environment), model_env (task_mix.env=model), random (task_mix.opponent=random);
#   default: positions games. The episode arms' steps are chosen to match the positions
#   arm's wall-clock.
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:?give the number of steps for the episode arms}
out=${2:-outputs/games_study}
shift $(( $# < 2 ? $# : 2 ))
arms=("$@")
[ ${#arms[@]} -gt 0 ] || arms=(positions games)
py=.venv/bin/python
mkdir -p "$out"
for arm in "${arms[@]}"; do
  case $arm in
    positions) extra=() ;;
    games) extra=(task_mix=games "steps=$steps") ;;
    model_env) extra=(task_mix=games task_mix.env=model "steps=$steps") ;;
    random) extra=(task_mix=games task_mix.opponent=random "steps=$steps") ;;
    *) echo "unknown arm $arm" >&2; exit 2 ;;
  esac
  for s in 0 1 2; do
    run="$out/$arm/seed$s"
    mkdir -p "$out/$arm"
    grep -qs '"status": "success"' "$run/outcome.json" && continue  # failed runs run again
    aside="$run.set-aside-$(date +%Y%m%d-%H%M%S)"  # the failed run kept, not overwritten
    [ -e "$run" ] && mv "$run" "$aside" && { [ ! -e "$run.log" ] || mv "$run.log" "$aside.log"; }
    t=$SECONDS
    $py -m rookworld.train seed=$s "${extra[@]}" hydra.run.dir="$run" > "$run.log" 2>&1
    echo "$arm seed $s: $((SECONDS - t)) s" | tee -a "$out/times.txt"
  done
done
$py experiments/arms_table.py "$out" "${arms[@]}"
