"""The trainer: AdamW, warmup + cosine, accumulation, clipping, atomic checkpoints, exact resume.

Dtype policy: master weights, optimizer state, loss and softmax in fp32; the backbone
may run under bf16 autocast (``autocast_bf16``, which also computes the teacher logits in a
bf16 matmul), norms and RoPE stay fp32 in the model.

Resume is exact: example order and anchors are functions of (seed, micro-step), and a
checkpoint holds model, optimizer and schedule state; so a killed and resumed run
continues the loss curve of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dspark.errors import CheckpointError
from dspark.families import training_forward
from dspark.formats.checkpoint import save_drafter
from dspark.io import sha256_file
from dspark.model.dspark import DSparkDraftModel
from dspark.model.vocab import target_to_draft_ids
from dspark.training.blocks import sample_anchors
from dspark.training.losses import LossWeights, dspark_loss


def read_checkpoint(path: Path) -> dict:
    """A stage checkpoint's state (model, optimizer, scheduler, step), its checksum checked."""
    path = Path(path)
    manifest_path, state_path = path / "manifest.json", path / "state.pt"
    if not manifest_path.is_file() or not state_path.is_file():
        raise CheckpointError(f"{path}: partial checkpoint (manifest.json or state.pt missing); not loading it")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{manifest_path}: corrupt manifest ({exc})") from None
    if sha256_file(state_path) != manifest.get("sha256"):
        raise CheckpointError(f"{state_path}: checksum mismatch (corrupt or partial checkpoint); not loading it")
    return torch.load(state_path, map_location="cpu", weights_only=True)


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps
    lr: float = 3e-4
    warmup: int = 300
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_accum: int = 1  # micro-steps (one sequence each) per optimizer step and process
    clip: float = 1.0
    max_anchors: int = 512
    seq_len: int = 2048
    ce_weight: float = 0.1
    tv_weight: float = 0.9
    confidence_weight: float = 1.0
    decay_gamma: float = 4.0
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 1
    seed: int = 0
    autocast_bf16: bool = False
    max_examples: int | None = None  # train on the data's first N examples only (a size of a scaling curve)
    save_embeddings: bool = True  # False: the final drafter takes embed_tokens from the target
    save_dtype: str = "float32"  # the final drafter's weights: float32 or bfloat16 (half the size)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        for name in ("steps", "grad_accum", "max_anchors", "seq_len", "checkpoint_every", "log_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        if self.max_examples is not None and self.max_examples <= 0:
            raise ValueError(f"train.max_examples must be positive, got {self.max_examples}")
        if self.save_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"train.save_dtype must be float32 or bfloat16, got {self.save_dtype!r}")
        if self.lr <= 0 or self.warmup < 0:
            raise ValueError("train.lr must be > 0 and train.warmup >= 0")


