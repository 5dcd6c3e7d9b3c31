"""Does the `speculators` package load our checkpoint and compute what we compute?

Two halves, run by `dspark check speculators` (dspark.interop.check_speculators) in two
environments (speculators 0.9.0 pins transformers <= 5.19, we need >= 5.20):

  make  (our venv)          export the drafter in the speculators format, write fixed
                            inputs (target features, tokens, anchors) and our block logits
                            and confidence logits for them (teacher-forced training forward);
  check (speculators venv)  load the export with speculators' own
                            `SpeculatorModel.from_pretrained`, run its DSpark training forward
                            on the same inputs with the same anchors, and compare.

The check imports nothing from dspark: the speculators venv runs this file by its path.
Its forward is speculators' own, end to end: we only pin its anchor sampler to our anchors
and capture the logits it hands to its loss.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

# Tiny drafters on a tiny random Qwen3 target: every head variant and both slot layouts.
TINY_VARIANTS = {
    "tiny-anchor-vanilla": {},
    "tiny-dflash-layout-markov": {"sample_from_anchor": False},
    "tiny-gated": {"markov_head_type": "gated"},
    "tiny-rnn": {"markov_head_type": "rnn"},
    "tiny-conf-without-markov": {"confidence_head_with_markov": False},
    "tiny-dflash": {"markov_rank": 0, "enable_confidence_head": False, "sample_from_anchor": False},
    "tiny-eagle3": {"method": "eagle3"},
}


def _tiny(variant: str, work: Path):
    from dspark.formats.checkpoint import init_drafter
    from dspark.interop.tiny_targets import build_tiny_target
    from dspark.model.pairing import config_for_target
    from dspark.model.vocab import mapping_from_kept_ids
    from dspark.target import TargetModel
    from dspark.target.frozen import read_target_facts

    target_dir = work / "tiny-target"
    if not (target_dir / "config.json").is_file():
        build_tiny_target(target_dir, "qwen3")
    target = TargetModel.from_pretrained(target_dir)
    opts = dict(TINY_VARIANTS[variant])
    torch.manual_seed(1)
    if opts.pop("method", None) == "eagle3":
        from dspark.model.eagle3 import Eagle3Config

        base = config_for_target(target, num_layers=1, block_size=6, draft_vocab_size=150)
        config = Eagle3Config.like(base, speculative_steps=4)
    else:
        config = config_for_target(target, num_layers=2, block_size=6, markov_rank=16, draft_vocab_size=150)
    config = config.replace(**opts)
    model = init_drafter(target, config, vocab=mapping_from_kept_ids(torch.arange(0, 300, 2), target.vocab_size))
    with torch.no_grad():  # untrained heads start near zero; make them matter in the comparison
        for name, p in model.named_parameters():
            if name.startswith(("markov_head", "confidence_head")):
                p.normal_(0, 0.3)
    return model, read_target_facts(target_dir)


def make(args: argparse.Namespace) -> None:
    from dspark.formats.convert import export_speculators, fill_from_target, open_drafter
    from dspark.training.forward import block_forward

    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    if args.draft in TINY_VARIANTS:
        model, facts = _tiny(args.draft, out)
    else:
        from dspark.target.frozen import read_target_facts

        facts = read_target_facts(args.target) if args.target else None
        model = open_drafter(args.draft, target=facts)
    fill_from_target(model, facts)
    model = model.float().eval()
    export_speculators(model, out / "checkpoint", dtype=torch.float32, force=True)
    if facts is not None:
        # speculators loads the verifier's embedding and lm_head from speculators_config.verifier
        # .name_or_path; the export records the target's public name (a hub id or folder name),
        # so point this copy at the local target directory, as a user without the hub would.
        config_path = out / "checkpoint" / "config.json"
        data = json.loads(config_path.read_text())
        data["speculators_config"]["verifier"]["name_or_path"] = str(facts.directory)
        config_path.write_text(json.dumps(data, indent=2) + "\n")
    if model.config.method == "eagle3":
        return _make_eagle3(model, out, args.length)
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    t = args.length
    aux = torch.randn(t, len(cfg.aux_hidden_state_layer_ids) * cfg.target_hidden_size, generator=g)
    ids = torch.randint(0, cfg.target_vocab_size, (t,), generator=g)
    anchors = torch.tensor([3, 9, 16, t - cfg.block_size - 2])
    with torch.inference_mode():
        mask, docs = torch.ones(t, dtype=torch.bool), torch.zeros(t, dtype=torch.long)
        ours = block_forward(model, aux, ids, mask, docs, anchors)
    torch.save(
        {
            "aux": aux,
            "input_ids": ids,
            "anchors": anchors,
            "logits": ours.logits,  # [N, D, V_d]
            "confidence_logits": ours.confidence_logits,
            "sample_from_anchor": cfg.sample_from_anchor,
            "hidden_size": cfg.hidden_size,
        },
        out / "fixture.pt",
    )
    print(f"exported {out / 'checkpoint'}; fixture with {len(anchors)} blocks of {cfg.block_size}")


def _make_eagle3(model, out: Path, length: int) -> None:
    """Our training-time-test logits for every chain that fits: chain c pairs the feature of
    token c with token c+1 and unrolls ``speculative_steps`` steps (tokens teacher-forced)."""
    from dspark.model.eagle3 import train_forward

    cfg = model.config
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(length, len(cfg.aux_hidden_state_layer_ids) * cfg.target_hidden_size, generator=g)
    ids = torch.randint(0, cfg.target_vocab_size, (length,), generator=g)
    steps = cfg.speculative_steps
    chains = torch.arange(0, length - steps)  # c + steps <= length - 1
    prev = torch.stack([ids[chains + 1 + j] for j in range(steps)], dim=1)
    with torch.inference_mode():
        ours = train_forward(model, aux, ids, torch.zeros(length, dtype=torch.long), chains + 1, prev)
    torch.save(
        {
            "kind": "eagle3",
            "aux": aux,
            "input_ids": ids,
            "chains": chains,
            "steps": steps,
            "logits": ours,  # [N, steps, V_d]
            "embed_tokens": model.embed_tokens.weight.detach().float().clone(),
            "hidden_size": cfg.hidden_size,
        },
        out / "fixture.pt",
    )
    print(f"exported {out / 'checkpoint'}; fixture with {len(chains)} chains of {steps} steps")


def _check_eagle3(work: Path, fx: dict) -> dict:
    """speculators' own Eagle3DraftModel forward (its training-time test) on the same inputs,
    aligned the way its data pipeline does (shift_batch: token t with the feature of t-1,
    positions from 1), logits captured per step where they reach its loss."""
    import speculators.models.eagle3.core as eagle3_core
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(work / "checkpoint"))
    config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
    model = SpeculatorModel.from_pretrained(str(work / "checkpoint"), config=config).float().eval()
    # The export leaves the embedding out (vLLM shares the target's); speculators loads it from the
    # verifier named in the config. Copy it in only if it did not.
    embed_shared = not torch.equal(model.embed_tokens.weight.float(), fx["embed_tokens"])
    with torch.no_grad():
        model.embed_tokens.weight.copy_(fx["embed_tokens"])
    per_step = []

    def capture(logits, targets, loss_mask, prev_correct, ttt_step, *rest, **kwargs):
        per_step.append(logits.float()[0])
        return torch.zeros(()), {}

    eagle3_core.compute_metrics = capture
    aux, ids, steps = fx["aux"], fx["input_ids"], fx["steps"]
    t = ids.numel() - 1
    with torch.inference_mode():
        model(
            hidden_states=aux[:-1][None],
            input_ids=ids[1:][None],
            document_ids=torch.zeros(1, t, dtype=torch.long),
            loss_mask=torch.ones(1, t, dtype=torch.bool),
            position_ids=torch.arange(1, t + 1)[None],
            verifier_last_hidden_states=torch.zeros(1, t, fx["hidden_size"]),
            ttt_steps=steps,
        )
    chains = fx["chains"]
    theirs = torch.stack([per_step[j][chains] for j in range(steps)], dim=1)  # [N, steps, V_d]
    ours = fx["logits"]
    return {
        "model_class": type(model).__name__,
        "chains": len(chains),
        "steps": int(steps),
        "embed_tokens_copied_in": embed_shared,  # False: speculators loaded the target's itself
        "logits_max_abs_diff": float((theirs - ours).abs().max()),
        "logits_scale": float(ours.abs().max()),
        "argmax_agreement": float((theirs.argmax(-1) == ours.argmax(-1)).float().mean()),
    }


def check(args: argparse.Namespace) -> None:
    import speculators
    import speculators.models.dflash.core as dflash_core
    import speculators.models.dspark.core as dspark_core
    from speculators import SpeculatorModel, SpeculatorModelConfig

    work = Path(args.work)
    fx = torch.load(work / "fixture.pt")
    if fx.get("kind") == "eagle3":
        _finish({"speculators_version": getattr(speculators, "__version__", "0.9.0"), **_check_eagle3(work, fx)}, args)
    config = SpeculatorModelConfig.from_pretrained(str(work / "checkpoint"))
    config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
    model = SpeculatorModel.from_pretrained(str(work / "checkpoint"), config=config).float().eval()
    anchors = fx["anchors"]
    valid = torch.ones(len(anchors), dtype=torch.bool)
    dflash_core.select_anchors = lambda loss_mask, n, block: (anchors.clone(), valid)
    captured = {}

    def capture_dspark(logits, targets, confidence_logits, *rest, **kwargs):
        captured["logits"], captured["confidence_logits"] = logits, confidence_logits
        return torch.zeros(()), {}

    def capture_dflash(logits, targets, *rest, **kwargs):
        captured["logits"], captured["confidence_logits"] = logits, None
        return torch.zeros(()), {}

    dspark_core.compute_metrics = capture_dspark
    dflash_core.compute_metrics = capture_dflash
    t = fx["input_ids"].numel()
    with torch.inference_mode():
        model(
            hidden_states=fx["aux"][None],
            input_ids=fx["input_ids"][None],
            loss_mask=torch.ones(1, t),
            verifier_last_hidden_states=torch.zeros(1, t, fx["hidden_size"]),
            document_ids=torch.zeros(1, t, dtype=torch.long),
            max_anchors=len(anchors),
        )
    n, b = len(anchors), model.block_size
    theirs = captured["logits"].float().view(n, b, -1)
    ours = fx["logits"]
    first = 0 if fx["sample_from_anchor"] else 1
    theirs = theirs[:, first : first + ours.shape[1]]
    report = {
        "speculators_version": speculators.__version__ if hasattr(speculators, "__version__") else "0.9.0",
        "model_class": type(model).__name__,
        "blocks": n,
        "slots": int(ours.shape[1]),
        "logits_max_abs_diff": float((theirs - ours).abs().max()),
        "logits_scale": float(ours.abs().max()),
        "argmax_agreement": float((theirs.argmax(-1) == ours.argmax(-1)).float().mean()),
    }
    if fx["confidence_logits"] is not None:
        conf = captured["confidence_logits"].float().view(n, b)[:, first : first + ours.shape[1]]
        report["confidence_max_abs_diff"] = float((conf - fx["confidence_logits"]).abs().max())
    _finish(report, args)


def _finish(report: dict, args: argparse.Namespace) -> None:
    """Pass/fail against the tolerance (logits and, where compared, confidence logits); print,
    write ``--out``, exit 0 or 1."""
    tol = args.tolerance
    report["tolerance"] = tol
    report["pass"] = report["logits_max_abs_diff"] <= tol and report.get("confidence_max_abs_diff", 0.0) <= tol
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if report["pass"] else 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("make")
    m.add_argument("--draft", required=True, help=f"drafter directory, or one of {', '.join(TINY_VARIANTS)}")
    m.add_argument("--target", help="target directory (not needed for the tiny-* variants)")
    m.add_argument("--work", required=True)
    m.add_argument("--length", type=int, default=48)
    c = sub.add_parser("check")
    c.add_argument("--work", required=True)
    c.add_argument("--tolerance", type=float, default=1e-3)
    c.add_argument("--out")
    args = parser.parse_args(argv)
    make(args) if args.mode == "make" else check(args)


if __name__ == "__main__":
    main()
