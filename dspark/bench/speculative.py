"""`dspark bench`: the model card's table, measured on this machine (DESIGN §6).

Per dataset: baseline tok/s, then ``tok/s / speedup / accept_len`` for each method and n.
Methods run interleaved prompt by prompt (baseline, then every method and n on the same
prompt), so machine drift does not favour one; speedup = method tok/s / baseline tok/s
from the same run and prompts (ratio of total tokens over total decode time). Every
greedy row is checked token for token against the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from dspark.datasets import load_prompts
from dspark.decoding.factory import Drafting, make_engine
from dspark.decoding.sampling import SamplingParams
from dspark.errors import DSparkError
from dspark.target.prompts import encode_prompt


@dataclass
class Cell:
    tokens: int = 0
    decode_seconds: float = 0.0
    forwards: int = 0
    emitted: int = 0
    attempts: list[int] = field(default_factory=list)
    accepts: list[int] = field(default_factory=list)
    mismatches: int = 0
    prompts: int = 0
    drafted: int = 0  # draft tokens sent to verification
    timings: dict = field(default_factory=dict)  # decode seconds by stage, summed over prompts
    lookup_steps: int = 0  # steps a `+ngram` drafter drafted by prompt lookup

    def add(self, result, baseline_tokens: list[int] | None) -> None:
        self.prompts += 1
        self.tokens += len(result.tokens) - 1  # decode-loop tokens (the first comes from the prefill)
        self.decode_seconds += result.decode_seconds
        self.forwards += result.target_forwards
        self.drafted += result.drafted_tokens
        self.emitted += len(result.tokens) - 1
        if not self.attempts:
            self.attempts = [0] * len(result.position_attempts)
            self.accepts = [0] * len(result.position_accepts)
        self.attempts = [a + b for a, b in zip(self.attempts, result.position_attempts, strict=True)]
        self.accepts = [a + b for a, b in zip(self.accepts, result.position_accepts, strict=True)]
        for stage, seconds in result.timings.items():
            self.timings[stage] = self.timings.get(stage, 0.0) + seconds
        self.lookup_steps += result.lookup_steps or 0
        if baseline_tokens is not None and result.tokens != baseline_tokens:
            self.mismatches += 1

    @property
    def tps(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds else 0.0


@dataclass(frozen=True)
class MethodSpec:
    """One column group of the table: a method, and for drafters its checkpoint and draft-length rule."""

    label: str
    drafting: Drafting  # method, checkpoint, draft-length rule, ``+ngram[N]`` prompt lookup first

    @property
    def method(self) -> str:
        return self.drafting.method


def _lookup_suffix(entry: str, name: str) -> tuple[str, int | None]:
    """``dspark+ngram`` -> ("dspark", 3); ``dspark+ngram2`` -> ("dspark", 2); else (name, None)."""
    base, plus, tail = name.rpartition("+ngram")
    if not plus or (tail and not tail.isdigit()):
        return name, None
    length = int(tail) if tail else 3
    if length < 1:
        raise DSparkError(f"--methods {entry!r}: the lookup n-gram length must be >= 1")
    return base, length


def _draft_rule(entry: str, rule: str) -> tuple[float | None, str | None]:
    """``@0.5`` -> confidence threshold 0.5; ``@cost`` -> measured cost model; ``@cost=FILE``."""

    if "+ngram" in rule:
        raise DSparkError(f"--methods {entry!r}: +ngram goes before the @ rule (e.g. dspark+ngram@cost)")
    if rule == "cost":
        return None, "auto"
    if rule.startswith("cost="):
        return None, rule.removeprefix("cost=")
    try:
        return float(rule), None
    except ValueError:
        raise DSparkError(
            f"--methods {entry!r}: {rule!r} after @ is neither a confidence threshold nor cost[=FILE]"
        ) from None


def parse_methods(text: str, drafts: dict[str, Path | None] | None = None) -> list[MethodSpec]:
    """``--methods``: comma list of ``baseline``, ``ngram``, ``dspark``, ``dflash``, ``eagle3``
    (drafter dirs from ``drafts`` or the embedded defaults) or ``LABEL=PATH`` (any drafter
    checkpoint under its own label). A drafter entry may end in a draft-length rule:
    ``@0.5`` truncates at that confidence survival, ``@cost`` picks the length from this
    machine's measured step cost (``@cost=FILE`` from a saved one); the label keeps the
    suffix unless one is given. A drafter name or path followed by ``+ngram`` (``+ngramN``)
    drafts by prompt lookup when the last 3 (N) tokens recur, by the model otherwise
    (``dspark+ngram@cost``). The baseline is always first."""
    from dspark import families
    from dspark.decoding.factory import checkpoint_method, methods
    from dspark.defaults import resolve_draft

    drafts = drafts or {}
    specs: list[MethodSpec] = [MethodSpec("baseline", Drafting("baseline"))]
    for entry in (e.strip() for e in text.split(",")):
        if not entry or entry == "baseline":
            continue
        label, sep, rest = entry.partition("=")
        if sep and "@" not in label:  # LABEL=PATH[@RULE]
            path, threshold, cost = rest, None, None
            if "@" in rest:
                path, _, rule = rest.rpartition("@")
                threshold, cost = _draft_rule(entry, rule)
            path, lookup = _lookup_suffix(entry, path)
            specs.append(
                MethodSpec(label, Drafting(checkpoint_method(Path(path)), Path(path), threshold, cost, lookup))
            )
            continue
        name, _, rule = entry.partition("@")
        threshold, cost = _draft_rule(entry, rule) if rule else (None, None)
        name, lookup = _lookup_suffix(entry, name)
        if name == "ngram" and not rule and lookup is None:
            specs.append(MethodSpec("ngram", Drafting("ngram")))
        elif name in families.names():
            draft = resolve_draft(drafts.get(name), name)
            specs.append(MethodSpec(entry, Drafting(name, draft, threshold, cost, lookup)))
        else:
            raise DSparkError(f"unknown method {entry!r}; choose from {', '.join(methods())} or LABEL=PATH")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise DSparkError(f"--methods: labels must be unique, got {labels}")
    return specs


def run_bench(
    target,
    *,
    datasets: list[str],
    methods: list[MethodSpec],
    ns: list[int],
    rows: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> list[dict]:
    from tqdm import tqdm

    params = SamplingParams(temperature=temperature)
    drafters = {spec.label: spec.drafting.build(target) for spec in methods if spec.method != "baseline"}
    if any(n < 1 for n in ns):
        raise DSparkError(f"--n: draft lengths must be >= 1, got {ns}")
    for m, d in drafters.items():
        if max(ns) > d.max_draft_tokens:  # a column labelled n=9 must not quietly draft 7
            raise DSparkError(f"--n {max(ns)}: {m} drafts at most {d.max_draft_tokens} tokens per step")
    baseline = make_engine(target, None, 0)
    engines = {(m, n): make_engine(target, d, n) for m, d in drafters.items() for n in ns}
    out_rows = []
    for name in datasets:
        prompts = load_prompts(name, rows)
        base_cell = Cell()
        cells = {key: Cell() for key in engines}
        for i, prompt in enumerate(tqdm(prompts, desc=name, disable=not progress, unit="prompt")):
            ids = encode_prompt(target.tokenizer, prompt)

            def gen(engine, i=i, ids=ids):
                g = torch.Generator(device=target.device).manual_seed(seed + i)
                return engine.generate(ids, max_new_tokens=max_new_tokens, params=params, generator=g)

            base = gen(baseline)
            base_cell.add(base, None)
            for key, engine in engines.items():
                drafter = engine.drafter
                before = dict(getattr(drafter, "timings", {}))
                cells[key].add(gen(engine), base.tokens if params.greedy else None)
                for stage, total in getattr(drafter, "timings", {}).items():
                    name_ = f"draft_{stage}"
                    cells[key].timings[name_] = cells[key].timings.get(name_, 0.0) + total - before.get(stage, 0.0)
        out_rows.append(_row(name, "baseline", 0, base_cell, base_cell, params))
        for (method, n), cell in cells.items():
            row = _row(name, method, n, cell, base_cell, params)
            if (cost := getattr(drafters[method], "step_cost", None)) is not None:
                row["step_cost"] = cost.to_dict()  # measured once, before the timed loop
            if hasattr(drafters[method], "lookup_steps"):  # share of verification steps drafted by lookup
                row["lookup_share"] = cell.lookup_steps / cell.forwards if cell.forwards else 0.0
            out_rows.append(row)
    return out_rows


def _row(dataset: str, method: str, n: int, cell: Cell, base: Cell, params: SamplingParams) -> dict:
    return {
        "dataset": dataset,
        "method": method,
        "n": n,
        "prompts": cell.prompts,
        "accept_len": cell.emitted / cell.forwards if cell.forwards else 0.0,
        "tokens_per_second": cell.tps,
        "speedup": cell.tps / base.tps if base.tps else 0.0,
        "lossless": (cell.mismatches == 0) if params.greedy else None,
        "mismatched_prompts": cell.mismatches if params.greedy else None,
        "per_position_acceptance": [a / t if t else None for a, t in zip(cell.accepts, cell.attempts, strict=True)],
        "tokens": cell.tokens,
        "decode_seconds": cell.decode_seconds,
        "target_forwards": cell.forwards,
        "drafts_per_step": cell.drafted / cell.forwards if cell.forwards else 0.0,
        "timings": cell.timings,
    }


def markdown_table(rows: list[dict]) -> str:
    """The model card's layout: per dataset, baseline tok/s then `tok/s / speedup / accept_len`."""
    cols = sorted(
        dict.fromkeys((r["method"], r["n"]) for r in rows if r["method"] != "baseline"), key=lambda c: c[1]
    )  # by n, methods in the order they ran
    head = "| benchmark | rows | baseline tok/s | " + " | ".join(f"{m} n={n}" for m, n in cols) + " | best |"
    sep = "| --- | ---: | ---: | " + " | ".join("---:" for _ in cols) + " | --- |"
    lines = [head, sep]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        by = {(r["method"], r["n"]): r for r in rows if r["dataset"] == dataset}
        base = by[("baseline", 0)]
        cells, best, best_tps = [], "baseline", base["tokens_per_second"]
        for c in cols:
            r = by.get(c)
            if r is None:
                cells.append("")
                continue
            flag = "" if r["lossless"] in (True, None) else " (NOT lossless)"
            cells.append(f"{r['tokens_per_second']:.1f} / {r['speedup']:.2f}x / {r['accept_len']:.3f}{flag}")
            if r["tokens_per_second"] > best_tps:
                best, best_tps = f"{c[0]} n={c[1]}", r["tokens_per_second"]
        lines.append(
            f"| {dataset} | {base['prompts']} | {base['tokens_per_second']:.1f} | " + " | ".join(cells) + f" | {best} |"
        )
    return "\n".join([*lines, "", *TABLE_LEGEND]) + "\n"


