"""A transformer block's MLP trained with tensor + sequence parallelism on tpfuse's layers, beside the same
model on torch's unfused collectives, from the same initial weights and data; each step's loss is printed
for both. The model is trained twice so: on activations laid out [s, b, h] (Megatron's; sequence_dim=0)
and on the same data laid out [b, s, h] (TorchTitan's; sequence_dim=1), whose losses match the first's. With
--fp8 blockwise, tpfuse's layers are trained a third time on each layout, with the blockwise FP8 recipe
(tpfuse.float8.BlockwiseRecipe: DeepSeek-V3's 1 x 128 and 128 x 128 blocks; the weight's gradient in BF16, or
FP8 with --fp8-wgrad fp8), from the same initial weights and data, and their losses are printed beside BF16's.

    torchrun --nproc-per-node=P examples/tp_mlp/train.py [--steps 10] [--compile] [--fp8 blockwise]

P = 1, 2, 4 or 8 GPUs of one node (Hopper); with tpfuse installed (pip install .), or PYTHONPATH=python.
Activations are sharded on the sequence between blocks: each rank holds S/P tokens of every sequence. The
block is x + fc2(gelu(fc1(layer_norm(x)))), fc1 column-parallel (all-gather + GEMM), fc2 row-parallel
(GEMM + reduce-scatter). LayerNorm's parameters and fc2's bias see only this rank's tokens: their gradients
are summed over the group before each optimizer step (allreduce_sequence_parallel_grads).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import tpfuse
from tpfuse.float8 import BlockwiseRecipe
from tpfuse.nn import ColumnParallelLinear, RowParallelLinear, allreduce_sequence_parallel_grads


class Block(torch.nn.Module):
    def __init__(self, norm, fc1, fc2):
        super().__init__()
        self.norm, self.fc1, self.fc2 = norm, fc1, fc2

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class UnfusedCopy(torch.nn.Module):
    """A copy of a tpfuse layer's group, sequence dimension, weight and bias, for its unfused counterpart."""

    def __init__(self, fused):
        super().__init__()
        self.group, self.sequence_dim = fused.group, fused.sequence_dim
        self.weight = torch.nn.Parameter(fused.weight.detach().clone())
        self.bias = torch.nn.Parameter(fused.bias.detach().clone())


class UnfusedColumn(UnfusedCopy):
    """The column-parallel layer on torch's collectives: all_gather_tensor, then x @ W^T + b."""

    def forward(self, x):
        gathered = funcol.all_gather_tensor_autograd(x, self.sequence_dim, self.group)
        return torch.nn.functional.linear(gathered, self.weight, self.bias)


class UnfusedRow(UnfusedCopy):
    """The row-parallel layer on torch's collectives: x @ W^T, reduce_scatter_tensor, then + b."""

    def __init__(self, fused: RowParallelLinear):
        super().__init__(fused)
        self.bias.sequence_parallel = True

    def forward(self, x):
        rows = funcol.reduce_scatter_tensor_autograd(x @ self.weight.t(), "sum", self.sequence_dim, self.group)
        return rows + self.bias


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
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) every model")
    parser.add_argument("--fp8", choices=["blockwise"], help="also train tpfuse's layers with this FP8 recipe "
                        "(--dim and --hidden / P multiples of 128)")
    parser.add_argument("--fp8-wgrad", choices=["bf16", "fp8"], default="bf16",
                        help="the FP8 recipe's weight gradient (default bf16)")
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
    recipe = BlockwiseRecipe(wgrad=args.fp8_wgrad) if args.fp8 else None

    def tpfuse_block(sequence_dim, fp8=None):
        return Block(layer_norm(args.dim, device),
                     ColumnParallelLinear.from_linear(fc1, group, sequence_dim=sequence_dim, fp8=fp8),
                     RowParallelLinear.from_linear(fc2, group, sequence_dim=sequence_dim, fp8=fp8))

    models = {}  # LayerNorm starts at ones and zeros: every copy alike
    for layout, sequence_dim in (("[s,b,h]", 0), ("[b,s,h]", 1)):
        fused = tpfuse_block(sequence_dim)
        unfused = Block(layer_norm(args.dim, device), UnfusedColumn(fused.fc1), UnfusedRow(fused.fc2))
        models[f"{layout} tpfuse"], models[f"{layout} unfused"] = fused, unfused
        if recipe is not None:
            models[f"{layout} {args.fp8}"] = tpfuse_block(sequence_dim, recipe)
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=args.lr) for name, model in models.items()}
    runs = {name: torch.compile(model, fullgraph=True) if args.compile else model for name, model in models.items()}

    # A fixed regression task: inputs and targets, this rank's tokens of each sequence, per step.
    generator = torch.Generator(device=device).manual_seed(1)
    rows = args.seq // p
    if args.seq % p:
        raise SystemExit(f"--seq {args.seq} does not divide over {p} ranks")
    inputs = torch.randn(args.steps, args.seq, args.batch, args.dim, generator=generator, device=device)
    targets = torch.randn(args.steps, args.seq, args.batch, args.dim, generator=generator, device=device)
    inputs = inputs[:, rank * rows:(rank + 1) * rows].to(torch.bfloat16)
    targets = targets[:, rank * rows:(rank + 1) * rows]
    # [s, b, h] per step, and the same tokens as [b, s, h].
    data = {"[s,b,h]": (inputs.contiguous(), targets.contiguous()),
            "[b,s,h]": (inputs.transpose(1, 2).contiguous(), targets.transpose(1, 2).contiguous())}

    width = max(16, *(len(name) for name in models))
    if rank == 0:
        print(f"P = {p}, tokens {args.seq} x {args.batch}, dim {args.dim}, hidden {args.hidden}, "
              f"compile {args.compile}, fp8 {recipe}")
        print(f"{'step':>4}  " + "  ".join(f"{name:>{width}}" for name in models))
    for step in range(args.steps):
        losses = {}
        for name, model in models.items():
            step_inputs, step_targets = data[name.split()[0]]
            optimizers[name].zero_grad(set_to_none=True)
            out = runs[name](step_inputs[step])
            loss = torch.nn.functional.mse_loss(out.float(), step_targets[step], reduction="sum")
            loss.backward()
            allreduce_sequence_parallel_grads(model, group)
            optimizers[name].step()
            total = loss.detach()
            dist.all_reduce(total, group=group)
            losses[name] = total.item() / (args.seq * args.batch * args.dim)
        if rank == 0:
            print(f"{step:>4}  " + "  ".join(f"{loss:>{width}.6f}" for loss in losses.values()), flush=True)

    tpfuse.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
