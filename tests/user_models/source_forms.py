"""Four ways a user's layer keeps the gathered sequence for backward, for the test of the source
lines `sptrace check` names (tests/user_models/test_source_lines.py).

Each model is two sequence-parallel blocks on [S/P, B, H] shards; the second keeps a full [S, B, H]
tensor one way. The statement that makes each stray carries a ``# MADE: <form>`` comment, which
the test reads for the line number a FAIL must name under sptrace.instrument; a bare trace names
the first line of the function around it (the test reads that from the code object).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

FORMS = ("saved", "list", "hook", "dropout")
"""autograd saves the gathered input of a linear; a list keeps a copy of it; a forward hook keeps a
module's full-size output; dropout's mask on the gathered tensor."""


class Gather(torch.autograd.Function):
    """All-gather of the sequence shards along dim 0 (Megatron's [s, b, h] layout)."""

    @staticmethod
    def forward(ctx, shard: Tensor) -> Tensor:
        world = dist.get_world_size()
        full = torch.empty((shard.shape[0] * world, *shard.shape[1:]), dtype=shard.dtype)  # MADE: gather
        dist.all_gather_into_tensor(full, shard.contiguous())
        return full

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.chunk(dist.get_world_size())[dist.get_rank()].contiguous()


def own_part(full: Tensor) -> Tensor:
    """This rank's part of a full-sequence tensor, as a tensor of its own."""
    return full.chunk(dist.get_world_size())[dist.get_rank()].clone()


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, shard: Tensor) -> Tensor:
        return Gather.apply(shard) * self.scale  # MADE: hook


class Block(nn.Module):
    def __init__(self, hidden: int, form: str | None) -> None:
        super().__init__()
        self.form = form
        self.fc = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden) if form == "saved" else None
        self.scaled = Scaled() if form == "hook" else None
        self.kept: list[Tensor] = []
        if self.scaled is not None:
            self.scaled.register_forward_hook(self._keep_output)

    def _keep_output(self, module: nn.Module, args: object, output: Tensor) -> None:
        self.kept.append(output)  # a debugging hook: the output is kept until the step ends

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.fc(x)
        if self.form == "saved":
            x = x + own_part(self.proj(Gather.apply(x)))
        elif self.form == "list":
            full = Gather.apply(x)
            self.kept.append(full.detach().clone())  # MADE: list
            x = x + own_part(full)
        elif self.form == "hook":
            x = x + own_part(self.scaled(x))
        elif self.form == "dropout":
            dropped = F.dropout(Gather.apply(x), p=0.1, training=True)  # MADE: dropout
            x = x + own_part(dropped)
        return x


class Model(nn.Module):
    """Two blocks; the second keeps the full sequence the way ``form`` says."""

    def __init__(self, hidden: int, form: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(hidden, None), Block(hidden, form)])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def forget(self) -> None:
        """What a debugging list keeps is dropped once the step is done."""
        for layer in self.layers:
            layer.kept.clear()
