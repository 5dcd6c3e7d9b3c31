"""`dspark calibrate`: how well the confidence head predicts acceptance (DESIGN §3).

The head's c_k claims P(slot k accepted | slots < k accepted). We decode held-out prompts
with the drafter and record, for every slot verification reached, (k, c_k, accepted); then
per position: ECE (equal-width bins), AUROC (does c_k rank accepted above rejected
slots?), Brier score and the reliability diagram. Per-position Platt scaling
(sigmoid(a·logit(c) + b), fitted on the even-numbered prompts, scored on the odd ones)
shows how much of the error a two-parameter recalibration removes.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from dspark.datasets import load_prompts
from dspark.decoding.factory import make_drafter, make_engine
from dspark.decoding.sampling import SamplingParams
from dspark.errors import DSparkError
from dspark.target.prompts import encode_prompt

Record = tuple[int, float, bool]  # (slot k, confidence c_k, accepted)


def collect_records(
    target,
    draft_dir: Path,
    *,
    datasets: list[str],
    rows: int,
    n: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> list[tuple[str, int, list[Record]]]:
    """Decode ``rows`` prompts per dataset; one (dataset, prompt index, records) per prompt."""
    from tqdm import tqdm

    from dspark.decoding.factory import checkpoint_method

    method = checkpoint_method(draft_dir)
    drafter = make_drafter(method, target, draft_dir=draft_dir)
    if getattr(getattr(drafter, "model", None), "confidence_head", None) is None:
        raise DSparkError(f"{draft_dir}: this {method} drafter has no confidence head to calibrate")
    engine = make_engine(target, drafter, min(n, drafter.max_draft_tokens))
    params = SamplingParams(temperature=temperature)
    out = []
    for name in datasets:
        for i, prompt in enumerate(tqdm(load_prompts(name, rows), desc=name, disable=not progress, unit="prompt")):
            g = torch.Generator(device=target.device).manual_seed(seed + i)
            ids = encode_prompt(target.tokenizer, prompt)
            result = engine.generate(ids, max_new_tokens=max_new_tokens, params=params, generator=g)
            out.append((name, i, result.confidence_records))
    return out


def auroc(scores: list[float], labels: list[bool]) -> float | None:
    """Area under the ROC curve (Mann-Whitney, ties counted half); None with one class only."""
    pos = sum(labels)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1  # average rank of the tie group
        i = j + 1
    rank_sum = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def reliability_bins(scores: list[float], labels: list[bool], bins: int = 10) -> list[dict]:
    out = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, s in enumerate(scores) if lo <= s < hi or (b == bins - 1 and s == 1.0)]
        if idx:
            out.append(
                {
                    "lo": lo,
                    "hi": hi,
                    "count": len(idx),
                    "mean_confidence": sum(scores[i] for i in idx) / len(idx),
                    "accept_rate": sum(labels[i] for i in idx) / len(idx),
                }
            )
    return out


def ece(scores: list[float], labels: list[bool], bins: int = 10) -> float | None:
    """Expected calibration error: count-weighted |mean confidence - accept rate| over bins."""
    if not scores:
        return None
    return sum(
        b["count"] * abs(b["mean_confidence"] - b["accept_rate"]) for b in reliability_bins(scores, labels, bins)
    ) / len(scores)


def brier(scores: list[float], labels: list[bool]) -> float | None:
    if not scores:
        return None
    return sum((s - float(y)) ** 2 for s, y in zip(scores, labels, strict=True)) / len(scores)


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def fit_platt(scores: list[float], labels: list[bool], steps: int = 200) -> tuple[float, float]:
    """(a, b) minimising the log loss of sigmoid(a·logit(c) + b); (1, 0) is the identity."""
    if not scores or all(labels) or not any(labels):
        return 1.0, 0.0
    z = torch.tensor([_logit(s) for s in scores], dtype=torch.float64)
    y = torch.tensor([float(v) for v in labels], dtype=torch.float64)
    ab = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([ab], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ab[0] * z + ab[1], y)
        loss.backward()
        return loss

    opt.step(closure)
    a, b = (float(v) for v in ab.detach())
    return a, b


def _apply_platt(scores: list[float], a: float, b: float) -> list[float]:
    return [1 / (1 + math.exp(-(a * _logit(s) + b))) for s in scores]


def position_metrics(scores: list[float], labels: list[bool], bins: int = 10) -> dict:
    return {
        "count": len(scores),
        "accept_rate": sum(labels) / len(labels) if labels else None,
        "mean_confidence": sum(scores) / len(scores) if scores else None,
        "ece": ece(scores, labels, bins),
        "auroc": auroc(scores, labels),
        "brier": brier(scores, labels),
    }


def calibration_report(per_prompt: list[tuple[str, int, list[Record]]], n: int, bins: int = 10) -> dict:
    """Per-position metrics on all prompts, and Platt-scaled metrics fitted/scored on halves."""
    records = [r for _, _, recs in per_prompt for r in recs]
    if not records:
        raise DSparkError("no drafted slots were verified: nothing to calibrate (more rows or tokens?)")
    # (scores, labels) per position: all prompts, even-numbered (Platt fit), odd (held out)
    split = {name: [([], []) for _ in range(n)] for name in ("all", "fit", "held")}
    for _, i, recs in per_prompt:
        for k, c, y in recs:
            for name in ("all", "fit" if i % 2 == 0 else "held"):
                split[name][k][0].append(c)
                split[name][k][1].append(y)
    positions = []
    for k in range(n):
        sc, lab = split["all"][k]
        (f_sc, f_lab), (h_sc, h_lab) = split["fit"][k], split["held"][k]
        row = {"position": k + 1, **position_metrics(sc, lab, bins), "reliability": reliability_bins(sc, lab, bins)}
        a, b = fit_platt(f_sc, f_lab)
        scaled = _apply_platt(h_sc, a, b)
        row["platt"] = {
            "a": a,
            "b": b,
            "fit_count": len(f_sc),
            "heldout_count": len(h_sc),
            "heldout_ece_before": ece(h_sc, h_lab, bins),
            "heldout_ece_after": ece(scaled, h_lab, bins),
            "heldout_brier_before": brier(h_sc, h_lab),
            "heldout_brier_after": brier(scaled, h_lab),
        }
        positions.append(row)
    sc = [c for _, c, _ in records]
    lab = [y for _, _, y in records]
    return {"overall": position_metrics(sc, lab, bins), "positions": positions}


def _fmt(x, spec=".3f") -> str:
    return "—" if x is None else format(x, spec)


def calibration_markdown(report: dict) -> str:
    lines = [
        "| position k | slots | accept rate | mean c_k | ECE | AUROC | Brier | held-out ECE → Platt |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in report["positions"]:
        pl = p["platt"]
        lines.append(
            f"| {p['position']} | {p['count']} | {_fmt(p['accept_rate'])} | {_fmt(p['mean_confidence'])} | "
            f"{_fmt(p['ece'])} | {_fmt(p['auroc'])} | {_fmt(p['brier'])} | "
            f"{_fmt(pl['heldout_ece_before'])} → {_fmt(pl['heldout_ece_after'])} |"
        )
    o = report["overall"]
    lines.append(
        f"| all | {o['count']} | {_fmt(o['accept_rate'])} | {_fmt(o['mean_confidence'])} | {_fmt(o['ece'])} | "
        f"{_fmt(o['auroc'])} | {_fmt(o['brier'])} | |"
    )
    return "\n".join(lines) + "\n"


def reliability_plot(report: dict, path: str | Path, *, min_slots: int = 30, min_bin: int = 5) -> None:
    """Reliability diagram: accept rate against mean confidence per bin, one line per position
    with at least ``min_slots`` slots, bins with fewer than ``min_bin`` slots left out."""
    from dspark.bench.speculative import require_matplotlib

    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect")
    for p in report["positions"]:
        rel = [b for b in p["reliability"] if b["count"] >= min_bin]
        if p["count"] < min_slots or not rel:
            continue
        ax.plot(
            [b["mean_confidence"] for b in rel],
            [b["accept_rate"] for b in rel],
            marker="o",
            label=f"k={p['position']} (n={p['count']})",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"positions with >= {min_slots} slots; bins with >= {min_bin}", fontsize=9)
    ax.set_xlabel("confidence c_k (bin mean)")
    ax.set_ylabel("accept rate | earlier slots accepted")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
