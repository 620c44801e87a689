"""The communicator cache's bookkeeping, with the library replaced by a recorder: sized at the first
call, grown (M doubling) outside capture only, buffers a CUDA graph holds kept until close (also
through the eager path), torch's NCCL communicator preferred, the group's timeout, reserve and
workspace_bytes, close and status by group name, and the log line of each creation."""

import contextlib
import logging
import operator

import pytest
import torch

import tpfuse
from tpfuse import _communicators

TORCH_COMM = 0x1234


class RecordingLibrary:
    """Stands in for _library.Library: records calls, hands out communicator handles 1, 2, ..."""

    def __init__(self):
        self.calls = []
        self.handles = 0

    def call(self, name, *args):
        self.calls.append((name, args))
        if name == "tpfuse_communicator_create":
            self.handles += 1
            args[-1]._obj.value = self.handles  # the byref(c_void_p) out-argument
        if name == "tpfuse_communicator_workspace_bytes":
            args[-1]._obj.value = 1000 * args[0]

    @property
    def functions(self):
        """The C functions as the eager path calls them: each records its call and succeeds."""
        return {"tpfuse_gemm_reduce_scatter": lambda *args: self.call("tpfuse_gemm_reduce_scatter", *args) or 0}

    def launched_with(self):
        return [args[0] for name, args in self.calls if name == "tpfuse_gemm_reduce_scatter"]

    def names(self):
        return [name for name, _ in self.calls]

    def created(self):
        return [args[:3] for name, args in self.calls if name == "tpfuse_communicator_create"]

    def destroyed(self):
        return [args[0] for name, args in self.calls if name == "tpfuse_communicator_destroy"]


@pytest.fixture
def library(monkeypatch):
    recorder = RecordingLibrary()
    monkeypatch.setattr(_communicators, "library", lambda: recorder)
    monkeypatch.setattr(_communicators, "torch_nccl_comm", lambda group, device: TORCH_COMM)
    monkeypatch.setattr(_communicators, "rendezvous", lambda group, device, timeout_s, what: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    yield recorder
    _communicators._communicators.clear()  # no stand-in handle outlives the test
    _communicators._by_name.clear()


@pytest.fixture
def capturing(monkeypatch):
    state = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["on"])
    return state


DEVICE = torch.device("cuda", 0)


def test_sized_at_first_use_then_grown_with_m_doubling(group, library, capturing):
    comm = _communicators.GroupCommunicator(group, DEVICE)
    assert comm.uses_torch_comm and comm.nccl_comm == TORCH_COMM
    assert comm.reserve(64, 48) == 1
    assert comm.reserve(32, 48) == 1 and comm.reserve(64, 16) == 1
    assert comm.reserve(100, 48) == 2   # M doubles: 128
    assert comm.reserve(128, 64) == 3   # N grows to what is asked
    assert library.created() == [(TORCH_COMM, 64, 48), (TORCH_COMM, 128, 48), (TORCH_COMM, 128, 64)]
    assert library.destroyed() == [1, 2]
    comm.close()
    assert library.destroyed() == [1, 2, 3]


def test_no_growth_inside_capture_and_captured_buffers_outlive_growth(group, library, capturing):
    comm = _communicators.GroupCommunicator(group, DEVICE)
    comm.reserve(64, 48)
    capturing["on"] = True
    assert comm.reserve(64, 48) == 1  # captured into a graph
    with pytest.raises(tpfuse.InvalidArgumentError, match="cannot grow during CUDA graph capture"):
        comm.reserve(65, 48)
    capturing["on"] = False
    assert comm.reserve(256, 48) == 2
    assert library.destroyed() == []  # the graph may replay with communicator 1
    assert comm.reserve(512, 48) == 3
    assert library.destroyed() == [2]  # 2 was never captured
    comm.close()
    assert sorted(library.destroyed()) == [1, 2, 3]


