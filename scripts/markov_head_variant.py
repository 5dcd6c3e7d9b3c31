"""Give a trained vanilla-head DSpark drafter a ``gated`` or ``rnn`` Markov head that starts out
computing what its vanilla head computes, so training can continue from it (the head-type
ablation in docs/history.md; continue with `dspark train` and `drafter: {path: OUT_DIR}`).

    .venv/bin/python scripts/markov_head_variant.py SRC_DRAFTER OUT_DIR gated|rnn

- gated: bias = W2(g * W1[prev]) with g = sigmoid(gate_proj([h ; W1[prev]])); gate_proj gets
  small random weights and bias +4, so g ~ 0.98 at the start.
- rnn: bias = W2(tanh(o)) with [gate, cand, o] = joint_proj([state ; W1[prev] ; h]); the o rows
  start as the identity on W1[prev] (tanh is near the identity there: |W1| averages ~0.01 in the
  shipped drafter), the gate and candidate rows small and random.

Everything else (backbone, W1, W2, confidence head, vocab maps) is copied unchanged. OUT_DIR
must not exist yet: nothing is overwritten.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[3] not in ("gated", "rnn"):
        sys.exit(__doc__)
    src, out, kind = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    if out.exists():
        sys.exit(f"{out} exists; not overwriting it")
    config = json.loads((src / "config.json").read_text())
    if config.get("markov_head_type") != "vanilla" or not config.get("markov_rank"):
        sys.exit(f"{src}: needs a drafter with a vanilla Markov head (markov_rank > 0)")
    state = load_file(str(src / "model.safetensors"))
    r = config["markov_rank"]
    hidden = config["transformer_layer_config"]["hidden_size"]
    dtype = state["markov_head.markov_w1.weight"].dtype
    gen = torch.Generator().manual_seed(0)
    if kind == "gated":
        state["markov_head.gate_proj.weight"] = (torch.randn(r, hidden + r, generator=gen) * 0.01).to(dtype)
        state["markov_head.gate_proj.bias"] = torch.full((r,), 4.0).to(dtype)
    else:
        weight = torch.randn(3 * r, 2 * r + hidden, generator=gen) * 0.01
        weight[2 * r :] = 0
        weight[2 * r :, r : 2 * r] = torch.eye(r)
        state["markov_head.joint_proj.weight"] = weight.to(dtype)
        state["markov_head.joint_proj.bias"] = torch.zeros(3 * r).to(dtype)
    config["markov_head_type"] = kind
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{out}: {kind} Markov head (rank {r}) on {src}")


if __name__ == "__main__":
    main()
