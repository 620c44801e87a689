"""CPU tests: no GPU, no communicator. A fake process group (torch's, for tracing tests) of
WORLD_SIZE ranks gives the ops their group; nothing is ever launched."""

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

WORLD_SIZE = 4


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    yield dist.group.WORLD
    dist.destroy_process_group()