def test_cache_per_group_and_device_made_outside_capture_only(group, library, capturing):
    capturing["on"] = True
    with pytest.raises(tpfuse.InvalidArgumentError, match="cannot be inside CUDA graph capture"):
        _communicators.communicator(group, DEVICE)
    capturing["on"] = False
    comm = _communicators.communicator(group, DEVICE)
    assert _communicators.communicator(group, DEVICE) is comm
    assert _communicators.communicator(group, torch.device("cuda", 1)) is not comm
    comm.reserve(8, 8)
    _communicators.close(group)
    assert library.destroyed() == [1]
    assert _communicators.communicator(group, DEVICE) is not comm
    _communicators.close()


def test_own_nccl_communicator_where_torch_gives_none(group, library, capturing, monkeypatch):
    monkeypatch.setattr(_communicators, "torch_nccl_comm", lambda group, device: None)
    made = []

    class OwnNccl:
        def __init__(self, group, device):
            self.handle = 0x5678
            made.append(self)

        def destroy(self):
            made.remove(self)

    monkeypatch.setattr(_communicators, "NcclCommunicator", OwnNccl)
    comm = _communicators.GroupCommunicator(group, DEVICE)
    assert not comm.uses_torch_comm and comm.nccl_comm == 0x5678
    comm.reserve(16, 16)
    assert library.created() == [(0x5678, 16, 16)]
    comm.close()
    assert library.destroyed() == [1] and made == []


def test_status_asks_every_communicator(group, library, capturing):
    comm = _communicators.GroupCommunicator(group, DEVICE)
    comm.reserve(8, 8)
    capturing["on"] = True
    comm.reserve(8, 8)
    capturing["on"] = False
    comm.reserve(64, 8)
    comm.status()
    assert [args[0] for name, args in library.calls if name == "tpfuse_communicator_status"] == [2, 1]
    comm.close()


def test_all_gather_calls_grow_k_and_keep_m_and_n(group, library, capturing):
    comm = _communicators.GroupCommunicator(group, DEVICE)
    assert comm.reserve(64, 48) == 1                  # a reduce-scatter call: no all-gather workspace
    assert comm.reserve(64, 16, 32) == 2              # the first all-gather call adds it
    assert comm.reserve(32, 48, 16) == 2              # within every maximum
    capturing["on"] = True
    with pytest.raises(tpfuse.InvalidArgumentError, match="64 x 48 x 32 this group's communicator has"):
        comm.reserve(64, 48, 64)
    capturing["on"] = False
    created = [args[:4] for name, args in library.calls if name == "tpfuse_communicator_create"]
    assert created == [(TORCH_COMM, 64, 48, 0), (TORCH_COMM, 64, 48, 32)]
    comm.close()


def test_the_timeout_is_the_groups_own_and_reaches_the_library(group, library, capturing):
    comm = _communicators.GroupCommunicator(group, DEVICE)
    assert comm.timeout_s == _communicators.group_timeout_s(group) > 0
    comm.reserve(8, 8)
    assert [args[4] for name, args in library.calls if name == "tpfuse_communicator_create"] == [comm.timeout_s]
    comm.close()


