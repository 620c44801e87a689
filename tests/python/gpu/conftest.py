"""GPU tests: one process per GPU, under torchrun (WORLD_SIZE ranks), or alone as a group of one.
Every test here skips, with its reason, where there is no Hopper GPU. Multicast stays off."""

import os

import pytest
import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def no_gpu_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"tpfuse's kernels need a Hopper GPU (sm_90a); this is {torch.cuda.get_device_name()}"
    return None


@pytest.fixture(scope="session", autouse=True)
def needs_gpu():
    reason = no_gpu_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def group(needs_gpu):
    """The default group: torchrun's ranks, else this process alone (world size 1)."""
    import tpfuse

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    yield dist.group.WORLD
    tpfuse.close()
    dist.destroy_process_group()


@pytest.fixture
def device(group):
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def multi_gpu(group):
    if group.size() < 2:
        pytest.skip(f"needs 2 or more ranks (run under torchrun --nproc-per-node=N); world size is {group.size()}")
    return group
