"""vLLM as the target's hidden-state source, for the feature cache (offline) or the trainer
(online, `VllmSource`).

A ``vllm serve`` started with the ``extract_hidden_states`` method and a hidden-states
connector (`dspark.interop.vllm_env.hidden_state_server_args`) answers a completion request
of ``max_tokens`` 1 for a prompt of token ids, and writes the hidden states of every prompt
token to a safetensors file whose path comes back in ``kv_transfer_params``:
``hidden_states`` [T, layers, H] (the layers sorted ascending) and ``token_ids`` [T]. The
server and this client share a filesystem (loopback), as in speculators' data generation.

Layer ids mean the same in vLLM as here (id i = the residual stream after i decoder layers,
HF ``hidden_states[i]``) with one exception, read in vLLM's ``llama.py``: vLLM records id
``num_layers`` *before* the final norm, where HF and our capture return it normed. The
teacher reads the normed state, so this source applies the target's final norm to it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from dspark.errors import DSparkError
from dspark.training.data import Example, FeatureBatch, example_order


class VllmHiddenStates:
    """Hidden states of token sequences from a running vLLM hidden-state server.

    ``target`` supplies the layer count, hidden size and final norm (its weights; the server
    runs its own copy). ``aux_ids``: the drafter's aux layers; the server must capture them
    and ``num_layers`` (the final state), no more, no less."""

    def __init__(self, url: str, target, aux_ids, *, model: str | None = None, timeout: float = 600.0) -> None:
        from dspark.training.server_client import ServerClient

        self.client = ServerClient(url, timeout=timeout)
        self.url, self.timeout = self.client.url, timeout
        self.target, self.aux_ids = target, tuple(int(i) for i in aux_ids)
        self.layers = sorted(set(self.aux_ids) | {target.num_layers})
        self.model = model or self.client.served_model()

    def fetch(self, input_ids: list[int]) -> torch.Tensor:
        """[T, layers, H] for the T tokens of ``input_ids`` (the file is removed once read)."""
        from safetensors.torch import load_file

        body = {"model": self.model, "prompt": input_ids, "max_tokens": 1, "temperature": 0, "return_token_ids": True}
        answer = self.client.post("/v1/completions", body)
        path = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise DSparkError(
                f"{self.url}: the completion names no hidden_states_path; start the server with "
                "`dspark.interop.vllm_env.hidden_state_server_args` (extract_hidden_states + a hidden-states connector)"
            )
        _wait_for_file(Path(path), self.timeout)
        data = load_file(path)
        for leftover in (path, path + ".lock"):
            if os.path.exists(leftover):
                os.remove(leftover)
        hidden, ids = data["hidden_states"], data["token_ids"]
        if ids.tolist() != list(input_ids):
            raise DSparkError(f"{path}: token_ids differ from the {len(input_ids)} tokens sent")
        if hidden.shape[1:] != (len(self.layers), self.target.hidden_size):
            raise DSparkError(
                f"{path}: hidden_states {tuple(hidden.shape)}: the server captures {hidden.shape[1]} layers of size "
                f"{hidden.shape[2]}; this drafter needs layers {self.layers} of size {self.target.hidden_size} "
                "(eagle_aux_hidden_state_layer_ids of the server's --speculative-config)"
            )
        return hidden

    @torch.no_grad()
    def features(self, example: Example, index: int) -> FeatureBatch:
        """The same `FeatureBatch` as `extract_features` computes in process."""
        hidden = self.fetch(example.input_ids.tolist()).float()
        aux = torch.cat([hidden[:, self.layers.index(i)] for i in self.aux_ids], dim=-1)
        last = self.target.final_norm(hidden[:, self.layers.index(self.target.num_layers)]).float()
        return FeatureBatch(
            index=index,
            input_ids=example.input_ids,
            loss_mask=example.loss_mask,
            document_ids=torch.zeros_like(example.input_ids),
            aux_hidden=aux,
            last_hidden=last,
        )


def _wait_for_file(path: Path, timeout: float) -> None:
    """vLLM holds ``PATH.lock`` exclusively until the file is whole (or never makes a lock)."""
    lock = Path(str(path) + ".lock")
    deadline = time.monotonic() + timeout
    while not lock.exists() and not path.exists():
        if time.monotonic() > deadline:
            raise DSparkError(f"{path}: vLLM never wrote it")
        time.sleep(0.01)
    if lock.exists():
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)


class VllmSource:
    """Training features from a live vLLM hidden-state server, in the trainer's example order;
    ``concurrency`` requests in flight ahead of the trainer."""

    def __init__(self, url: str, target, examples: list[Example], aux_ids, *, seed: int, concurrency: int = 4) -> None:
        self.client = VllmHiddenStates(url, target, aux_ids)
        self.examples, self.seed, self.concurrency = examples, seed, concurrency
        self.wait_seconds = 0.0

    def batches(self, start: int, count: int) -> Iterator[FeatureBatch]:
        from collections import deque

        order = iter(enumerate(example_order(len(self.examples), self.seed, start, count)))
        ahead: deque = deque()
        with ThreadPoolExecutor(self.concurrency) as pool:

            def submit_next() -> None:
                for i, idx in order:
                    ahead.append(pool.submit(self.client.features, self.examples[idx], start + i))
                    return

            try:
                for _ in range(self.concurrency):
                    submit_next()
                while ahead:
                    t0 = time.perf_counter()
                    batch = ahead.popleft().result()
                    self.wait_seconds += time.perf_counter() - t0
                    submit_next()
                    yield batch
            finally:
                for fut in ahead:
                    fut.cancel()

    def close(self) -> None:
        pass
