"""A language-model workload for the examples: English text from Debian's `fortunes` package
(/usr/share/games/fortunes: quotations, poems, definitions; about 2.5 MB) read as bytes, and a
small byte-level GPT (causal, pre-norm, learned positions, the output tied to the input
embedding) that the examples train with AdamW.

    from gpt_text import batch, gpt, learning_rate, load_text, validation_loss

Every rank draws its sequences from the same global order (batch(): a function of the seed, the
step and the rank alone), so every row of a comparison sees the same data. The validation loss
is in nats per byte: the mean cross-entropy of predicting each byte of held-out windows from the
bytes before it in the window.
"""

import glob
import math
import os

import torch

TEXT = "/usr/share/games/fortunes"
BLOCK = 4096  # the corpus is cut in blocks of this many bytes; every VALID_EVERY-th is held out
VALID_EVERY = 20


def load_text(folder=TEXT):
    """(train, valid): uint8 tensors of the corpus's bytes, the files in name order (their
    strfile indexes, *.dat, and links left out) joined; every 20th block of 4,096 bytes goes to
    valid, the rest to train."""
    if not os.path.isdir(folder):
        raise SystemExit(f"{folder} not found: apt-get install fortunes")
    files = sorted(f for f in glob.glob(os.path.join(folder, "*"))
                   if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat"))
    if not files:
        raise SystemExit(f"no text files in {folder}: apt-get install fortunes")
    data = b"".join(open(f, "rb").read() for f in files)
    blocks = [data[i:i + BLOCK] for i in range(0, len(data), BLOCK)]
    train = b"".join(b for i, b in enumerate(blocks) if i % VALID_EVERY != VALID_EVERY - 1)
    valid = b"".join(b for i, b in enumerate(blocks) if i % VALID_EVERY == VALID_EVERY - 1)
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return as_tensor(train), as_tensor(valid)


class Block(torch.nn.Module):
    """One pre-norm transformer layer: causal self-attention, then an MLP of 4 x width."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        # The causal mask made here, not kept as a buffer: DDP would broadcast it (gloo has no
        # bool), and it costs nothing next to the attention.
        later = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(later, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, w)
        x = x + self.proj(y)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class GPT(torch.nn.Module):
    """Bytes in, the next byte's logits out (256 classes)."""

    def __init__(self, width=96, depth=3, heads=4, context=64):
        super().__init__()
        self.context = context
        self.embed = torch.nn.Embedding(256, width)
        self.pos = torch.nn.Parameter(torch.zeros(context, width))
        self.layers = torch.nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = torch.nn.LayerNorm(width)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        torch.nn.init.normal_(self.pos, std=0.02)
        for layer in self.layers:  # GPT-2's: the residual branches' last layers scaled down
            for lin in (layer.qkv, layer.proj, layer.up, layer.down):
                torch.nn.init.normal_(lin.weight, std=0.02)
                torch.nn.init.zeros_(lin.bias)
            for lin in (layer.proj, layer.down):
                lin.weight.data.mul_(1 / math.sqrt(2 * depth))

    def forward(self, x):
        h = self.embed(x) + self.pos[:x.shape[1]]
        for layer in self.layers:
            h = layer(h)
        return self.norm(h) @ self.embed.weight.t()


def gpt(seed=0, **shape):
    """The GPT above, seeded (width 96, 3 layers, 4 heads, context 64: 366,432 parameters)."""
    torch.manual_seed(seed)
    return GPT(**shape)


def batch(train, step, rank, size, sequences, context=64, seed=0):
    """(x, y) of this rank at this step: its `sequences` windows of a global batch of size *
    sequences windows drawn from a generator of (seed, step) alone (so every row of a
    comparison sees the same data in the same order); y is x moved one byte on."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(train) - context - 1, (size * sequences,), generator=g)
    mine = starts[rank * sequences:(rank + 1) * sequences]
    idx = mine[:, None] + torch.arange(context + 1)[None, :]
    w = train[idx].long()
    return w[:, :-1], w[:, 1:]


def loss_of(model, x, y):
    """The mean cross-entropy in nats per predicted byte."""
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def validation_loss(model, valid, windows=256, context=64, chunk=64):
    """The mean loss in nats per byte over the first `windows` non-overlapping windows of valid
    (the same ones every time), without gradients."""
    count = min(windows, (len(valid) - 1) // context)
    total = 0.0
    with torch.no_grad():
        for b in range(0, count, chunk):
            rows = torch.arange(b, min(count, b + chunk))[:, None] * context
            w = valid[rows + torch.arange(context + 1)[None, :]].long()
            total += float(loss_of(model, w[:, :-1], w[:, 1:])) * w.shape[0]
    return total / count


def learning_rate(step, steps, peak, warmup):
    """Linear warm-up over `warmup` steps to peak, then a cosine to a tenth of it at `steps`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def adamw(model, lr, weight_decay=0.1):
    """AdamW (betas 0.9, 0.95) with weight decay on the matrices only (not on biases, norms,
    positions or the embedding)."""
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and
             "pos" not in n]
    other = [p for n, p in model.named_parameters() if not any(p is q for q in decay)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
