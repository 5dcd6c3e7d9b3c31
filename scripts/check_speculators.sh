#!/usr/bin/env bash
# Does speculators 0.9.0 (the format vLLM's `dspark` method reads) load our exports and compute
# the same logits? Builds a separate venv for it outside the repo (speculators pins
# transformers <= 5.19, we need >= 5.20), then runs scripts/speculators_parity.py for seven tiny
# drafter variants (six DSpark/DFlash, one EAGLE-3) and, when `dspark setup` has built it, the
# three shipped drafters (dspark, dflash, eagle3).
# Writes docs/results/speculators-parity.json. Needs ./.venv (bash scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${DSPARK_CACHE:-$HOME/.cache/dspark}
VENV="$CACHE/venvs/speculators-0.9.0"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import speculators" 2>/dev/null; then
  echo "building $VENV (speculators 0.9.0 and only what its model code imports) ..."
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==2.13.0" "transformers==5.19.0" "pydantic>=2" pydantic-settings safetensors \
    "loguru>=0.7.2,<=0.7.3" "numpy>=2,<2.5" tqdm rich click typer httpx protobuf psutil openai aiohttp "datasets>=4,<=5.1"
  # torchvision/torchaudio are declared but not imported by the model code; skip them (and their CUDA pull).
  "$VENV/bin/pip" install -q --no-deps "speculators==0.9.0" "hs-connectors==0.9.0"
fi
variants="tiny-anchor-vanilla tiny-dflash-layout-markov tiny-gated tiny-rnn tiny-conf-without-markov tiny-dflash tiny-eagle3"
TARGET="$CACHE/targets/SmolLM2-135M-Instruct"
results=()
status=0
for v in $variants default default-dflash default-eagle3; do
  if [[ "$v" == default* ]]; then
    [ -f "$TARGET/config.json" ] || { echo "skip $v drafter: run 'dspark setup' first"; continue; }
    m=${v#default}; m=${m#-}
    .venv/bin/python scripts/speculators_parity.py make --draft "models/smollm2-135m-${m:-dspark}" --target "$TARGET" --work "$WORK/$v"
  else
    .venv/bin/python scripts/speculators_parity.py make --draft "$v" --work "$WORK/$v"
  fi
  if "$VENV/bin/python" scripts/speculators_parity.py check --work "$WORK/$v" --out "$WORK/$v.json" 2>"$WORK/$v.log"; then
    echo "$v: pass"
  else
    echo "$v: FAIL"; tail -5 "$WORK/$v.log"; status=1
  fi
  [ -f "$WORK/$v.json" ] && results+=("\"$v\": $(cat "$WORK/$v.json")")
done
mkdir -p docs/results
( IFS=,; echo "{${results[*]}}" ) | python3 -m json.tool > docs/results/speculators-parity.json
echo "wrote docs/results/speculators-parity.json"
exit $status
