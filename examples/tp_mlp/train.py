"""A transformer block's MLP trained with tensor + sequence parallelism on tpfuse's layers, beside the same
model on torch's unfused collectives, from the same initial weights and data; each step's loss is printed
for both.

    torchrun --nproc-per-node=P examples/tp_mlp/train.py [--steps 10] [--compile]

P = 1, 2, 4 or 8 GPUs of one node (Hopper); with tpfuse installed (pip install .), or PYTHONPATH=python.
Activations are sharded on the sequence between blocks: each rank holds S/P tokens. The block is
x + fc2(gelu(fc1(layer_norm(x)))), fc1 column-parallel (all-gather + GEMM), fc2 row-parallel
(GEMM + reduce-scatter). LayerNorm's parameters and fc2's bias see only this rank's tokens: their gradients
are summed over the group before each optimizer step (allreduce_sequence_parallel_grads).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import tpfuse
from tpfuse.nn import ColumnParallelLinear, RowParallelLinear, allreduce_sequence_parallel_grads


class Block(torch.nn.Module):
    def __init__(self, norm, fc1, fc2):
        super().__init__()
        self.norm, self.fc1, self.fc2 = norm, fc1, fc2

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class UnfusedCopy(torch.nn.Module):
    """A copy of a tpfuse layer's group, weight and bias, for its unfused counterpart."""

    def __init__(self, fused):
        super().__init__()
        self.group = fused.group
        self.weight = torch.nn.Parameter(fused.weight.detach().clone())
        self.bias = torch.nn.Parameter(fused.bias.detach().clone())


class UnfusedColumn(UnfusedCopy):
    """The column-parallel layer on torch's collectives: all_gather_tensor, then x @ W^T + b."""

    def forward(self, x):
        return torch.nn.functional.linear(funcol.all_gather_tensor_autograd(x, 0, self.group), self.weight, self.bias)


class UnfusedRow(UnfusedCopy):
    """The row-parallel layer on torch's collectives: x @ W^T, reduce_scatter_tensor, then + b."""

    def __init__(self, fused: RowParallelLinear):
        super().__init__(fused)
        self.bias.sequence_parallel = True

    def forward(self, x):
        return funcol.reduce_scatter_tensor_autograd(x @ self.weight.t(), "sum", 0, self.group) + self.bias


def layer_norm(dim, device):
    norm = torch.nn.LayerNorm(dim, device=device, dtype=torch.bfloat16)
    for parameter in norm.parameters():
        parameter.sequence_parallel = True  # applied to this rank's tokens only
    return norm


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence (all ranks together)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) both models")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    group = dist.group.WORLD
    p, rank = group.size(), group.rank()

    torch.manual_seed(0)  # every rank draws the same full layers, then keeps its shard
    fc1 = torch.nn.Linear(args.dim, args.hidden, device=device, dtype=torch.bfloat16)
    fc2 = torch.nn.Linear(args.hidden, args.dim, device=device, dtype=torch.bfloat16)
    fused = Block(layer_norm(args.dim, device), ColumnParallelLinear.from_linear(fc1, group),
                  RowParallelLinear.from_linear(fc2, group))
    unfused = Block(layer_norm(args.dim, device), UnfusedColumn(fused.fc1), UnfusedRow(fused.fc2))
    unfused.norm.load_state_dict(fused.norm.state_dict())
    models = {"tpfuse": fused, "unfused": unfused}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=args.lr) for name, model in models.items()}
    runs = {name: torch.compile(model, fullgraph=True) if args.compile else model for name, model in models.items()}

    # A fixed regression task: inputs and targets, this rank's tokens of each sequence step.
    generator = torch.Generator(device=device).manual_seed(1)
    rows = args.seq // p
    if args.seq % p:
        raise SystemExit(f"--seq {args.seq} does not divide over {p} ranks")
    inputs = torch.randn(args.steps, args.seq, args.batch, args.dim, generator=generator, device=device)
    targets = torch.randn(args.steps, args.seq, args.batch, args.dim, generator=generator, device=device)
    inputs = inputs[:, rank * rows:(rank + 1) * rows].to(torch.bfloat16).contiguous()
    targets = targets[:, rank * rows:(rank + 1) * rows].contiguous()

    if rank == 0:
        print(f"P = {p}, tokens {args.seq} x {args.batch}, dim {args.dim}, hidden {args.hidden}, "
              f"compile {args.compile}")
        print(f"{'step':>4}  {'loss (tpfuse)':>14}  {'loss (unfused)':>14}  {'difference':>10}")
    for step in range(args.steps):
        losses = {}
        for name, model in models.items():
            optimizers[name].zero_grad(set_to_none=True)
            out = runs[name](inputs[step])
            loss = torch.nn.functional.mse_loss(out.float(), targets[step], reduction="sum")
            loss.backward()
            allreduce_sequence_parallel_grads(model, group)
            optimizers[name].step()
            total = loss.detach()
            dist.all_reduce(total, group=group)
            losses[name] = total.item() / (args.seq * args.batch * args.dim)
        if rank == 0:
            print(f"{step:>4}  {losses['tpfuse']:>14.6f}  {losses['unfused']:>14.6f}  "
                  f"{losses['tpfuse'] - losses['unfused']:>10.2e}", flush=True)

    tpfuse.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
