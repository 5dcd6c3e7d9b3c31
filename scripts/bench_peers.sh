#!/usr/bin/env bash
# The peer comparison of docs/RESULTS.md, in one process per temperature: plain decoding,
# n-gram, EAGLE-3, DFlash and DSpark (the three drafters shipped under models/, trained on
# the same data with the same budget), plus DSpark with its draft length picked per step from
# this machine's measured step cost (dspark@cost, docs/benchmarking.md), the same with prompt
# lookup first (dspark+ngram@cost) and, when ABLATIONS=1 of scripts/train_default_drafter.sh
# has trained it, DSpark with Markov rank 256. Methods run interleaved prompt by prompt; greedy
# rows are checked token for token against plain decoding.
#   ROWS (6) prompts per dataset, TOKENS (128) new tokens per prompt, N (3,7) draft lengths;
#   BEFORE=DIR adds the drafters of an earlier models/ folder as dspark-before, dflash-before
#   and eagle3-before (e.g. `git archive 1b3eb13 models | tar -x -C DIR`, then DIR/models).
#   ~35 min on 2 CPU cores at the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-6}
TOKENS=${TOKENS:-128}
N=${N:-3,7}
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
EXTRA=""
R256=""
if [ -d .cache/corpus-train/run-dspark-r256/final ]; then
  R256=.cache/corpus-train/run-dspark-r256/final
  EXTRA=",dspark-r256=$R256"
fi
# PREVIOUS=DIR adds an earlier DSpark drafter as column dspark-prev (e.g. one from git history).
[ -n "${PREVIOUS:-}" ] && EXTRA="$EXTRA,dspark-prev=$PREVIOUS"
if [ -n "${BEFORE:-}" ]; then
  for m in dspark dflash eagle3; do EXTRA="$EXTRA,$m-before=$BEFORE/smollm2-135m-$m"; done
fi
.venv/bin/dspark setup >/dev/null
# PARTS (greedy t0.8): which of the two runs to do.
for part in ${PARTS:-greedy t0.8}; do
  case $part in
    greedy)
      .venv/bin/dspark bench --datasets gsm8k,humaneval --rows "$ROWS" --max-new-tokens "$TOKENS" --n "$N" \
        --methods "ngram,eagle3,dflash,dspark,dspark@cost,dspark+ngram@cost$EXTRA" \
        --out "$OUT/peers-greedy-smollm2-cpu.json" --markdown "$OUT/peers-greedy-smollm2-cpu.md"
      .venv/bin/dspark plot "$OUT/peers-greedy-smollm2-cpu.json" --n 7 --methods "ngram,eagle3,dflash,dspark${R256:+,dspark-r256}" \
        --out "$OUT/peers-acceptance-smollm2-cpu.png" ;;
    t0.8)
      # Rejection sampling with each drafter's own q; n-gram proposes a point mass (q = 1 on its token).
      .venv/bin/dspark bench --datasets gsm8k,humaneval --rows "$ROWS" --max-new-tokens "$TOKENS" --n 7 \
        --temperature 0.8 --methods "ngram,eagle3,dflash,dspark" \
        --out "$OUT/peers-t0.8-smollm2-cpu.json" --markdown "$OUT/peers-t0.8-smollm2-cpu.md" ;;
    *) echo "unknown part $part (greedy, t0.8)" >&2; exit 2 ;;
  esac
done
