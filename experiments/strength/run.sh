#!/usr/bin/env bash
# The figures of experiments/strength/README.md: the full strength suite on the shipped
# model, the README's first command for seeds 0, 1 and 2 (each with strength=fast in its
# before/after table), then the full suite on each final model, paired with the shipped
# model's (the same puzzles, positions and game set-ups).
# Usage: bash experiments/strength/run.sh [output dir]   (about 70 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-outputs/strength_study}
py=.venv/bin/python
mkdir -p "$out"
if [ ! -f "$out/shipped.json" ]; then
  t=$SECONDS
  $py -m rookworld.evaluate suite=strength strength_dir="$out/suite/shipped" \
    out="$out/shipped.json" > "$out/shipped.md"
  echo "shipped suite: $((SECONDS - t)) s" | tee -a "$out/times.txt"
fi
for s in 0 1 2; do
  run="$out/seed$s"
  if [ ! -f "$run/outcome.json" ]; then
    aside="$run.set-aside-$(date +%Y%m%d-%H%M%S)"  # the failed run kept, not overwritten
    [ -e "$run" ] && mv "$run" "$aside" && { [ ! -e "$out/seed$s.train.log" ] || mv "$out/seed$s.train.log" "$aside.train.log"; }
    t=$SECONDS
    $py -m rookworld.train seed=$s hydra.run.dir="$run" > "$out/seed$s.train.log" 2>&1
    echo "seed $s training: $((SECONDS - t)) s" | tee -a "$out/times.txt"
  fi
  if [ ! -f "$out/seed$s.json" ]; then
    t=$SECONDS
    $py -m rookworld.evaluate suite=strength model.path="$run/checkpoints/step-000045/model" \
      strength_dir="$out/suite/seed$s" out="$out/seed$s.json" against="$out/shipped.json" \
      > "$out/seed$s.md"
    echo "seed $s suite: $((SECONDS - t)) s" | tee -a "$out/times.txt"
  fi
done