def test_reserve_sizes_ahead_logs_once_and_counts_bytes(group, library, capturing, caplog):
    with caplog.at_level(logging.INFO, logger="tpfuse"):
        comm = _communicators.reserve(group, DEVICE, 1024, 512, 256, 30.0)
    assert library.created() == [(TORCH_COMM, 1024, 512)]
    assert [args[3:5] for name, args in library.calls if name == "tpfuse_communicator_create"] == [(256, 30.0)]
    assert [record.getMessage() for record in caplog.records] == [
        f"tpfuse: made the workspace of group {group.group_name!r} on cuda:0: 0.0 MiB for M <= 1024, N <= 512, "
        "K <= 256 (peer timeout 30 s)"]
    assert comm.reserve(1024, 512, 256) == 1  # no growth
    assert tpfuse.workspace_bytes(group) == tpfuse.workspace_bytes(group.group_name) == 1000
    _communicators.reserve(group, DEVICE, 0, 0, 0, 60.0)  # a new timeout: made again, sizes kept
    assert library.created()[-1] == (TORCH_COMM, 1024, 512) and comm.timeout_s == 60.0
    with pytest.raises(tpfuse.InvalidArgumentError, match="max_m = 6 must be a non-negative multiple of 4"):
        _communicators.reserve(group, DEVICE, 6, 8, 0, None)
    with pytest.raises(tpfuse.InvalidArgumentError, match="timeout = -1 must be a positive"):
        _communicators.reserve(group, DEVICE, 8, 8, 0, -1)
    tpfuse.close(group.group_name)
    assert tpfuse.workspace_bytes() == 0


def test_close_and_status_take_group_names(group, library, capturing):
    comm = _communicators.communicator(group, DEVICE)
    comm.reserve(8, 8)
    tpfuse.status(group.group_name)
    assert [args[0] for name, args in library.calls if name == "tpfuse_communicator_status"] == [1]
    with pytest.raises(tpfuse.InvalidArgumentError, match="group = 'no-such-group' names no process group"):
        tpfuse.close("no-such-group")
    tpfuse.close(group.group_name)
    assert library.destroyed() == [1]
    assert _communicators._communicators == {} and _communicators._by_name == {}


def test_an_eager_call_after_capture_keeps_the_captured_buffers_through_growth(group, library, capturing,
                                                                              monkeypatch):
    """Capture, an eager call of the same size, then growth: the graph's buffers must outlive the growth
    (freeing them would make the graph's replays write into freed memory)."""
    from tpfuse import _ops
    monkeypatch.setattr(_ops, "library", lambda: library)
    # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(_ops, "check_placement", lambda *named, scales=(): None)
    monkeypatch.setattr(_ops, "_capturing", lambda: capturing["on"])
    monkeypatch.setattr(_ops, "_current_stream", lambda index: 0)
    monkeypatch.setattr(_ops, "_current_device", lambda: None)  # the CPU tensors' device index
    monkeypatch.setattr(_ops, "_on_eager_device", operator.attrgetter("is_cpu"))
    a, w = torch.zeros(64, 16, dtype=torch.bfloat16), torch.zeros(48, 16, dtype=torch.bfloat16)
    assert _ops.eager_allowed(a, w, None)

    tpfuse.gemm_reduce_scatter(a, w, group)            # makes communicator 1
    capturing["on"] = True
    tpfuse.gemm_reduce_scatter(a, w, group)            # captured into a graph
    capturing["on"] = False
    tpfuse.gemm_reduce_scatter(a, w, group)            # eager, the same size
    big = torch.zeros(256, 16, dtype=torch.bfloat16)
    tpfuse.gemm_reduce_scatter(big, w, group)          # grows: communicator 2
    assert library.launched_with() == [1, 1, 1, 2]
    # comm, m, n, k, world_size, weight_layout, dtype (TPFUSE_DTYPE_BF16), batch, pointers and the stream
    assert [args[6] for name, args in library.calls if name == "tpfuse_gemm_reduce_scatter"] == [0, 0, 0, 0]
    assert library.destroyed() == []                   # the graph may replay with communicator 1
    tpfuse.gemm_reduce_scatter(torch.zeros(1024, 16, dtype=torch.bfloat16), w, group)
    assert library.destroyed() == [2]                  # 2 was never captured
    tpfuse.close(group)
    assert sorted(library.destroyed()) == [1, 2, 3]


