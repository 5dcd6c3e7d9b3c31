"""Prometheus metrics of the server, named as vLLM names them where vLLM has the metric.

Speculative decoding (vLLM v1 names, counters exported with ``_total``):
``vllm:spec_decode_num_drafts_total`` (verification steps that carried drafts),
``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_total``
and ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="k"}``. Also
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total{finished_reason=...}``, ``vllm:num_requests_running`` /
``_waiting`` and the ``vllm:e2e_request_latency_seconds`` and
``vllm:request_queue_time_seconds`` histograms. Ours: ``dspark:requests_rejected_total``
(429s), ``dspark:request_errors_total``, and with ``--prompt-lookup``
``dspark:spec_decode_lookup_steps_total`` (verification steps the lookup drafted). With
``--batch``: ``dspark:batch_steps_total``, ``dspark:batch_sequence_steps_total``,
``dspark:batch_draft_tokens_total``, the load-aware rule's choices
``dspark:batch_rule_steps_total{draft_length="k"}`` and what those steps took
``dspark:batch_rule_step_seconds_total{draft_length="k"}`` (mean step = seconds / steps), and
vLLM's ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (prompt tokens
prefilled / copied from the prefix cache).
"""

from __future__ import annotations

import threading
from collections import defaultdict

BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_HELP = {
    "vllm:spec_decode_num_drafts": "Verification steps that carried draft tokens.",
    "vllm:spec_decode_num_draft_tokens": "Draft tokens sent to verification.",
    "vllm:spec_decode_num_accepted_tokens": "Draft tokens accepted.",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "Accepted draft tokens per draft position.",
    "vllm:prompt_tokens": "Prompt tokens processed.",
    "vllm:generation_tokens": "Tokens generated.",
    "vllm:request_success": "Finished requests by finish reason.",
    "dspark:requests_rejected": "Requests refused with 429 because the queue was full.",
    "dspark:request_errors": "Requests that failed inside the engine.",
    "dspark:spec_decode_lookup_steps": "Verification steps drafted by prompt lookup (--prompt-lookup).",
    "dspark:batch_steps": "Batched target forwards (--batch).",
    "dspark:batch_sequence_steps": "Sequences advanced, summed over batched forwards (batch size = this / steps).",
    "dspark:batch_draft_tokens": "Draft tokens verified in batched forwards (per sequence-step: / sequence steps).",
    "dspark:batch_rule_steps": "Batched steps by the draft length the load-aware rule picked (0: a plain step).",
    "dspark:batch_rule_step_seconds": "Seconds those steps took, drafting included (mean: / dspark:batch_rule_steps).",
    "vllm:prefix_cache_queries": "Prompt tokens prefilled with --batch (the prefix cache's queries).",
    "vllm:prefix_cache_hits": "Prompt tokens copied from the prefix cache (the chat template's system turn).",
}


# Counters that exist per label value only: no unlabelled zero before the first one.
LABELLED = {"vllm:spec_decode_num_accepted_tokens_per_pos", "dspark:batch_rule_steps", "dspark:batch_rule_step_seconds"}


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self.lock = threading.Lock()
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        self.gauges: dict[str, float] = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
        # name -> [count per bucket (cumulative at render), +Inf count, sum]
        self.hists: dict[str, list] = defaultdict(lambda: [[0] * len(BUCKETS), 0, 0.0])

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        with self.lock:
            self.counters[(name.removesuffix("_total"), tuple(sorted(labels.items())))] += value

    def set(self, name: str, value: float) -> None:
        with self.lock:
            self.gauges[name] = float(value)

    def observe(self, name: str, value: float) -> None:
        with self.lock:
            hist = self.hists[name]
            for i, bound in enumerate(BUCKETS):
                if value <= bound:
                    hist[0][i] += 1
            hist[1] += 1
            hist[2] += float(value)

    def observe_request(self, job, result, run_seconds: float, queue_seconds: float, finish: str) -> None:
        drafts_steps = result.position_attempts[0] if result.position_attempts else 0  # steps with >= 1 draft
        accepted = sum(result.position_accepts)
        self.inc("vllm:prompt_tokens", result.prompt_tokens)
        self.inc("vllm:generation_tokens", len(result.tokens))
        if result.drafted_tokens:
            self.inc("vllm:spec_decode_num_drafts", drafts_steps)
            self.inc("vllm:spec_decode_num_draft_tokens", result.drafted_tokens)
            self.inc("vllm:spec_decode_num_accepted_tokens", accepted)
            for pos, n in enumerate(result.position_accepts):
                self.inc("vllm:spec_decode_num_accepted_tokens_per_pos", n, position=str(pos))
        if result.lookup_steps is not None:
            self.inc("dspark:spec_decode_lookup_steps", result.lookup_steps)
        self.inc("vllm:request_success", 1, finished_reason=finish)
        self.observe("vllm:e2e_request_latency_seconds", run_seconds + queue_seconds)
        self.observe("vllm:request_queue_time_seconds", queue_seconds)

    def render(self) -> str:
        lines: list[str] = []
        with self.lock:
            names = sorted({name for name, _ in self.counters} | set(_HELP))
            for name in names:
                lines.append(f"# HELP {name}_total {_HELP.get(name, name)}")
                lines.append(f"# TYPE {name}_total counter")
                rows = [(labels, v) for (n, labels), v in self.counters.items() if n == name]
                if not rows and name not in LABELLED:
                    rows = [((), 0.0)]
                for labels, value in sorted(rows):
                    lines.append(f"{name}_total{self._labels(labels)} {value}")
            for name, value in sorted(self.gauges.items()):
                lines.append(f"# TYPE {name} gauge")
                lines.append(f"{name}{self._labels(())} {value}")
            for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):
                buckets, count, total = self.hists[name]
                lines.append(f"# TYPE {name} histogram")
                for bound, n in zip(BUCKETS, buckets, strict=True):
                    lines.append(f"{name}_bucket{self._labels((('le', str(bound)),))} {n}")
                lines.append(f"{name}_bucket{self._labels((('le', '+Inf'),))} {count}")
                lines.append(f"{name}_sum{self._labels(())} {total}")
                lines.append(f"{name}_count{self._labels(())} {count}")
        return "\n".join(lines) + "\n"

    def _labels(self, labels) -> str:
        items = [("model_name", self.model), *labels]
        return "{" + ",".join(f'{k}="{v}"' for k, v in items) + "}"
