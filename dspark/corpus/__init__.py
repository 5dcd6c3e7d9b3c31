"""A self-distillation corpus that lasts: append-only, compressed shards of token ids and
loss masks, with a manifest, kept in the repo so that every session adds to it.

Layout of a corpus directory::

    manifest.json          format, target, tokenizer checksum, and one entry per shard:
                           file, rows, tokens, response_tokens, sha256, sources, engines,
                           command, commit, created_utc
    shard-00000.npz        numpy ``savez_compressed`` arrays (no pickles):
                             input_ids     uint32  all rows' tokens, concatenated
                             offsets       int64   [rows + 1] row boundaries into input_ids
                             loss_mask     uint8   np.packbits of the concatenated mask (little bit order)
                             source        str     [rows] prompt source ("gsm8k_train", "sharegpt", ...)
                             source_index  int64   [rows] the prompt's index within its source
                             prompt_key    str     [rows] sha1 of the prompt (dedupe across shards)
                             engine        str     [rows] what generated the response

Hidden states are not stored: they are recomputed from the tokens (``cache-features`` or
an online source). A shard is written once, to a temporary name and renamed, and the
manifest is rewritten atomically after it; shards are never modified, so git keeps each
blob once. `Corpus.verify` checks every shard against its checksum.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspark.errors import DSparkError
from dspark.io import atomic_write, atomic_write_text, sha256_file

FORMAT = "dspark-corpus/1"
MANIFEST = "manifest.json"
HELDOUT_EVERY = 64  # a row is held out when its prompt key falls in bucket 0 of 64 (~1.6%)
SPLITS = ("all", "train", "heldout")


def is_heldout(key: str) -> bool:
    """The held-out split, fixed by the prompt alone: it stays the same as the corpus grows
    and whatever order rows were added in."""
    return int(key[:8], 16) % HELDOUT_EVERY == 0


def prompt_key(prompt) -> str:
    """A stable key of a prompt (text, or a messages list) for dedupe across shards."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(" ".join(text.split()).encode()).hexdigest()[:20]


@dataclass
class Row:
    input_ids: list[int]
    loss_mask: list[int]
    source: str
    source_index: int
    prompt_key: str
    engine: str


class CorpusError(DSparkError):
    """A corpus directory is missing, corrupt, or belongs to another target."""