def test_the_eager_path_passes_fp8_codes_and_scales(group, library, capturing, monkeypatch):
    """FP8 through the eager path: the C function gets E4M3's dtype, the scaling (tensorwise, rowwise, blockwise)
    and accumulation codes and the scales' pointers; the checked problem is remembered per shape, scales' shapes
    and use_fast_accum."""
    from tpfuse import _checks, _ops
    monkeypatch.setattr(_ops, "library", lambda: library)
    monkeypatch.setattr(_ops, "_capturing", lambda: False)
    monkeypatch.setattr(_ops, "_current_stream", lambda index: 0)
    monkeypatch.setattr(_ops, "_current_device", lambda: None)
    monkeypatch.setattr(_ops, "_on_eager_device", operator.attrgetter("is_cpu"))
    monkeypatch.setattr(_checks, "_problems", {})
    fp8 = torch.float8_e4m3fn
    a, w = torch.zeros(64, 32, dtype=fp8), torch.zeros(48, 32, dtype=fp8)
    rowwise, tensorwise = (torch.ones(64, 1), torch.ones(1, 48)), (torch.ones(()), torch.ones(1))
    blockwise = (torch.ones(64, 2), torch.ones(1, 2))  # for K/P = 256
    for scales, use_fast_accum, k in ((rowwise, True, 32), (rowwise, True, 32), (tensorwise, False, 32),
                                      (blockwise, False, 256)):
        out = tpfuse.gemm_reduce_scatter(a.new_zeros(64, k), w.new_zeros(48, k), group, a_scale=scales[0],
                                         w_scale=scales[1], use_fast_accum=use_fast_accum)
        assert out.shape == (64 // group.size(), 48) and out.dtype == torch.bfloat16
    launches = [args for name, args in library.calls if name == "tpfuse_gemm_reduce_scatter"]
    # comm, m, n, k, world_size, weight_layout, dtype, scaling, accumulation, batch, a, w, a_scale, w_scale, ...
    assert [args[6:10] + args[12:14] for args in launches] == [
        (1, 2, 1, 1, rowwise[0].data_ptr(), rowwise[1].data_ptr())] * 2 + [
        (1, 1, 0, 1, tensorwise[0].data_ptr(), tensorwise[1].data_ptr()),
        (1, 3, 0, 1, blockwise[0].data_ptr(), blockwise[1].data_ptr())]
    assert len(_checks._problems) == 3
    with pytest.raises(tpfuse.InvalidArgumentError, match="they need w_scale"):
        tpfuse.gemm_reduce_scatter(a, w, group, a_scale=rowwise[0])
    tpfuse.close(group)


def test_a_rank_that_never_comes_ends_the_meeting_with_peer_timeout(group, monkeypatch):
    waited = []

    class Work:
        def wait(self, timeout):
            waited.append(timeout.total_seconds())
            raise RuntimeError("Work ran for 2000 milliseconds before timing out")

    monkeypatch.setattr(torch, "zeros", lambda *shape, device=None: None)
    monkeypatch.setattr(_communicators.dist, "all_reduce", lambda tensor, group, async_op: Work())
    with pytest.raises(tpfuse.PeerTimeoutError, match=r"making tpfuse's communicator: not every rank of group "
                                                      r"'.*' arrived within 2 s .*2000 milliseconds"):
        _communicators.rendezvous(group, DEVICE, 2.0, "making tpfuse's communicator")
    assert waited == [2.0]


def test_the_groups_timeout_is_its_backends_option(monkeypatch):
    import datetime

    class Group:
        def _get_backend(self, device):
            return type("Backend", (), {"options": type("Options", (), {"_timeout": datetime.timedelta(seconds=90)})})

    assert _communicators.group_timeout_s(Group()) == 90.0
    assert _communicators.group_timeout_s(object()) > 0  # no backend: torch's default for NCCL


def test_check_is_status_and_takes_names(group, library, capturing):
    comm = _communicators.communicator(group, DEVICE)
    comm.reserve(8, 8)
    tpfuse.check(group.group_name)
    tpfuse.check()
    assert [args[0] for name, args in library.calls if name == "tpfuse_communicator_status"] == [1, 1]
    tpfuse.close()
