"""Trainer throughput with the online source vs the offline cache (and in-process), same data.

    python -m dspark.bench.train_sources --target DIR --data FILE.jsonl --out results.json \
        [--sources online,offline,inprocess] [--workers 1,2] [--target-dtype bfloat16] \
        [--trainer-threads 1] [--rounds 2] [--markov-rank 64] [--autocast-bf16]

Each source trains a fresh copy of the same drafter for the same steps on the same example
order; the result gives steps/s and the share of wall time the trainer spent waiting on
its source (the target), with provenance. ``--workers 1,2``: the online source once per
worker count (`online` with one target process, `online-x2` with two). ``--rounds R``:
the sources take turns R times (a slow spell of a shared machine then touches each alike);
a source's figure is its median round.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from dspark.errors import DSparkError


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
    sources: tuple[str, ...] = ("online", "offline", "inprocess"),
    workers: tuple[int, ...] = (1,),
    target_dtype: str = "float32",
    rounds: int = 1,
    markov_rank: int = 256,
    autocast_bf16: bool = False,
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

    unknown = sorted(set(sources) - {"online", "offline", "inprocess"})
    if unknown or not sources:
        raise DSparkError(f"--sources: expected some of online, offline, inprocess; got {list(sources)}")
    if rounds < 1 or not workers or min(workers) < 1:
        raise DSparkError("--rounds and every --workers count must be >= 1")
    target = TargetModel.from_pretrained(target_dir)  # fp32: the drafter's weights come from it
    compute = (
        target
        if target_dtype == "float32"
        else TargetModel.from_pretrained(target_dir, dtype=getattr(torch, target_dtype))
    )
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
        target_dtype=target_dtype,
        trainer_threads=torch.get_num_threads(),
        rounds=rounds,
        markov_rank=markov_rank,
        autocast_bf16=autocast_bf16,
    )
    work = Path(tempfile.mkdtemp(prefix="dspark-bench-"))
    subset = save_examples(rows, work / "data.jsonl")
    vocab = mapping_from_counts(assistant_token_counts(rows, target.vocab_size), vd) if vd < target.vocab_size else None
    config = config_for_target(
        target, num_layers=1, mask_token_id=mask_token_id, draft_vocab_size=vd, markov_rank=markov_rank
    )
    cfg = TrainConfig(
        steps=steps,
        lr=3e-4,
        warmup=2,
        max_anchors=max_anchors,
        seq_len=seq_len,
        checkpoint_every=10**9,
        seed=seed,
        autocast_bf16=autocast_bf16,
    )
    aux = config.aux_hidden_state_layer_ids
    names = [n for n in sources if n != "online"]
    if "online" in sources:
        names[sources.index("online") : sources.index("online")] = [
            "online" if n == 1 else f"online-x{n}" for n in workers
        ]
    cache_seconds = None
    if "offline" in sources:
        t0 = time.perf_counter()
        build_feature_cache(compute, rows, aux, work / "cache", shard_size=16, progress=False)
        cache_seconds = time.perf_counter() - t0
    per_round: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names:
            model = init_drafter(target, config, seed=seed, vocab=vocab)
            if name.startswith("online"):
                n = int(name.partition("-x")[2] or 1)
                source = OnlineSource(
                    target_dir, subset, aux, seed=seed, max_len=seq_len, dtype=target_dtype, workers=n
                )
            elif name == "offline":
                source = OfflineSource(work / "cache", aux, seed=seed)
            else:
                source = InProcessSource(compute, rows, aux, seed=seed)
            start = time.perf_counter()
            last = Trainer(model, source, cfg, work / f"run-{name}-{r}", progress=False).train()
            startup = getattr(source, "startup_seconds", 0.0)
            wall = time.perf_counter() - start - startup
            per_round[name].append(
                {
                    "startup_seconds": startup,
                    "wall_seconds": wall,
                    "steps_per_second": steps / wall,
                    "source_wait_seconds": source.wait_seconds,
                    "source_wait_fraction": source.wait_seconds / wall,
                    "final_loss": last.get("loss"),
                }
            )
    results = {}
    for name, runs in per_round.items():
        median = sorted(runs, key=lambda x: x["steps_per_second"])[(len(runs) - 1) // 2]
        results[name] = {"steps": steps, **median, "steps_per_second_per_round": [x["steps_per_second"] for x in runs]}
    shutil.rmtree(work, ignore_errors=True)
    report = {
        "provenance": finished(meta),
        "offline_cache_build_seconds": cache_seconds,
        "sources": results,
        "notes": "online: target in a worker process feeding a bounded queue (online-xN: N processes, each "
        "computing every N-th row); its startup, loading the target and producing the first batch, is reported "
        "apart and left out of wall_seconds; offline: features read from the cache; inprocess: target run "
        "between steps. A source's figures are those of its median round (steps/s).",
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
    p.add_argument("--sources", default="online,offline,inprocess", help="comma list of online, offline, inprocess")
    p.add_argument("--workers", default="1", help="comma list of online worker counts, e.g. 1,2")
    p.add_argument("--target-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--trainer-threads", type=int, default=None, help="torch threads of the trainer (default: torch's)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--markov-rank", type=int, default=256)
    p.add_argument("--autocast-bf16", action="store_true", help="the trainer's backbone in bf16 autocast (as recipes)")
    a = p.parse_args(argv)
    if a.trainer_threads:
        torch.set_num_threads(a.trainer_threads)
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
        sources=tuple(x.strip() for x in a.sources.split(",") if x.strip()),
        workers=tuple(int(x) for x in a.workers.split(",") if x.strip()),
        target_dtype=a.target_dtype,
        rounds=a.rounds,
        markov_rank=a.markov_rank,
        autocast_bf16=a.autocast_bf16,
    )
    for name, r in report["sources"].items():
        print(f"{name:9s} {r['steps_per_second']:.2f} steps/s, waiting on the source {r['source_wait_fraction']:.0%}")


if __name__ == "__main__":
    main()