class Corpus:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        path = self.dir / MANIFEST
        if not path.is_file():
            raise CorpusError(f"{self.dir}: not a corpus (no {MANIFEST}); create one with `dspark corpus add`")
        try:
            self.manifest = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}: not JSON ({exc})") from None
        if self.manifest.get("format") != FORMAT:
            raise CorpusError(f"{path}: format {self.manifest.get('format')!r}, expected {FORMAT!r}")

    # ------------------------------------------------------------------ creating
    @classmethod
    def create(cls, directory: str | Path, *, target: str, tokenizer_sha256: str) -> Corpus:
        out = Path(directory)
        if (out / MANIFEST).exists():
            raise CorpusError(f"{out}: a corpus exists here already")
        out.mkdir(parents=True, exist_ok=True)
        manifest = {"format": FORMAT, "target": target, "tokenizer_sha256": tokenizer_sha256, "shards": []}
        atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        return cls(out)

    @classmethod
    def open_or_create(cls, directory: str | Path, *, target: str, tokenizer_sha256: str) -> Corpus:
        if (Path(directory) / MANIFEST).is_file():
            corpus = cls(directory)
            if corpus.manifest["tokenizer_sha256"] != tokenizer_sha256:
                raise CorpusError(
                    f"{directory}: the corpus was made with another tokenizer (target "
                    f"{corpus.manifest['target']}); its token ids do not fit {target}"
                )
            return corpus
        return cls.create(directory, target=target, tokenizer_sha256=tokenizer_sha256)

    # ------------------------------------------------------------------ facts
    @property
    def shards(self) -> list[dict]:
        return list(self.manifest["shards"])

    @property
    def rows(self) -> int:
        return sum(s["rows"] for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    def keys(self) -> set[str]:
        """Prompt keys of every stored row (for dedupe and resume)."""
        keys: set[str] = set()
        for shard in self.shards:
            keys.update(self._load(shard)["prompt_key"].tolist())
        return keys

    def summary(self) -> dict:
        sources: Counter = Counter()
        engines: Counter = Counter()
        for s in self.shards:
            sources.update(s["sources"])
            engines.update(s["engines"])
        return {
            "directory": str(self.dir),
            "target": self.manifest["target"],
            "shards": len(self.shards),
            "rows": self.rows,
            "tokens": self.tokens,
            "response_tokens": sum(s["response_tokens"] for s in self.shards),
            "sources": dict(sorted(sources.items())),
            "engines": dict(sorted(engines.items())),
        }

    # ------------------------------------------------------------------ reading
    def _load(self, shard: dict) -> dict[str, np.ndarray]:
        path = self.dir / shard["file"]
        if not path.is_file():
            raise CorpusError(f"{path}: shard listed in the manifest is missing")
        try:
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        except (OSError, ValueError, EOFError) as exc:
            raise CorpusError(f"{path}: cannot read the shard (truncated or corrupt?): {exc}") from None

    def verify(self) -> None:
        """Every shard present and matching its checksum; raises naming the first that is not."""
        for shard in self.shards:
            path = self.dir / shard["file"]
            if not path.is_file():
                raise CorpusError(f"{path}: shard listed in the manifest is missing")
            digest = sha256_file(path)
            if digest != shard["sha256"]:
                raise CorpusError(f"{path}: checksum {digest[:16]}... does not match the manifest's")

    def iter_rows(self, limit: int | None = None) -> Iterator[Row]:
        """Rows in shard order (the order they were added), the first ``limit``."""
        n = 0
        for shard in self.shards:
            data = self._load(shard)
            offsets = data["offsets"]
            ids = data["input_ids"].astype(np.int64)
            mask = np.unpackbits(data["loss_mask"], count=int(offsets[-1]), bitorder="little")
            for i in range(len(offsets) - 1):
                if limit is not None and n >= limit:
                    return
                a, b = int(offsets[i]), int(offsets[i + 1])
                yield Row(
                    input_ids=ids[a:b].tolist(),
                    loss_mask=mask[a:b].tolist(),
                    source=str(data["source"][i]),
                    source_index=int(data["source_index"][i]),
                    prompt_key=str(data["prompt_key"][i]),
                    engine=str(data["engine"][i]),
                )
                n += 1

    def select(self, split: str = "all", rows: int | None = None, seed: int | None = None) -> list[Row]:
        """The rows of ``split`` (all / train / heldout), in the order they were added or, with
        ``seed``, in a seeded random order (a sample of ``rows`` that does not favour the
        first shards, whose rows are the shorter prompts of their windows); the first ``rows``."""
        if split not in SPLITS:
            raise CorpusError(f"split {split!r}: choose one of {', '.join(SPLITS)}")
        chosen = [r for r in self.iter_rows() if split == "all" or (is_heldout(r.prompt_key) == (split == "heldout"))]
        if seed is not None:
            import random

            random.Random(seed).shuffle(chosen)
        return chosen[:rows] if rows is not None else chosen

    # ------------------------------------------------------------------ appending
    def append(self, rows: Iterable[Row], *, command: str, commit: str | None, created_utc: str) -> dict | None:
        """Write ``rows`` as one new shard and list it in the manifest; returns its entry (None
        when there are no rows). Rows whose prompt key is already stored are refused."""
        rows = list(rows)
        if not rows:
            return None
        seen = self.keys()
        dupes = [r.prompt_key for r in rows if r.prompt_key in seen]
        if dupes or len({r.prompt_key for r in rows}) != len(rows):
            raise CorpusError(f"{self.dir}: {len(dupes) or 'some'} rows repeat a stored or another new prompt")
        for r in rows:
            if len(r.input_ids) != len(r.loss_mask) or len(r.input_ids) < 2:
                raise CorpusError(f"prompt {r.prompt_key}: input_ids and loss_mask must match, >= 2 tokens")
        lengths = np.array([len(r.input_ids) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        flat_ids = np.fromiter((t for r in rows for t in r.input_ids), dtype=np.int64, count=int(offsets[-1]))
        if flat_ids.min() < 0 or flat_ids.max() >= 2**32:
            raise CorpusError("token ids must fit in uint32")
        flat_mask = np.fromiter((m for r in rows for m in r.loss_mask), dtype=np.uint8, count=int(offsets[-1]))
        arrays = {
            "input_ids": flat_ids.astype(np.uint32),
            "offsets": offsets,
            "loss_mask": np.packbits(flat_mask != 0, bitorder="little"),
            "source": np.array([r.source for r in rows]),
            "source_index": np.array([r.source_index for r in rows], dtype=np.int64),
            "prompt_key": np.array([r.prompt_key for r in rows]),
            "engine": np.array([r.engine for r in rows]),
        }
        index = max((int(s["file"][6:11]) for s in self.shards), default=-1) + 1
        name = f"shard-{index:05d}.npz"
        path = self.dir / name

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh:
                np.savez_compressed(fh, **arrays)

        atomic_write(path, write)
        entry = {
            "file": name,
            "rows": len(rows),
            "tokens": int(offsets[-1]),
            "response_tokens": int(flat_mask.sum()),
            "sha256": sha256_file(path),
            "sources": dict(sorted(Counter(r.source for r in rows).items())),
            "engines": dict(sorted(Counter(r.engine for r in rows).items())),
            "command": command,
            "commit": commit,
            "created_utc": created_utc,
        }
        self.manifest["shards"].append(entry)
        atomic_write_text(self.dir / MANIFEST, json.dumps(self.manifest, indent=2) + "\n")
        return entry

    # ------------------------------------------------------------------ merging
    def merge(
        self, other: Corpus, *, shard_rows: int, command: str, commit: str | None, created_utc: str
    ) -> dict[str, int]:
        """Append the rows of ``other`` whose prompts this corpus lacks, in new shards of at
        most ``shard_rows`` (a corpus grown on another machine, e.g. a GPU round's). Both must
        belong to the same tokenizer; ``other`` is verified first and left as it is."""
        if other.dir.resolve() == self.dir.resolve():
            raise CorpusError(f"{self.dir}: cannot merge a corpus into itself")
        if other.manifest["tokenizer_sha256"] != self.manifest["tokenizer_sha256"]:
            raise CorpusError(
                f"{other.dir}: made with another tokenizer (target {other.manifest['target']}) than "
                f"{self.dir} (target {self.manifest['target']}); its token ids do not fit"
            )
        other.verify()
        seen = self.keys()
        counts = {"offered": 0, "added": 0, "already_stored": 0, "shards": 0}
        batch: list[Row] = []
        for row in other.iter_rows():
            counts["offered"] += 1
            if row.prompt_key in seen:
                counts["already_stored"] += 1
                continue
            seen.add(row.prompt_key)
            batch.append(row)
            if len(batch) == shard_rows:
                self.append(batch, command=command, commit=commit, created_utc=created_utc)
                counts["added"] += len(batch)
                counts["shards"] += 1
                batch = []
        if batch:
            self.append(batch, command=command, commit=commit, created_utc=created_utc)
            counts["added"] += len(batch)
            counts["shards"] += 1
        return counts
