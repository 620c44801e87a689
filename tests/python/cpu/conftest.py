"""CPU tests: no GPU, no communicator. A fake process group (torch's, for tracing tests) of
WORLD_SIZE ranks gives the ops their group; nothing is ever launched. `groups` gives the simulated
group's tests (simulated_group.py) their groups."""

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

WORLD_SIZE = 4


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def groups():
    """Groups of 1, 2, 4 and 8 ranks of a fake world of 8 (this process is rank 0 of each; the simulation
    gives the threads their ranks)."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield {1: dist.new_group(ranks=[0]), 2: dist.new_group(ranks=[0, 1]), 4: dist.new_group(ranks=[0, 1, 2, 3]),
           8: dist.group.WORLD}
    dist.destroy_process_group()
