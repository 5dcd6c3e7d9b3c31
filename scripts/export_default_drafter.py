"""Copy a trained default drafter into models/ with its TRAINING.json (step 5 of train_default_drafter.sh).

    python scripts/export_default_drafter.py dspark|dflash|eagle3

Reads .cache/corpus-train/run-<method>/final and its train log; writes models/smollm2-135m-<method>
(bf16, without the target's embedding). TRAINING.json records the corpus, the budget, the loss
and the teacher-forced accept_len of the shipped copy (`dspark evaluate`, n=7, 32 blocks a
row, the target in fp32) on the first 64 training rows and on the corpus's held-out split.
The drafter already in models/ is scored on the same held-out rows first: a new drafter that
scores lower does not replace it (its summary goes to run-<method>/TRAINING-candidate.json;
FORCE=1 ships it anyway).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from dspark.defaults import default_draft_dir, default_target_dir
from dspark.formats.checkpoint import load_drafter, save_drafter
from dspark.formats.convert import open_drafter
from dspark.target import TargetModel
from dspark.training.data import load_examples
from dspark.training.evaluate import simulated_accept_len

CACHE = Path(".cache/corpus-train")
DATA = CACHE / "train.jsonl"
HELDOUT = CACHE / "heldout.jsonl"
CORPUS = Path("corpus/smollm2-135m-instruct")
EVAL_ROWS = 64


def heldout_accept_len(path: Path, target: TargetModel) -> float:
    """Teacher-forced accept_len on the held-out split, the drafter loaded as `dspark evaluate
    --draft models/...` loads it."""
    model = open_drafter(path, target=target)
    held = load_examples(HELDOUT, max_len=512)
    return simulated_accept_len(model, target, held, max_anchors=32, num_drafts=7)["sim_accept_len"]


def teacher_forced(out: Path, target: TargetModel, heldout: float) -> dict:
    """accept_len of the shipped copy on the first training rows, with its held-out figure."""
    model = open_drafter(out, target=target)
    train = load_examples(DATA, max_len=512)[:EVAL_ROWS]
    held = sum(1 for line in HELDOUT.open() if line.strip())
    return {
        f"teacher_forced_accept_len_{len(train)}_training_rows": simulated_accept_len(
            model, target, train, max_anchors=32, num_drafts=7
        )["sim_accept_len"],
        f"teacher_forced_accept_len_{held}_heldout_rows": heldout,
    }


def ship_unless_unchanged(model, out: Path) -> None:
    """Write the bf16 drafter to ``out`` unless it holds the same config and tensors already:
    safetensors may order the same tensors differently, and git would store the file again."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = save_drafter(model, tmp, dtype=torch.bfloat16, include_embeddings=False)
        old_weights, new_weights = out / "model.safetensors", fresh / "model.safetensors"
        if old_weights.is_file() and (out / "config.json").read_text() == (fresh / "config.json").read_text():
            old, new = load_file(old_weights), load_file(new_weights)
            if old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old):
                print(f"{out}: weights unchanged, kept")
                return
    save_drafter(model, out, dtype=torch.bfloat16, include_embeddings=False)


def manifest_rows(manifest: dict) -> int:
    return sum(shard["rows"] for shard in manifest["shards"])


def main(method: str) -> None:
    os.chdir(Path(__file__).resolve().parent.parent)
    run = CACHE / f"run-{method}"
    target = TargetModel.from_pretrained(default_target_dir())
    out = default_draft_dir(method)
    model = load_drafter(run / "final", target_embedding=target.embedding_weight())
    before = heldout_accept_len(out, target) if (out / "config.json").is_file() else None
    candidate = candidate_dir(run, model)  # the new drafter as it would ship, scored once
    after = heldout_accept_len(candidate, target)
    replace = before is None or after >= before or os.environ.get("FORCE") == "1"
    if replace:
        ship_unless_unchanged(model, out)
    else:
        print(f"{out}: kept the shipped drafter (held-out accept_len {before:.3f}); {run / 'final'} scores {after:.3f}")
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    # The last 30 logged steps (log_every 10) that had a loss: a row too short for one block
    # gives a step with no anchors, logged without loss or metrics.
    tail = [r for r in log if "loss" in r][-30:]
    recipe = json.loads((run / "recipe.json").read_text())
    split = [json.loads(line) for line in DATA.open()]
    rows = split[: recipe["train"].get("max_examples")]
    which = f"the first {len(rows):,} of its {len(split):,}" if len(rows) < len(split) else f"{len(rows):,}"
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    summary = {
        "recipe": f"recipes/smollm2-135m-{method}.yaml",
        "data": f"the train split of {CORPUS} ({manifest_rows(manifest):,} rows when exported): {which} "
        f"self-distilled answers (greedy, <= 256 new tokens), {sum(sum(r['loss_mask']) for r in rows):,} "
        "assistant tokens",
        "source": source_text(recipe),
        "steps": log[-1]["step"],
        "epochs": round(log[-1]["step"] / len(rows), 2),  # one row a step
        "wall_minutes": round(sum(r["step_seconds"] for r in log) * 10 / 60, 1),
        "final_loss_mean_last_300_steps": statistics.mean(r["loss"] for r in tail),
        "sim_accept_len_mean_last_300_steps": statistics.mean(r["sim_accept_len"] for r in tail),
        **teacher_forced(out if replace else candidate, target, after),
        "heldout_accept_len_of_the_drafter_it_replaces": before,
        "machine": "2 CPU cores (shared), torch " + torch.__version__,
        "note": "accept_len figures are teacher forced (1 + expected accepted drafts per block): the log mean "
        "is over 30 single training sequences (noisy); the teacher_forced_* ones are `dspark evaluate` "
        "(n=7, 32 blocks a row, the target in fp32) on the first 64 training rows and on the corpus's held-out "
        "split (prompts never trained on)",
    }
    where = out / "TRAINING.json" if replace else run / "TRAINING-candidate.json"
    where.write_text(json.dumps(summary, indent=2) + "\n")
    print("wrote", where, json.dumps(summary, indent=2))


def source_text(recipe: dict) -> str:
    """Where the run's target features came from, as its recipe.json says."""
    aux = "aux layers " + ",".join(str(i) for i in recipe["drafter"]["aux_layers"])
    short = {"bfloat16": "bf16", "float32": "fp32"}
    if recipe["source"] == "offline":
        manifest = Path(recipe.get("cache") or CACHE / "features-bf16") / "manifest.json"
        dtype = json.loads(manifest.read_text()).get("target_dtype", "float32") if manifest.is_file() else None
        target = f", the target in {short.get(dtype, dtype)}" if dtype else ""
        return f"offline (the feature cache of dspark cache-features{target}, {aux})"
    dtype = short.get(recipe.get("target_dtype", "float32"), recipe.get("target_dtype"))
    return f"{recipe['source']} (features computed as training reads them, no cache; the target in {dtype}, {aux})"


def candidate_dir(run: Path, model) -> Path:
    """The new drafter as it would ship (bf16, no embedding), kept beside its run."""
    return save_drafter(model, run / "candidate", dtype=torch.bfloat16, include_embeddings=False)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("dspark", "dflash", "eagle3"):
        sys.exit("usage: python scripts/export_default_drafter.py dspark|dflash|eagle3")
    main(sys.argv[1])