TABLE_LEGEND = (
    "Each cell is `tok/s / speedup / accept_len`. tok/s: decoded tokens per second over all the row's prompts "
    "(prefill excluded); speedup: that tok/s over the baseline's (plain decoding) in the same run; "
    "accept_len: tokens emitted per target verification forward, bonus token included (plain decoding = 1).",
    "n: drafts verified per step (with `@cost` or `@T`, the most a step may verify); best: the fastest method "
    "of the row; (NOT lossless): a greedy output differed from plain decoding.",
)


def require_matplotlib():
    """pyplot on the Agg backend; a clear error (checked before a long run) when missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from dspark.errors import DSparkError

        raise DSparkError("--plot needs matplotlib: pip install 'dspark[bench]' (or matplotlib)") from None
    return plt


def acceptance_plot(rows: list[dict], path: str | Path) -> None:
    """Per-position acceptance: one panel per dataset, one line per (method, n) row."""
    plt = require_matplotlib()
    rows = [r for r in rows if r["method"] != "baseline" and r["per_position_acceptance"]]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    if not datasets:
        from dspark.errors import DSparkError

        raise DSparkError("no drafted rows to plot (only baseline, or no per-position acceptance)")
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], datasets, strict=True):
        for r in rows:
            if r["dataset"] != name:
                continue
            ys = [y if y is not None else float("nan") for y in r["per_position_acceptance"]]
            ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{r['method']} n={r['n']}")
        ax.set_title(name)
        ax.set_xlabel("draft position k")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("P(accepted | earlier accepted)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
