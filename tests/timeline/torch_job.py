"""gcomp.torch on a timeline (tests/timeline/timeline_test.sh): a DDP MLP with the one line
(register, timeline=FILE) or a DistributedOptimizer (the timeline from GCOMP_TIMELINE), every
step synchronized for 4 steps, then local steps with streaming averages (period 4, 2 fragments,
merged a step later), and average_parameters() at the end. Rank 0 prints "calls N steps S
averages A": what the timeline must hold (N call spans, S optimizer steps, A averages from start
to merge on every rank).

    torch_job.py register|optimizer FILE"""

import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp.torch as gt

way, file = sys.argv[1], sys.argv[2]
rank, size = gt.init_process_group()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
options = dict(period=4, period_from=4, fragments=2, overlap_steps=1, algorithm="allgather",
               allow_uncompressed=False)
# register's timeline= opens when register runs: the calls before it (the world's checks of
# init_process_group, GCOMP_TIMELINE's job has them on its timeline) are not on it.
before = gt.communicator().total_stats["calls"] if way == "register" else 0
if way == "register":
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = gt.register(model, opt, "topk:ratio=0.1", timeline=file, **options)
else:
    model = net
    state = opt = gt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05),
                                          net.named_parameters(), "topk:ratio=0.1", **options)
steps = 14
for step in range(steps):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
state.average_parameters()
st = state.stats()
calls = gt.communicator().total_stats["calls"] - before
if rank == 0:
    print(f"calls {calls} steps {steps} averages {st['averages']}", flush=True)
