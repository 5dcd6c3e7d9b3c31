"""Float32 products of a few rows on CPU, written the fast way round.

A decoding step multiplies a few rows (one token, a sequence's drafted block, or a small
batch) by every weight matrix of the target. On CPU, `F.linear` (x @ Wᵀ) of one row is a
matrix-vector product and of 2..64 rows a matrix product, both far slower here than the
same product written W @ xᵀ with at least two columns, which streams W once. Measured on
SmolLM2-135M, fp32, 2 cores (`python -m dspark.bench.small_rows`, docs/RESULTS.md): a
one-token target forward 63 → 34 ms, 2 tokens 102 → 40 ms, 8 tokens 89 → 73 ms; plain
decoding 16.5 → 25.6 tok/s.

`rows_first_linear(model, on)` gives every plain `nn.Linear` of a model that product for
1..`MAX_ROWS` rows of float32 on CPU (one row is doubled into two columns: the second is
dropped); longer inputs (prefill, features), other dtypes and devices keep `F.linear`, except
one bf16 row on CPU, which is doubled too: alone it would take a matrix-vector kernel that
sums in another order than the matrix product every batch of 2+ rows takes, and a request's
bf16 text would then depend on the batch it is served in. The
sums are the same products added in another order, so results differ from `F.linear` by
float rounding (~1e-5 relative), as a block forward already differs from one-token
forwards; greedy speculative decoding stays token-identical to plain decoding in the
lossless tests and benchmarks. `TargetModel` turns it on for float32 CPU targets;
``DSPARK_SMALL_ROWS=0`` turns it off.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

MAX_ROWS = 64


class RowsFirstLinear(nn.Linear):
    """`nn.Linear` whose float32 CPU product of 1..MAX_ROWS rows is computed as W @ xᵀ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if self.in_features else 0
        if 1 <= rows <= MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu":
            weight = self.weight
            if weight.dtype == torch.float32:
                flat = x.reshape(rows, self.in_features)
                if rows == 1:  # one row is a matrix-vector product, slower still: ask for two
                    flat = torch.cat([flat, flat])
                out = (weight @ flat.T).T[:rows]
                if self.bias is not None:
                    out = out + self.bias
                return out.contiguous().view(*x.shape[:-1], self.out_features)
        if rows == 1 and x.dtype == torch.bfloat16 and x.device.type == "cpu":
            # One bf16 row goes to a matrix-vector kernel that sums in another order than the
            # matrix product of 2+ rows (whose sums do not depend on the row count); rounded
            # to bf16 the two differ, and a request's text would depend on its batch. Two
            # rows keep every product on the one kernel.
            flat = x.reshape(1, self.in_features)
            out = F.linear(torch.cat([flat, flat]), self.weight, self.bias)[:1]
            return out.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


def enabled_by_default() -> bool:
    return os.environ.get("DSPARK_SMALL_ROWS", "1") != "0"


def rows_first_linear(model: nn.Module, on: bool = True) -> int:
    """Switch every plain `nn.Linear` of ``model`` to `RowsFirstLinear` (``on``) or back;
    returns how many modules it switched. Weights, state dict and hooks are untouched."""
    src, dst = (nn.Linear, RowsFirstLinear) if on else (RowsFirstLinear, nn.Linear)
    count = 0
    for module in model.modules():
        if type(module) is src:
            module.__class__ = dst
            count += 1
    return count
