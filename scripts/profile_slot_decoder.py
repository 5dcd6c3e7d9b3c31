"""One decode step of the slot decoder (continuous batching) on the embedded target, and where
its time goes: the figures behind docs/RESULTS.md's datagen section.

    NT=2 python scripts/profile_slot_decoder.py bfloat16 64     # one process, 2 threads
    NT=1 python scripts/profile_slot_decoder.py bfloat16 128 &  # two of these side by side:
    NT=1 python scripts/profile_slot_decoder.py bfloat16 128    # the --workers 2 setting

Every slot holds a 200-token prompt, so attention spans ~200 positions; the step is timed
over 10 decodes after 3 warm-ups, then profiled once with torch.profiler.
"""

import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from dspark.defaults import default_target_dir
from dspark.target import TargetModel
from dspark.target.slots import SlotDecoder

torch.set_num_threads(int(os.environ.get("NT", "2")))
dtype, slots = getattr(torch, sys.argv[1]), int(sys.argv[2])
target = TargetModel.from_pretrained(default_target_dir(), dtype=dtype)
decoder = SlotDecoder(target.model, slots=slots, max_len=512)
for s in range(slots):
    decoder.prefill(s, list(range(100, 300)))
tokens = torch.full((slots,), 5)
for _ in range(3):
    decoder.decode(tokens)
start = time.perf_counter()
for _ in range(10):
    decoder.decode(tokens)
step = (time.perf_counter() - start) / 10
print(
    f"decode step, {slots} slots, {sys.argv[1]}, {torch.get_num_threads()} threads: {step * 1000:.1f} ms, "
    f"{slots / step:.0f} tok/s"
)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    decoder.decode(tokens)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
