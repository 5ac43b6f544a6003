"""A tiny torch.compile'd model, run as its own process by the tests: prints one JSON line with the
time of the first compiled call and PyTorch's cache counters."""

from __future__ import annotations

import json
import time

import torch
from torch import nn
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
compiled = torch.compile(model)
x = torch.randn(4, 16)
t0 = time.perf_counter()
with torch.no_grad():
    y = compiled(x)
first = time.perf_counter() - t0
assert torch.allclose(y, model(x), atol=1e-5)
print(json.dumps({"first_s": first, "inductor": dict(counters["inductor"])}))
