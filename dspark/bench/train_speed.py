"""Features and training throughput: the first recipes' settings against today's, one run.

    python -m dspark.bench.train_speed --data train.jsonl --out results.json [--rows 96 --steps 48]

On the same rows and the same drafter, in one process, one after the other:

- **features** (`dspark cache-features`): the target in fp32 with two torch threads in one
  process (the first recipes), against the target in bf16 in two single-thread worker
  processes (``--target-dtype bfloat16 --workers 2``). Also how far the bf16 target's
  features are from the fp32 ones: the relative error of the final state, and how often its
  argmax over the draft vocab (the teacher's choice) agrees with fp32's on assistant tokens.
- **training** (`dspark train`, one torch thread, one row and 32 anchors per step, reading
  the offline cache): fp32 with the for-each AdamW and metrics at every step against bf16
  autocast with the fused AdamW and metrics at logged steps (every 10th, as the recipes log),
  per drafter kind.
- **pipeline**: tokens/s of "features once, then three drafters trained side by side on
  two cores", derived from the measured rates: 1 / (1/features + 1.5/training), training
  being the mean over the three kinds (three one-thread trainers share two cores).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

KINDS = {  # init options per drafter family
    "dspark": {"markov_rank": 64},
    "dflash": {},
    "eagle3": {"speculative_steps": 7},
}


def _drafter(target, kind: str, vocab):
    from dspark import families
    from dspark.formats.checkpoint import init_drafter

    options = {"layers": 1, "aux_layers": [2, 15, 27], "draft_vocab_size": 8192, **KINDS[kind]}
    if kind != "eagle3":
        options["mask_token_id"] = 16
    return init_drafter(target, families.get(kind).config_for_target(target, options), seed=0, vocab=vocab)


def _train_rate(target, kind: str, vocab, cache: Path, steps: int, new: bool, work: Path) -> dict:
    from dspark.training.feature_cache import OfflineSource
    from dspark.training.trainer import TrainConfig, Trainer, lr_factor

    torch.set_num_threads(1)
    model = _drafter(target, kind, vocab)
    # The first trainer computed every step's metrics; today's only a logged step's (the
    # recipes log every 10th): log_every=1 reproduces the first, 10 is the recipes' now.
    cfg = TrainConfig(
        steps=steps,
        lr=1e-3,
        warmup=10,
        max_anchors=32,
        seq_len=512,
        checkpoint_every=10**9,
        autocast_bf16=new,
        log_every=10 if new else 1,
    )
    source = OfflineSource(cache, model.config.aux_hidden_state_layer_ids, seed=0)
    trainer = Trainer(model, source, cfg, work / f"{kind}-{'new' if new else 'old'}", progress=False)
    if not new:  # the first recipes' optimizer: the default (for-each) AdamW
        trainer.opt = torch.optim.AdamW(trainer.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        trainer.sched = torch.optim.lr_scheduler.LambdaLR(trainer.opt, lambda s: lr_factor(s, cfg))
    tokens = sum(int(b.input_ids.numel()) for b in source.batches(0, steps))
    t0 = time.perf_counter()
    last = trainer.train()
    wall = time.perf_counter() - t0
    return {"steps": steps, "tokens": tokens, "seconds": wall, "tokens_per_second": tokens / wall, "loss": last["loss"]}


def run(target_dir: Path, data: Path, out: Path, *, rows: int, steps: int) -> dict:
    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.model.vocab import mapping_from_counts
    from dspark.target import TargetModel
    from dspark.training.data import assistant_token_counts, load_examples, save_examples
    from dspark.training.feature_cache import build_feature_cache

    aux = (2, 15, 27)
    examples = load_examples(data, max_len=512)[:rows]
    tokens = sum(int(e.input_ids.numel()) for e in examples)
    meta = provenance(0, target=str(target_dir), data=str(data), rows=len(examples), tokens=tokens, steps=steps)
    work = Path(tempfile.mkdtemp(prefix="dspark-train-speed-"))
    try:
        subset = save_examples(examples, work / "rows.jsonl")
        features = {}
        torch.set_num_threads(2)
        fp32 = TargetModel.from_pretrained(target_dir)
        t0 = time.perf_counter()
        build_feature_cache(fp32, examples, aux, work / "fp32", shard_size=16, progress=False)
        wall = time.perf_counter() - t0
        features["fp32_2_threads"] = {"seconds": wall, "tokens_per_second": tokens / wall}
        bf16 = TargetModel.from_pretrained(target_dir, dtype=torch.bfloat16)
        t0 = time.perf_counter()
        build_feature_cache(
            bf16,
            examples,
            aux,
            work / "bf16",
            shard_size=16,
            progress=False,
            workers=2,
            target_dir=target_dir,
            data=subset,
            max_len=512,
        )
        wall = time.perf_counter() - t0
        features["bf16_2_workers"] = {
            "seconds": wall,
            "tokens_per_second": tokens / wall,
            "note": "includes starting the two workers and loading the target in each",
        }
        vocab_ids = mapping_from_counts(assistant_token_counts(examples, fp32.vocab_size), 8192)
        features["bf16_vs_fp32"] = _agreement(work, fp32, examples, vocab_ids)
        del bf16
        training = {}
        vocab = (vocab_ids[0], vocab_ids[1])
        for kind in KINDS:
            old = _train_rate(fp32, kind, vocab, work / "fp32", steps, False, work)
            new = _train_rate(fp32, kind, vocab, work / "bf16", steps, True, work)
            training[kind] = {"fp32_foreach_adamw": old, "bf16_autocast_fused_adamw": new}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def pipeline(feat: float, train: list[float]) -> float:
        return 1.0 / (1.0 / feat + 1.5 / statistics.mean(train))

    before = pipeline(
        features["fp32_2_threads"]["tokens_per_second"],
        [t["fp32_foreach_adamw"]["tokens_per_second"] for t in training.values()],
    )
    after = pipeline(
        features["bf16_2_workers"]["tokens_per_second"],
        [t["bf16_autocast_fused_adamw"]["tokens_per_second"] for t in training.values()],
    )
    report = {
        "provenance": finished(meta),
        "features": features,
        "training": training,
        "pipeline_three_drafters_2_cores": {
            "first_recipes_tokens_per_second": before,
            "now_tokens_per_second": after,
            "speedup": after / before,
            "formula": "1 / (1/features + 1.5/mean training rate of the three kinds)",
        },
    }
    write_json(out, report)
    return report


def _agreement(work: Path, fp32_target, examples, vocab) -> dict:
    """bf16-target features against fp32 ones on the same rows (assistant positions)."""
    from dspark.training.feature_cache import OfflineSource

    d2t = vocab[0]
    keep = torch.arange(d2t.numel()) + d2t  # draft id -> target id
    head = fp32_target.lm_head_weight().detach().float()[keep]
    a = OfflineSource(work / "fp32", (2, 15, 27), seed=0)
    b = OfflineSource(work / "bf16", (2, 15, 27), seed=0)
    agree = total = 0
    err = []
    for x, y in zip(a.batches(0, len(examples)), b.batches(0, len(examples)), strict=True):
        mask = x.loss_mask.bool()
        hx, hy = x.last_hidden[mask], y.last_hidden[mask]
        err.append(float((hx - hy).norm() / hx.norm().clamp_min(1e-12)))
        agree += int(((hx @ head.T).argmax(-1) == (hy @ head.T).argmax(-1)).sum())
        total += int(mask.sum())
    return {
        "final_state_relative_error_mean": statistics.mean(err),
        "teacher_argmax_agreement": agree / max(1, total),
        "assistant_tokens": total,
    }


def parser(doc: str, *, rows: int, steps: int) -> argparse.ArgumentParser:
    """The options of a training-throughput bench: the rows it reads, its output, the target,
    how many rows and steps."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="rows {input_ids, loss_mask} (dspark corpus export)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--target", type=Path, default=None, help="target directory (default: the embedded one)")
    p.add_argument("--rows", type=int, default=rows)
    p.add_argument("--steps", type=int, default=steps)
    return p


def main(argv: list[str] | None = None) -> None:
    from dspark.defaults import resolve_target

    a = parser(__doc__, rows=96, steps=48).parse_args(argv)
    report = run(resolve_target(a.target), a.data, a.out, rows=a.rows, steps=a.steps)
    f = report["features"]
    print(
        f"features: fp32 {f['fp32_2_threads']['tokens_per_second']:.0f} tok/s -> bf16 x2 workers "
        f"{f['bf16_2_workers']['tokens_per_second']:.0f} tok/s (teacher argmax agreement "
        f"{f['bf16_vs_fp32']['teacher_argmax_agreement']:.4f})"
    )
    for kind, t in report["training"].items():
        o, n = t["fp32_foreach_adamw"], t["bf16_autocast_fused_adamw"]
        print(f"train {kind}: {o['tokens_per_second']:.0f} -> {n['tokens_per_second']:.0f} tok/s")
    pl = report["pipeline_three_drafters_2_cores"]
    print(
        f"pipeline: {pl['first_recipes_tokens_per_second']:.0f} -> {pl['now_tokens_per_second']:.0f} tok/s "
        f"({pl['speedup']:.2f}x)"
    )


if __name__ == "__main__":
    main()
