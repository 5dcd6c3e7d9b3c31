"""bfloat16 against float32 on this machine, for the training pipeline, one run.

    python -m dspark.bench.dtype_speed --data train.jsonl --out results.json [--rows 32 --steps 30]

On the same rows, in one process, one setting after the other:

- **features** (`dspark cache-features --workers 2`): the target in float32 against the target
  in bfloat16, two one-thread worker processes each (their start-up included).
- **training** (`dspark train`, the shipped DSpark recipe's drafter, one torch thread, one row
  and 32 anchors a step, from the float32 features' cache): bf16 autocast off against on.

It also records what ``auto`` (`--target-dtype auto`, `train.autocast_bf16: auto`) picks here:
bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), else float32. On a CPU that
emulates bf16 the bf16 rows show what ``auto`` saves; on one with native bf16, what it gains.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

AUX = (2, 15, 27)


def _features(target_dir: Path, examples, subset: Path, out: Path, dtype: torch.dtype) -> dict:
    from dspark.target import TargetModel
    from dspark.training.feature_cache import build_feature_cache

    target = TargetModel.from_pretrained(target_dir, dtype=dtype)
    tokens = sum(int(e.input_ids.numel()) for e in examples)
    t0 = time.perf_counter()
    build_feature_cache(
        target, examples, AUX, out, shard_size=8, progress=False, workers=2, target_dir=target_dir, data=subset,
        max_len=512,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    return {"seconds": wall, "tokens": tokens, "tokens_per_second": tokens / wall}


def _training(target, vocab, cache: Path, steps: int, autocast: bool, work: Path) -> dict:
    from dspark import families
    from dspark.formats.checkpoint import init_drafter
    from dspark.training.feature_cache import OfflineSource
    from dspark.training.trainer import TrainConfig, Trainer

    torch.set_num_threads(1)
    options = {"layers": 1, "aux_layers": list(AUX), "draft_vocab_size": 8192, "markov_rank": 64, "mask_token_id": 16}
    model = init_drafter(target, families.get("dspark").config_for_target(target, options), seed=0, vocab=vocab)
    cfg = TrainConfig(
        steps=steps, lr=1e-3, warmup=10, max_anchors=32, seq_len=512, checkpoint_every=10**9, autocast_bf16=autocast,
        log_every=10,
    )  # fmt: skip
    source = OfflineSource(cache, AUX, seed=0)
    tokens = sum(int(b.input_ids.numel()) for b in source.batches(0, steps))
    trainer = Trainer(model, source, cfg, work / f"train-{'bf16' if autocast else 'fp32'}", progress=False)
    t0 = time.perf_counter()
    last = trainer.train()
    wall = time.perf_counter() - t0
    return {"steps": steps, "tokens": tokens, "seconds": wall, "tokens_per_second": tokens / wall, "loss": last["loss"]}


def run(target_dir: Path, data: Path, out: Path, *, rows: int, steps: int) -> dict:
    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.devices import dtype_name, native_bfloat16
    from dspark.model.vocab import mapping_from_counts
    from dspark.target import TargetModel
    from dspark.training.data import assistant_token_counts, load_examples, save_examples

    examples = load_examples(data, max_len=512)[:rows]
    meta = provenance(0, target=str(target_dir), data=str(data), rows=len(examples), steps=steps)
    work = Path(tempfile.mkdtemp(prefix="dspark-dtype-speed-"))
    try:
        subset = save_examples(examples, work / "rows.jsonl")
        features = {
            name: _features(target_dir, examples, subset, work / name, dtype)
            for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
        }
        fp32 = TargetModel.from_pretrained(target_dir)
        vocab = mapping_from_counts(assistant_token_counts(examples, fp32.vocab_size), 8192)
        training = {
            name: _training(fp32, (vocab[0], vocab[1]), work / "float32", steps, autocast, work)
            for name, autocast in (("autocast_off", False), ("autocast_bf16", True))
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "provenance": finished(meta),
        "native_bfloat16": native_bfloat16("cpu"),
        "auto_picks": {"target_dtype": dtype_name("auto"), "autocast_bf16": native_bfloat16("cpu")},
        "features_2_workers": features,
        "training_dspark_1_thread": training,
        "bf16_over_fp32": {
            "features": features["bfloat16"]["tokens_per_second"] / features["float32"]["tokens_per_second"],
            "training": training["autocast_bf16"]["tokens_per_second"] / training["autocast_off"]["tokens_per_second"],
        },
    }
    write_json(out, report)
    return report


def main(argv: list[str] | None = None) -> None:
    from dspark.bench.train_speed import parser
    from dspark.defaults import resolve_target

    a = parser(__doc__, rows=32, steps=30).parse_args(argv)
    r = run(resolve_target(a.target), a.data, a.out, rows=a.rows, steps=a.steps)
    f, t = r["features_2_workers"], r["training_dspark_1_thread"]
    print(f"native bf16: {r['native_bfloat16']}; auto picks {r['auto_picks']}")
    fp32, bf16 = f["float32"]["tokens_per_second"], f["bfloat16"]["tokens_per_second"]
    print(f"features: fp32 {fp32:.0f} tok/s, bf16 {bf16:.0f}")
    print(
        f"training: autocast off {t['autocast_off']['tokens_per_second']:.0f} tok/s, "
        f"bf16 autocast {t['autocast_bf16']['tokens_per_second']:.0f} (losses {t['autocast_off']['loss']:.3f} / "
        f"{t['autocast_bf16']['loss']:.3f})"
    )


if __name__ == "__main__":
    main()
