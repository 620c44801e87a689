"""At world size 2 or more (torchrun --nproc-per-node=N): docs/SPEC.md's shapes against the unfused path,
bit-identical reruns, and a peer that never arrives."""

import pytest
import torch
import torch.distributed as dist

import tpfuse
from tpfuse.checking import errors, random_operands, reference_rows, unfused_rows


@pytest.mark.parametrize("weight_layout", ["nk", "kn"])
@pytest.mark.parametrize("m, n, k_total", [(512, 8192, 8192), (2048, 8192, 28672), (8192, 6144, 6144),
                                           (2048, 6144, 16384)])
def test_spec_shapes_within_the_rule(multi_gpu, device, m, n, k_total, weight_layout):
    group = multi_gpu
    a, w = random_operands(m, n, k_total // 8, weight_layout, device, 17 * m + group.rank())
    out = tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=weight_layout)
    reference = reference_rows(a, w, weight_layout, group)
    fused = errors(out, reference, group)
    unfused = errors(unfused_rows(a, w, weight_layout, group), reference, group)
    assert fused.within(unfused), f"fused {fused} against unfused {unfused}"
    for _ in range(2):
        assert torch.equal(tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=weight_layout), out)


def test_a_peer_that_never_arrives_is_a_peer_timeout(multi_gpu, device):
    group = multi_gpu
    a, w = random_operands(1024, 512, 64, "nk", device, 99 + group.rank())
    tpfuse.close(group)
    tpfuse.reserve(group, 1024, 512, timeout=5)  # every rank has its communicator, with 5 s waits
    assert tpfuse.workspace_bytes(group) >= 4 * 1024 * 512
    tpfuse.gemm_reduce_scatter(a, w, group)
    torch.cuda.synchronize()
    dist.barrier(group)
    if group.rank() != group.size() - 1:  # the last rank stays away
        tpfuse.gemm_reduce_scatter(a, w, group)
        torch.cuda.synchronize()  # the wait is bounded: about 5 s
        with pytest.raises(tpfuse.PeerTimeoutError, match="waited more than 5.0+ s .*never arrived"):
            tpfuse.check(group.group_name)
        with pytest.raises(tpfuse.PeerTimeoutError):
            tpfuse.gemm_reduce_scatter(a, w, group)
    dist.barrier(group)
    tpfuse.close(group)  # a fresh communicator at the next call
    out = tpfuse.gemm_reduce_scatter(a, w, group)
    reference = reference_rows(a, w, "nk", group)
    assert errors(out, reference, group).within(errors(unfused_rows(a, w, "nk", group), reference, group))


def test_a_timeout_during_graph_replay_is_raised_by_check(multi_gpu, device):
    """A replay cannot raise: tpfuse.check() (once a step) reports the peer that never arrived."""
    group = multi_gpu
    a, w = random_operands(1024, 512, 64, "nk", device, 7 + group.rank())
    tpfuse.close(group)
    tpfuse.reserve(group, 1024, 512, timeout=5)
    out = tpfuse.gemm_reduce_scatter(a, w, group)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tpfuse.gemm_reduce_scatter(a, w, group, out=out)
    dist.barrier(group)
    if group.rank() != group.size() - 1:  # the last rank never replays
        graph.replay()
        torch.cuda.synchronize()  # the wait is bounded: about 5 s
        with pytest.raises(tpfuse.PeerTimeoutError, match="never arrived"):
            tpfuse.check(group)
    dist.barrier(group)
    del graph
    tpfuse.close(group)