def make_adamw(params, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW, fused where this torch build has a fused kernel for the device (3x faster
    steps on CPU than the for-each one); else the default implementation."""
    try:
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine down to ``min_lr_ratio`` at ``steps``."""
    if cfg.warmup and step < cfg.warmup:
        return (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class Trainer:
    def __init__(
        self,
        model: DSparkDraftModel,
        source,
        cfg: TrainConfig,
        out_dir: str | Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        ddp_model=None,
        progress: bool = True,
        status_lines: bool | None = None,
    ) -> None:
        """``progress``: a progress bar; ``status_lines`` (default: without a bar): a plain line
        on stderr at every checkpoint instead (step, loss, acceptance, s/step, time left), for
        logs of runs in the background."""
        self.model, self.source, self.cfg = model, source, cfg
        self.forward = training_forward(model.config)  # the family's teacher-forced forward
        self.out = Path(out_dir)
        self.rank, self.world = rank, world_size
        self.ddp = ddp_model
        self.progress = progress and rank == 0
        self.status_lines = (not progress if status_lines is None else status_lines) and rank == 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = make_adamw(self.params, cfg)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_factor(s, cfg))
        self.step = 0
        self.weights = LossWeights(cfg.ce_weight, cfg.tv_weight, cfg.confidence_weight, cfg.decay_gamma)
        self._t2d_ids = target_to_draft_ids(model.t2d).cpu()

    # ------------------------------------------------------------------ checkpoints
    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"

    def save_checkpoint(self) -> Path:
        if self.rank != 0:
            return self.ckpt_dir
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        final = self.ckpt_dir / f"step_{self.step:07d}"
        tmp = self.ckpt_dir / f".tmp-step_{self.step:07d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "step": self.step,
        }
        torch.save(state, tmp / "state.pt")
        manifest = {"step": self.step, "sha256": sha256_file(tmp / "state.pt"), "train": asdict(self.cfg)}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        kept = sorted(self.ckpt_dir.glob("step_*"))
        for old in kept[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def latest_checkpoint(self) -> Path | None:
        found = sorted(self.ckpt_dir.glob("step_*")) if self.ckpt_dir.is_dir() else []
        return found[-1] if found else None

    def load_checkpoint(self, path: Path) -> None:
        state = read_checkpoint(path)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.step = int(state["step"])

    def _status_line(self, last: dict, end: int, since: tuple[float, int]) -> tuple[float, int]:
        """Print one status line; its s/step (and the time left from it) is the rate since
        ``since`` = (perf_counter, step) of the previous line, so a pause weighs on one line
        only. Returns the new ``since``."""
        now = time.perf_counter()
        per_step = (now - since[0]) / max(1, self.step - since[1])
        left = int(per_step * (end - self.step))
        parts = [f"{self.out.name}: step {self.step}/{end} ({100 * self.step / max(1, end):.1f}%)"]
        if "loss" in last:
            parts.append(f"loss {last['loss']:.4f}")
        if "sim_accept_len" in last:
            parts.append(f"tau {last['sim_accept_len']:.2f}")
        parts.append(f"{per_step:.3f} s/step, {left // 3600}h{left % 3600 // 60:02d}m left")
        print(", ".join(parts), file=sys.stderr, flush=True)
        return now, self.step

    # ------------------------------------------------------------------ one micro-step
    def _autocast(self):
        device = "cpu" if self.model.fc.weight.device.type == "cpu" else "cuda"
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.cfg.autocast_bf16)

    def _micro_loss(self, batch, micro_index: int, with_metrics: bool = True):
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + micro_index)
        anchors = sample_anchors(
            batch.loss_mask, batch.document_ids, cfg.max_anchors, self.model.config.drafts_per_block, gen
        )
        if anchors.numel() == 0:
            return None, None
        model = self.ddp or self.model
        with self._autocast():
            out = self.forward(
                model.module if self.ddp else model,
                batch.aux_hidden,
                batch.input_ids,
                batch.loss_mask,
                batch.document_ids,
                anchors,
            )
        rows = out.targets.target_rows
        with torch.no_grad(), self._autocast():  # the teacher's logits too: a bf16 matmul, 2x faster on CPU
            target_logits = self.model.base_logits(batch.last_hidden[rows].to(self.model.fc.weight.device))
        labels = self._t2d_ids[out.targets.label_ids].to(out.logits.device)
        return dspark_loss(
            out.logits,
            target_logits,
            labels,
            out.targets.valid.to(out.logits.device),
            out.confidence_logits,
            self.weights,
            with_metrics=with_metrics,
        )

    # ------------------------------------------------------------------ loop
    def train(self, *, resume: bool = True, stop_after: int | None = None) -> dict:
        """Run to ``cfg.steps`` (or ``stop_after`` more steps); returns the last metrics."""
        from tqdm import tqdm

        cfg = self.cfg
        if resume and (ckpt := self.latest_checkpoint()) is not None:
            self.load_checkpoint(ckpt)
        self.out.mkdir(parents=True, exist_ok=True)
        log_path = self.out / "train_log.jsonl"
        if self.rank == 0 and log_path.is_file():
            # Drop log lines of steps after the checkpoint we resumed from: they will be redone.
            kept = [ln for ln in log_path.read_text().splitlines() if ln and json.loads(ln)["step"] <= self.step]
            log_path.write_text("".join(ln + "\n" for ln in kept))
        end = cfg.steps if stop_after is None else min(cfg.steps, self.step + stop_after)
        micro_per_step = cfg.grad_accum * self.world
        first_micro = self.step * micro_per_step
        count = (end - self.step) * micro_per_step
        batches = self.source.batches(first_micro, count)
        bar = tqdm(total=end, initial=self.step, desc="train", disable=not self.progress, unit="step")
        since = (time.perf_counter(), self.step)  # the previous status line's time and step
        last: dict = {}
        self.model.train()
        try:
            while self.step < end:
                t0 = time.perf_counter()
                self.opt.zero_grad(set_to_none=True)
                sums: dict[str, torch.Tensor] = {}
                logged = (self.step + 1) % cfg.log_every == 0 or self.step + 1 == end
                for a in range(micro_per_step):
                    batch = next(batches)
                    if a % self.world != self.rank:
                        continue  # this micro-batch belongs to another rank
                    loss, metrics = self._micro_loss(batch, batch.index, with_metrics=logged)
                    if loss is None:
                        continue
                    (loss / cfg.grad_accum).backward()
                    for k, v in metrics.items():
                        sums[k] = sums.get(k, 0) + v.detach().float() / cfg.grad_accum
                if self.world > 1:
                    for p in self.params:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                        torch.distributed.all_reduce(p.grad)
                        p.grad /= self.world
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.clip)
                self.opt.step()
                self.sched.step()
                self.step += 1
                last = {
                    "step": self.step,
                    "lr": self.sched.get_last_lr()[0],
                    "grad_norm": float(grad_norm),
                    "step_seconds": time.perf_counter() - t0,
                    "source_wait_seconds": getattr(self.source, "wait_seconds", 0.0),
                    **{k: (v.tolist() if v.dim() else float(v)) for k, v in sums.items()},
                }
                if self.rank == 0 and (self.step % cfg.log_every == 0 or self.step == end):
                    with log_path.open("a") as fh:
                        fh.write(json.dumps(last) + "\n")
                if "sim_accept_len" in last:  # a logged step with anchors: the metrics were computed
                    bar.set_postfix(loss=f"{last['loss']:.4f}", tau=f"{last['sim_accept_len']:.2f}")
                bar.update(1)
                if self.step % cfg.checkpoint_every == 0 or self.step == end:
                    self.save_checkpoint()
                    if self.status_lines:
                        since = self._status_line(last, end, since)
        finally:
            bar.close()
            self.source.close()
        self.model.eval()
        if self.rank == 0 and self.step >= cfg.steps:
            save_drafter(
                self.model,
                self.out / "final",
                include_embeddings=self.cfg.save_embeddings,
                dtype=getattr(torch, self.cfg.save_dtype),
            )
        return last
