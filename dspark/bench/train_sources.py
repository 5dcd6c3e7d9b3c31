"""Trainer throughput with the online source vs the offline cache (and in-process), same data.

    python -m dspark.bench.train_sources --target DIR --data FILE.jsonl --out results.json

Each source trains a fresh copy of the same drafter for the same steps on the same example
order; the result gives steps/s and the share of wall time the trainer spent waiting on
its source (the target), with provenance.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch


def run(
    target_dir: Path,
    data: Path,
    out: Path,
    *,
    steps: int,
    examples: int,
    seq_len: int,
    max_anchors: int,
    draft_vocab: int,
    mask_token_id: int | None,
    seed: int,
) -> dict:
    from dspark.bench.provenance import finished, provenance, write_json
    from dspark.formats.checkpoint import init_drafter
    from dspark.model.pairing import config_for_target
    from dspark.model.vocab import mapping_from_counts
    from dspark.target import TargetModel
    from dspark.training.data import (
        InProcessSource,
        OnlineSource,
        assistant_token_counts,
        load_examples,
        save_examples,
    )
    from dspark.training.feature_cache import OfflineSource, build_feature_cache
    from dspark.training.trainer import TrainConfig, Trainer

    target = TargetModel.from_pretrained(target_dir)
    rows = load_examples(data, max_len=seq_len)[:examples]
    vd = min(draft_vocab, target.vocab_size)
    meta = provenance(  # before the runs: the code and tree that produce the figures
        seed,
        target=str(target_dir),
        data=str(data),
        examples=len(rows),
        seq_len=seq_len,
        max_anchors=max_anchors,
        draft_vocab=vd,
        drafter_layers=1,
    )
    work = Path(tempfile.mkdtemp(prefix="dspark-bench-"))
    subset = save_examples(rows, work / "data.jsonl")
    vocab = mapping_from_counts(assistant_token_counts(rows, target.vocab_size), vd) if vd < target.vocab_size else None
    config = config_for_target(target, num_layers=1, mask_token_id=mask_token_id, draft_vocab_size=vd)
    cfg = TrainConfig(
        steps=steps, lr=3e-4, warmup=2, max_anchors=max_anchors, seq_len=seq_len, checkpoint_every=10**9, seed=seed
    )
    aux = config.aux_hidden_state_layer_ids
    results = {}
    t0 = time.perf_counter()
    build_feature_cache(target, rows, aux, work / "cache", shard_size=16, progress=False)
    cache_seconds = time.perf_counter() - t0
    for name in ("online", "offline", "inprocess"):
        model = init_drafter(target, config, seed=seed, vocab=vocab)
        if name == "online":
            source = OnlineSource(target_dir, subset, aux, seed=seed, max_len=seq_len)
        elif name == "offline":
            source = OfflineSource(work / "cache", aux, seed=seed)
        else:
            source = InProcessSource(target, rows, aux, seed=seed)
        start = time.perf_counter()
        last = Trainer(model, source, cfg, work / f"run-{name}", progress=False).train()
        startup = getattr(source, "startup_seconds", 0.0)
        wall = time.perf_counter() - start - startup
        results[name] = {
            "steps": steps,
            "startup_seconds": startup,
            "wall_seconds": wall,
            "steps_per_second": steps / wall,
            "source_wait_seconds": source.wait_seconds,
            "source_wait_fraction": source.wait_seconds / wall,
            "final_loss": last.get("loss"),
        }
    shutil.rmtree(work, ignore_errors=True)
    report = {
        "provenance": finished(meta),
        "offline_cache_build_seconds": cache_seconds,
        "sources": results,
        "notes": "online: target in a worker process feeding a bounded queue (its startup, loading the target "
        "and producing the first batch, is reported apart and left out of wall_seconds); offline: features "
        "read from the cache; inprocess: target run between steps.",
    }
    write_json(out, report)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--examples", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--max-anchors", type=int, default=64)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    report = run(
        a.target,
        a.data,
        a.out,
        steps=a.steps,
        examples=a.examples,
        seq_len=a.seq_len,
        max_anchors=a.max_anchors,
        draft_vocab=a.draft_vocab,
        mask_token_id=a.mask_token_id,
        seed=a.seed,
    )
    for name, r in report["sources"].items():
        print(f"{name:9s} {r['steps_per_second']:.2f} steps/s, waiting on the source {r['source_wait_fraction']:.0%}")


if __name__ == "__main__":
    main()
