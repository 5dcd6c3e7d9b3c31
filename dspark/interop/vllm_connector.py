"""vLLM's hidden-states connector for CPU builds of vLLM (imported by vLLM, never by dspark).

vLLM's ``extract_hidden_states`` method stores the target's hidden states of the layers
``eagle_aux_hidden_state_layer_ids`` in a cache-only attention layer; its
``ExampleHiddenStatesConnector`` writes them per finished request to
``{shared_storage_path}/{request id}.safetensors`` as ``hidden_states`` [T, layers, H] and
``token_ids`` [T], behind a ``.lock`` file held until the file is whole. Its copy path uses a
CUDA stream and pinned host memory, so on vLLM's CPU build it dies with ``pin_memory=True
requires a CUDA or other accelerator backend``. This subclass copies on the CPU and writes
through the same thread pool and lock protocol; everything else is vLLM's.

Start ``vllm serve`` with ``PYTHONPATH`` naming the directory that holds the ``dspark``
package and ``--kv-transfer-config '{"kv_connector": "CpuHiddenStatesConnector",
"kv_connector_module_path": "dspark.interop.vllm_connector", "kv_role": "kv_producer", ...}'``
(`dspark.interop.vllm_env.hidden_state_server_argv` builds the whole command).
"""

from __future__ import annotations

import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event of the GPU path: the CPU copy is finished when made."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size).reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
        # A copy, not a view: the request's blocks are freed once this returns.
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            import fcntl

            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
