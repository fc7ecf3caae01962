"""The toy model and data the strategy tests share: an embedding tied to the output layer,
a frozen layer, a buffer, a parameter used only on request, odd numels."""
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.course.exercises.solutions import answer  # noqa: F401  (tests import it from here)
from course_utils.harness.experiments import GLOBAL_BATCH

VOCAB, DIM, SEQ = 11, 6, 5


class Toy(nn.Module):
    """Embedding tied to the output layer, a frozen layer, a buffer; odd numels."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.frozen = nn.Linear(DIM, DIM)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight                 # one Parameter, used twice
        self.register_buffer("shift", torch.zeros(DIM))
        self.extra = nn.Parameter(torch.ones(3))            # used only when asked

    def forward(self, idx, targets, use_extra=False):
        h = self.emb(idx) + self.shift
        h = torch.tanh(self.hidden(h))
        h = h + self.frozen(h)
        if use_extra:
            h = h * self.extra.sum()
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), targets.reshape(-1))


TOY_TRAINABLE = VOCAB * DIM + DIM * DIM + DIM + 3            # tied once, frozen excluded: 111


def toy_batch(step):
    """Step ``step``'s global batch (inputs, targets), the same for every world size."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(VOCAB, (GLOBAL_BATCH, SEQ), generator=g), \
        torch.randint(VOCAB, (GLOBAL_BATCH, SEQ), generator=g)


def toy_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


