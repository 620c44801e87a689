"""Bad arguments raise InvalidArgumentError with a message naming them, before anything is launched:
the communicator and the library are replaced by stand-ins that fail the test if reached."""

import re

import pytest
import torch

import tpfuse
from tpfuse import _checks, _library, _ops

BF16 = torch.bfloat16
M, N, K = 64, 48, 32  # this rank: a is M x K/P, w is N x K/P (nk) or K/P x N (kn); M divides by 4
BK = 256  # a K (or K/P) of two 128-blocks, for blockwise scales


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def launched(*args, **kwargs):
        raise AssertionError("reached the communicator or the library: the arguments were not checked first")

    monkeypatch.setattr(_ops, "communicator", launched)
    monkeypatch.setattr(_ops, "library", launched)


def cpu(*shape, dtype=BF16):
    return torch.randn(*shape).to(dtype)


def misaligned(*shape):
    """A contiguous BF16 tensor whose data starts 2 bytes past a 16-byte boundary."""
    count = 1
    for extent in shape:
        count *= extent
    return torch.empty(count + 1, dtype=BF16)[1:].view(*shape)


CASES = {
    # name: (a, w, keyword arguments, what the message says)
    "a_dtype": (lambda: cpu(M, K, dtype=torch.float16), lambda: cpu(N, K), {}, "a has dtype torch.float16"),
    "w_dtype": (lambda: cpu(M, K), lambda: cpu(N, K, dtype=torch.float32), {}, "w has dtype torch.float32"),
    "out_dtype": (lambda: cpu(M, K), lambda: cpu(N, K), {"out": lambda: cpu(M // 4, N, dtype=torch.float32)},
                  "out has dtype torch.float32"),
    "a_3d": (lambda: cpu(2, M, K), lambda: cpu(N, K), {}, "a has 3 dimensions"),
    "layout_name": (lambda: cpu(M, K), lambda: cpu(N, K), {"weight_layout": "NxK"}, "weight_layout = 'NxK' must be"),
    "layout_mismatch": (lambda: cpu(M, K), lambda: cpu(K, N), {"weight_layout": "nk"},
                        "is not N x K/P (nn.Linear's weight)"),
    "a_non_contiguous": (lambda: cpu(M, 2 * K)[:, ::2], lambda: cpu(N, K), {}, "is not contiguous"),
    "w_non_contiguous": (lambda: cpu(M, K), lambda: cpu(N, K).t(), {"weight_layout": "kn"},
                         "pass the weight itself with weight_layout='nk'"),
    "m_does_not_divide": (lambda: cpu(M + 2, K), lambda: cpu(N, K), {}, "M = 66 rows of a do not divide"),
    "n_not_multiple_of_8": (lambda: cpu(M, K), lambda: cpu(N + 4, K), {}, "N = 52 is not a multiple of 8"),
    "k_not_multiple_of_8": (lambda: cpu(M, K + 4), lambda: cpu(N, K + 4), {}, "K/P = 36 is not a multiple of 8"),
    "out_shape": (lambda: cpu(M, K), lambda: cpu(N, K), {"out": lambda: cpu(M, N)}, "this rank's rows are 16 x 48"),
    "a_misaligned": (lambda: misaligned(M, K), lambda: cpu(N, K), {}, "a's data at 0x"),
    "w_misaligned": (lambda: cpu(M, K), lambda: misaligned(N, K), {}, "is not 16-byte aligned"),
    "device": (lambda: cpu(M, K), lambda: cpu(N, K), {}, "a is on cpu; tpfuse runs on CUDA devices"),
    "bias_dtype": (lambda: cpu(M, K), lambda: cpu(N, K), {"bias": lambda: cpu(N, dtype=torch.float32)},
                   "bias has dtype torch.float32"),
    "bias_shape": (lambda: cpu(M, K), lambda: cpu(N, K), {"bias": lambda: cpu(1, N)},
                   "bias has shape (1, 48); it must be (48,), one entry per output column (N)"),
    "bias_non_contiguous": (lambda: cpu(M, K), lambda: cpu(N, K), {"bias": lambda: cpu(2 * N)[::2]},
                            "bias with strides (2,) is not contiguous"),
    "bias_misaligned": (lambda: cpu(M, K), lambda: cpu(N, K), {"bias": lambda: misaligned(N)}, "bias's data at 0x"),
    "batch_zero": (lambda: cpu(M, K), lambda: cpu(N, K), {"batch": 0}, "batch = 0 must be an integer of 1 or more"),
    "batch_not_int": (lambda: cpu(M, K), lambda: cpu(N, K), {"batch": 2.0}, "batch = 2.0 must be an integer"),
    "batch_does_not_divide": (lambda: cpu(M, K), lambda: cpu(N, K), {"batch": 3},
                              "batch = 3: the M = 64 rows of a are not 3 sequences of equal length"),
    "sequence_does_not_divide": (lambda: cpu(M, K), lambda: cpu(N, K), {"batch": 32},
                                 "batch = 32: each sequence has 2 rows, which do not divide over the group's 4 ranks"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_argument_raises_before_launch(group, case):
    make_a, make_w, keywords, message = CASES[case]
    keywords = {key: value() if callable(value) else value for key, value in keywords.items()}
    with pytest.raises(tpfuse.InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tpfuse.gemm_reduce_scatter(make_a(), make_w(), group, **keywords)


DROP_IN_CASES = {
    # name: (A, B, reduce_op, scatter_dim, what the message says)
    "reduce_op": (lambda: cpu(8, K), lambda: cpu(K, N), "avg", 0, "reduce_op = 'avg': tpfuse reduces with 'sum'"),
    "scatter_dim_last": (lambda: cpu(8, 4, K), lambda: cpu(K, N), "sum", 2,
                         "scatter_dim = 2: tpfuse splits A \\(8, 4, 32\\) along one of its dimensions before the "
                         "last \\(0 to 1\\)"),
    "scatter_dim_negative": (lambda: cpu(8, 4, K), lambda: cpu(K, N), "sum", -2, "scatter_dim = -2: tpfuse splits A"),
    "dim_1_does_not_divide": (lambda: cpu(2, 6, K), lambda: cpu(K, N), "sum", 1, "A.shape\\[1\\] = 6 does not divide"),
    "a_1d": (lambda: cpu(K), lambda: cpu(K, N), "sum", 0, "must have 2 or more dimensions"),
    "dim_0_does_not_divide": (lambda: cpu(6, 4, K), lambda: cpu(K, N), "sum", 0, "A.shape\\[0\\] = 6 does not divide"),
    "a_non_contiguous": (lambda: cpu(3, 8, K).transpose(0, 1), lambda: cpu(K, N), "sum", 0, "is not contiguous"),
    "b_strided": (lambda: cpu(8, K), lambda: cpu(K, 2 * N)[:, ::2], "sum", 0, "is neither a contiguous K x N"),
    "b_dtype": (lambda: cpu(8, K), lambda: cpu(N, K, dtype=torch.float32).t(), "sum", 0, "w has dtype torch.float32"),
    "device": (lambda: cpu(8, 3, K), lambda: cpu(N, K).t(), "sum", 0, "is on cpu"),
}


@pytest.mark.parametrize("case", DROP_IN_CASES)
def test_drop_in_bad_argument_raises_before_launch(group, case):
    make_a, make_b, reduce_op, scatter_dim, message = DROP_IN_CASES[case]
    with pytest.raises(tpfuse.InvalidArgumentError, match=message):
        tpfuse.fused_matmul_reduce_scatter(make_a(), make_b(), reduce_op, scatter_dim, group.group_name)


ALL_GATHER_CASES = {
    # name: (x, w, keyword arguments, what the message says); x is M/P x K, w N/P x K (nk) or K x N/P (kn)
    "x_dtype": (lambda: cpu(M, K, dtype=torch.float16), lambda: cpu(N, K), {}, "x has dtype torch.float16"),
    "w_3d": (lambda: cpu(M, K), lambda: cpu(2, N, K), {}, "w has 3 dimensions"),
    "layout_name": (lambda: cpu(M, K), lambda: cpu(N, K), {"weight_layout": "kxn"},
                    "weight_layout = 'kxn' must be 'nk' \\(w is N/P x K"),
    "layout_mismatch": (lambda: cpu(M, K), lambda: cpu(K, N), {"weight_layout": "nk"},
                        "is not N/P x K \\(nn.Linear's weight\\) for x \\(64, 32\\) \\(M/P x K\\): its K is 48"),
    "x_non_contiguous": (lambda: cpu(M, 2 * K)[:, ::2], lambda: cpu(N, K), {}, "x .* is not contiguous"),
    "n_not_multiple_of_8": (lambda: cpu(M, K), lambda: cpu(N + 4, K), {}, "N/P = 52 is not a multiple of 8"),
    "k_not_multiple_of_8": (lambda: cpu(M, K + 4), lambda: cpu(N, K + 4), {}, "K = 36 is not a multiple of 8"),
    "x_misaligned": (lambda: misaligned(M, K), lambda: cpu(N, K), {}, "x's data at 0x"),
    "device": (lambda: cpu(M, K), lambda: cpu(N, K), {}, "x is on cpu; tpfuse runs on CUDA devices"),
    "bias_dtype": (lambda: cpu(M, K), lambda: cpu(N, K), {"bias": cpu(N).half()}, "bias has dtype torch.float16"),
    "bias_shape": (lambda: cpu(M, K), lambda: cpu(N, K), {"bias": cpu(4 * N)},
                   "bias has shape \\(192,\\); it must be \\(48,\\), one entry per output column \\(N/P\\)"),
    "bias_misaligned": (lambda: cpu(M, K), lambda: cpu(N, K), {"bias": misaligned(N)}, "bias's data at 0x"),
    "batch_negative": (lambda: cpu(M, K), lambda: cpu(N, K), {"batch": -1},
                       "batch = -1 must be an integer of 1 or more"),
    "batch_does_not_divide": (lambda: cpu(M, K), lambda: cpu(N, K), {"batch": 3},
                              "batch = 3: x's 64 rows are not 3 shards of equal length"),
}


@pytest.mark.parametrize("case", ALL_GATHER_CASES)
@pytest.mark.parametrize("return_gathered", [False, True])
def test_all_gather_bad_argument_raises_before_launch(group, case, return_gathered):
    make_x, make_w, keywords, message = ALL_GATHER_CASES[case]
    with pytest.raises(tpfuse.InvalidArgumentError, match=message):
        tpfuse.all_gather_gemm(make_x(), make_w(), group, return_gathered=return_gathered, **keywords)


AG_DROP_IN_CASES = {
    # name: (A, Bs, gather_dim, what the message says)
    "gather_dim_last": (lambda: cpu(8, 3, K), lambda: [cpu(K, N)], 2, "gather_dim = 2: tpfuse splits A"),
    "a_1d": (lambda: cpu(K), lambda: [cpu(K, N)], 0, "must have 2 or more dimensions"),
    "a_non_contiguous": (lambda: cpu(3, 8, K).transpose(0, 1), lambda: [cpu(K, N)], 0, "is not contiguous"),
    "no_weights": (lambda: cpu(8, K), lambda: [], 0, "Bs is empty"),
    "b_strided": (lambda: cpu(8, K), lambda: [cpu(K, N), cpu(K, 2 * N)[:, ::2]], 0,
                  "Bs\\[1\\] \\(32, 48\\) .* is neither a contiguous K x N"),
    "b_mismatch": (lambda: cpu(8, K), lambda: [cpu(N, 2 * K).t()], 0, "its K is 64, x's is 32"),
    "device": (lambda: cpu(8, 3, K), lambda: [cpu(N, K).t()], 0, "is on cpu"),
}


@pytest.mark.parametrize("case", AG_DROP_IN_CASES)
def test_all_gather_drop_in_bad_argument_raises_before_launch(group, case):
    make_a, make_bs, gather_dim, message = AG_DROP_IN_CASES[case]
    with pytest.raises(tpfuse.InvalidArgumentError, match=message):
        tpfuse.fused_all_gather_matmul(make_a(), make_bs(), gather_dim, group.group_name)


def test_group_larger_than_a_node_is_refused(monkeypatch, group):
    monkeypatch.setattr(_ops, "_group_size", lambda group_name: 16)
    with pytest.raises(tpfuse.InvalidArgumentError, match="the group has 16 ranks; tpfuse supports 1 to 8"):
        tpfuse.gemm_reduce_scatter(cpu(M, K), cpu(N, K), group)


def test_group_of_one_takes_any_batch():
    # At P = 1 every batch is the plain product: no slab rule.
    problem = _checks.check_problem(cpu(6, K), cpu(N, K), "nk", 1, batch=3)
    assert (problem.m, problem.batch, problem.rows_per_rank) == (6, 3, 6)
    assert _checks.check_all_gather_problem(cpu(6, K), cpu(N, K), "nk", 1, batch=6).m == 6


SLAB_CASES = {
    # name: (call, the rows of a rank's share of a sequence); P = 4, batch > 1
    "gemm_reduce_scatter": (lambda g: tpfuse.gemm_reduce_scatter(cpu(2 * 96, K), cpu(N, K), g, batch=2), 24),
    "all_gather_gemm": (lambda g: tpfuse.all_gather_gemm(cpu(3 * 32, K), cpu(N, K), g, batch=3), 32),
    "fused_matmul_reduce_scatter": (
        lambda g: tpfuse.fused_matmul_reduce_scatter(cpu(2, 8, K), cpu(N, K).t(), "sum", 1, g.group_name), 2),
    "fused_all_gather_matmul": (
        lambda g: tpfuse.fused_all_gather_matmul(cpu(2, 8, 3, K), [cpu(N, K).t()], 1, g.group_name), 24),
}


FP8 = torch.float8_e4m3fn
F32 = torch.float32


def scale(*shape, dtype=F32):
    return torch.ones(shape, dtype=dtype)


def fp8(*shape, dtype=FP8):
    return cpu(*shape, dtype=dtype)


def on_device(tensor, device):
    """tensor itself on the CPU, else an empty one of its shape and strides on `device` (Tensor.to would make a
    strided scale contiguous)."""
    if device == "cpu":
        return tensor
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)


TENSORWISE = {"a_scale": lambda: scale(), "w_scale": lambda: scale(1)}
ROWWISE = {"a_scale": lambda: scale(M, 1), "w_scale": lambda: scale(1, N)}
FP8_CASES = {
    # name: (a, w, keyword arguments, the error, what the message says); P = 4
    "no_scales": (lambda: fp8(M, K), lambda: fp8(N, K), {}, tpfuse.InvalidArgumentError,
                  "a and w are torch.float8_e4m3fn: they need a_scale and w_scale (torch.float32: one element each for "
                  "tensorwise scaling, a_scale (M, 1) and w_scale (1, N) for rowwise, or a_scale (M, K/P/128) and "
                  "w_scale (ceil(N/128), K/P/128) for blockwise)"),
    "no_w_scale": (lambda: fp8(M, K), lambda: fp8(N, K), {"a_scale": lambda: scale(1)}, tpfuse.InvalidArgumentError,
                   "a and w are torch.float8_e4m3fn: they need w_scale (torch.float32"),
    "no_a_scale": (lambda: fp8(M, K), lambda: fp8(N, K), {"w_scale": lambda: scale(1)}, tpfuse.InvalidArgumentError,
                   "a and w are torch.float8_e4m3fn: they need a_scale (torch.float32"),
    "scales_with_bf16": (lambda: cpu(M, K), lambda: cpu(N, K), TENSORWISE, tpfuse.InvalidArgumentError,
                         "a_scale is given, but a and w are torch.bfloat16: scales are for torch.float8_e4m3fn inputs "
                         "only"),
    "w_scale_with_bf16": (lambda: cpu(M, K), lambda: cpu(N, K), {"w_scale": lambda: scale(1, N)},
                          tpfuse.InvalidArgumentError, "w_scale is given, but a and w are torch.bfloat16"),
    "a_scale_bf16": (lambda: fp8(M, K), lambda: fp8(N, K), {**TENSORWISE, "a_scale": lambda: scale(1, dtype=BF16)},
                     tpfuse.InvalidArgumentError, "a_scale has dtype torch.bfloat16; scales are torch.float32"),
    "w_scale_float64": (lambda: fp8(M, K), lambda: fp8(N, K),
                        {**ROWWISE, "w_scale": lambda: scale(1, N, dtype=torch.float64)}, tpfuse.InvalidArgumentError,
                        "w_scale has dtype torch.float64; scales are torch.float32"),
    "a_scale_non_contiguous": (lambda: fp8(M, K), lambda: fp8(N, K),
                               {**ROWWISE, "a_scale": lambda: scale(M, 2)[:, :1]}, tpfuse.InvalidArgumentError,
                               "a_scale (64, 1) with strides (2, 1) is not contiguous"),
    "a_scale_rows": (lambda: fp8(M, K), lambda: fp8(N, K), {**ROWWISE, "a_scale": lambda: scale(M // 2, 1)},
                     tpfuse.InvalidArgumentError, "a_scale has shape (32, 1); with w_scale of 48 elements it must be "
                     "(64, 1) or (64,), one per row of a (M): rowwise scaling (tensorwise takes one element in each "
                     "of a_scale and w_scale)"),
    "a_scale_transposed": (lambda: fp8(M, K), lambda: fp8(N, K), {**ROWWISE, "a_scale": lambda: scale(1, M)},
                           tpfuse.InvalidArgumentError, "a_scale has shape (1, 64); with w_scale of 48 elements"),
    "a_tensorwise_w_rowwise": (lambda: fp8(M, K), lambda: fp8(N, K), {**ROWWISE, "a_scale": lambda: scale(1)},
                               tpfuse.InvalidArgumentError, "a_scale has shape (1,); with w_scale of 48 elements it "
                               "must be (64, 1) or (64,)"),
    "w_scale_shape": (lambda: fp8(M, K), lambda: fp8(N, K), {**ROWWISE, "w_scale": lambda: scale(2, N // 2)},
                      tpfuse.InvalidArgumentError, "w_scale has shape (2, 24); with a_scale of 64 elements it must be "
                      "(1, 48), (48, 1) or (48,), one per output column (N)"),
    "w_scale_columns": (lambda: fp8(M, K), lambda: fp8(N, K), {**ROWWISE, "w_scale": lambda: scale(1, N + 8)},
                        tpfuse.InvalidArgumentError, "w_scale has shape (1, 56); with a_scale of 64 elements"),
    "e5m2": (lambda: fp8(M, K, dtype=torch.float8_e5m2), lambda: fp8(N, K, dtype=torch.float8_e5m2), TENSORWISE,
             tpfuse.UnsupportedError,
             "a has dtype torch.float8_e5m2: tpfuse's FP8 inputs are torch.float8_e4m3fn only"),
    "e5m2_w": (lambda: fp8(M, K), lambda: fp8(N, K, dtype=torch.float8_e5m2), TENSORWISE, tpfuse.UnsupportedError,
               "w has dtype torch.float8_e5m2: tpfuse's FP8 inputs are torch.float8_e4m3fn only"),
    "e4m3fnuz": (lambda: fp8(M, K, dtype=torch.float8_e4m3fnuz), lambda: fp8(N, K), TENSORWISE, tpfuse.UnsupportedError,
                 "a has dtype torch.float8_e4m3fnuz"),
    "k_by_n_weight": (lambda: fp8(M, K), lambda: fp8(K, N), {**TENSORWISE, "weight_layout": "kn"},
                      tpfuse.UnsupportedError, "w: FP8 weights are N x K/P (nn.Linear's weight) only "
                      "(weight_layout='nk'); weight_layout='kn' is served for torch.bfloat16 inputs"),
    "k_not_multiple_of_16": (lambda: fp8(M, 40), lambda: fp8(N, 40), TENSORWISE, tpfuse.InvalidArgumentError,
                             "K/P = 40 is not a multiple of 16 (FP8 rows must be multiples of 16 bytes)"),
    "n_not_multiple_of_8": (lambda: fp8(M, K), lambda: fp8(N + 4, K), TENSORWISE, tpfuse.InvalidArgumentError,
                            "N = 52 is not a multiple of 8 (BF16 rows must be multiples of 16 bytes)"),
    "a_fp8_w_bf16": (lambda: fp8(M, K), lambda: cpu(N, K), TENSORWISE, tpfuse.InvalidArgumentError,
                     "a has dtype torch.float8_e4m3fn and w torch.bfloat16: both must be torch.bfloat16, or both "
                     "torch.float8_e4m3fn"),
    "a_bf16_w_fp8": (lambda: cpu(M, K), lambda: fp8(N, K), {}, tpfuse.InvalidArgumentError,
                     "a has dtype torch.bfloat16 and w torch.float8_e4m3fn: both must be"),
    "a_float16_w_fp8": (lambda: cpu(M, K, dtype=torch.float16), lambda: fp8(N, K), TENSORWISE,
                        tpfuse.InvalidArgumentError, "a has dtype torch.float16; tpfuse takes torch.bfloat16, or "
                        "torch.float8_e4m3fn with scales (a_scale, w_scale), and returns torch.bfloat16"),
    "fp8_out": (lambda: fp8(M, K), lambda: fp8(N, K), {**TENSORWISE, "out": lambda: fp8(M // 4, N)},
                tpfuse.InvalidArgumentError, "out has dtype torch.float8_e4m3fn; tpfuse returns torch.bfloat16"),
    "fast_accum_not_bool": (lambda: fp8(M, K), lambda: fp8(N, K), {**TENSORWISE, "use_fast_accum": 1},
                            tpfuse.InvalidArgumentError, "use_fast_accum = 1 must be True or False"),
    "wrong_rows": (lambda: fp8(M + 2, K), lambda: fp8(N, K), TENSORWISE, tpfuse.InvalidArgumentError,
                   "M = 66 rows of a do not divide"),
}


@pytest.mark.parametrize("case", FP8_CASES)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_fp8_bad_argument_raises_before_launch(group, case, device):
    """Each bad FP8 argument, named: on CPU tensors through the op's implementation, on meta tensors through its
    fake one (what torch.compile traces)."""
    make_a, make_w, keywords, error, message = FP8_CASES[case]
    keywords = {key: on_device(value(), device) if callable(value) else value for key, value in keywords.items()}
    with pytest.raises(error, match=re.escape(message)):
        tpfuse.gemm_reduce_scatter(on_device(make_a(), device), on_device(make_w(), device), group, **keywords)


@pytest.mark.parametrize("a_scale, w_scale, scaling", [
    ((), (1,), "tensorwise"), ((1, 1), (1, 1), "tensorwise"), ((M, 1), (1, N), "rowwise"), ((M,), (N,), "rowwise"),
    ((M, 1), (N, 1), "rowwise")])
@pytest.mark.parametrize("use_fast_accum", [False, True])
def test_fp8_problem_has_the_c_abis_codes(a_scale, w_scale, scaling, use_fast_accum):
    problem = _checks.check_problem(fp8(M, K), fp8(N, K), "nk", 4, bias=cpu(N), batch=1, a_scale=scale(*a_scale),
                                    w_scale=scale(*w_scale), use_fast_accum=use_fast_accum)
    assert (problem.m, problem.n, problem.k_per_rank, problem.rows_per_rank) == (M, N, K, M // 4)
    assert problem.dtype_code == _library.DTYPE_CODES[FP8] == 1
    assert problem.scaling == _library.SCALING_CODES[scaling]
    assert problem.accumulation == _library.ACCUMULATION_CODES["fast" if use_fast_accum else "promoted"]
    # BF16 inputs ignore use_fast_accum, as the C ABI does.
    bf16 = _checks.check_problem(cpu(M, K), cpu(N, K), "nk", 4, use_fast_accum=use_fast_accum)
    assert (bf16.dtype_code, bf16.scaling, bf16.accumulation) == (0, 0, 0)


def test_fp8_with_one_row_is_rowwise_where_w_scale_is():
    """M = 1: an a_scale of one element is a row's scale when w_scale has one per column."""
    problem = _checks.check_problem(fp8(1, K), fp8(N, K), "nk", 1, a_scale=scale(1, 1), w_scale=scale(1, N))
    assert problem.scaling == _library.SCALING_CODES["rowwise"]


AG_TENSORWISE = {"x_scale": lambda: scale(), "w_scale": lambda: scale(1)}
AG_ROWWISE = {"x_scale": lambda: scale(M, 1), "w_scale": lambda: scale(1, N)}
AG_FP8_CASES = {
    # name: (x, w, keyword arguments, the error, what the message says); x is this rank's M/P = 64 rows, P = 4
    "no_scales": (lambda: fp8(M, K), lambda: fp8(N, K), {}, tpfuse.InvalidArgumentError,
                  "x and w are torch.float8_e4m3fn: they need x_scale and w_scale (torch.float32: one element each for "
                  "tensorwise scaling, x_scale (M/P, 1) and w_scale (1, N/P) for rowwise, or x_scale (M/P, K/128) and "
                  "w_scale (ceil(N/P/128), K/128) for blockwise)"),
    "no_w_scale": (lambda: fp8(M, K), lambda: fp8(N, K), {"x_scale": lambda: scale(1)}, tpfuse.InvalidArgumentError,
                   "x and w are torch.float8_e4m3fn: they need w_scale (torch.float32"),
    "scales_with_bf16": (lambda: cpu(M, K), lambda: cpu(N, K), AG_TENSORWISE, tpfuse.InvalidArgumentError,
                         "x_scale is given, but x and w are torch.bfloat16: scales are for torch.float8_e4m3fn inputs "
                         "only"),
    "x_scale_bf16": (lambda: fp8(M, K), lambda: fp8(N, K), {**AG_TENSORWISE, "x_scale": lambda: scale(1, dtype=BF16)},
                     tpfuse.InvalidArgumentError, "x_scale has dtype torch.bfloat16; scales are torch.float32"),
    "x_scale_non_contiguous": (lambda: fp8(M, K), lambda: fp8(N, K),
                               {**AG_ROWWISE, "x_scale": lambda: scale(M, 2)[:, :1]}, tpfuse.InvalidArgumentError,
                               "x_scale (64, 1) with strides (2, 1) is not contiguous"),
    # Rowwise x_scale is this rank's rows' (the kernel gathers them), not the gathered M's.
    "x_scale_gathered_rows": (lambda: fp8(M, K), lambda: fp8(N, K), {**AG_ROWWISE, "x_scale": lambda: scale(4 * M, 1)},
                              tpfuse.InvalidArgumentError,
                              "x_scale has shape (256, 1); with w_scale of 48 elements it must be (64, 1) or (64,), "
                              "one per row of x (M/P): rowwise scaling (tensorwise takes one element in each of "
                              "x_scale and w_scale)"),
    "x_tensorwise_w_rowwise": (lambda: fp8(M, K), lambda: fp8(N, K), {**AG_ROWWISE, "x_scale": lambda: scale(1)},
                               tpfuse.InvalidArgumentError, "x_scale has shape (1,); with w_scale of 48 elements"),
    "w_scale_shape": (lambda: fp8(M, K), lambda: fp8(N, K), {**AG_ROWWISE, "w_scale": lambda: scale(2, N // 2)},
                      tpfuse.InvalidArgumentError, "w_scale has shape (2, 24); with x_scale of 64 elements it must be "
                      "(1, 48), (48, 1) or (48,), one per output column (N/P)"),
    "w_scale_float64": (lambda: fp8(M, K), lambda: fp8(N, K),
                        {**AG_ROWWISE, "w_scale": lambda: scale(1, N, dtype=torch.float64)},
                        tpfuse.InvalidArgumentError, "w_scale has dtype torch.float64; scales are torch.float32"),
    "e5m2": (lambda: fp8(M, K, dtype=torch.float8_e5m2), lambda: fp8(N, K, dtype=torch.float8_e5m2), AG_TENSORWISE,
             tpfuse.UnsupportedError,
             "x has dtype torch.float8_e5m2: tpfuse's FP8 inputs are torch.float8_e4m3fn only"),
    "e5m2_w": (lambda: fp8(M, K), lambda: fp8(N, K, dtype=torch.float8_e5m2), AG_TENSORWISE, tpfuse.UnsupportedError,
               "w has dtype torch.float8_e5m2: tpfuse's FP8 inputs are torch.float8_e4m3fn only"),
    "e4m3fnuz": (lambda: fp8(M, K, dtype=torch.float8_e4m3fnuz), lambda: fp8(N, K), AG_TENSORWISE,
                 tpfuse.UnsupportedError, "x has dtype torch.float8_e4m3fnuz"),
    "k_by_n_weight": (lambda: fp8(M, K), lambda: fp8(K, N), {**AG_TENSORWISE, "weight_layout": "kn"},
                      tpfuse.UnsupportedError, "w: FP8 weights are N/P x K (nn.Linear's weight) only "
                      "(weight_layout='nk'); weight_layout='kn' is served for torch.bfloat16 inputs"),
    "k_not_multiple_of_16": (lambda: fp8(M, 40), lambda: fp8(N, 40), AG_TENSORWISE, tpfuse.InvalidArgumentError,
                             "K = 40 is not a multiple of 16 (FP8 rows must be multiples of 16 bytes)"),
    "n_not_multiple_of_8": (lambda: fp8(M, K), lambda: fp8(N + 4, K), AG_TENSORWISE, tpfuse.InvalidArgumentError,
                            "N/P = 52 is not a multiple of 8"),
    "x_fp8_w_bf16": (lambda: fp8(M, K), lambda: cpu(N, K), AG_TENSORWISE, tpfuse.InvalidArgumentError,
                     "x has dtype torch.float8_e4m3fn and w torch.bfloat16: both must be torch.bfloat16, or both "
                     "torch.float8_e4m3fn"),
    "x_float16_w_fp8": (lambda: cpu(M, K, dtype=torch.float16), lambda: fp8(N, K), AG_TENSORWISE,
                        tpfuse.InvalidArgumentError, "x has dtype torch.float16; tpfuse takes torch.bfloat16, or "
                        "torch.float8_e4m3fn with scales (x_scale, w_scale), and returns torch.bfloat16"),
    "fast_accum_not_bool": (lambda: fp8(M, K), lambda: fp8(N, K), {**AG_TENSORWISE, "use_fast_accum": 1},
                            tpfuse.InvalidArgumentError, "use_fast_accum = 1 must be True or False"),
    "bias_dtype": (lambda: fp8(M, K), lambda: fp8(N, K), {**AG_TENSORWISE, "bias": lambda: scale(N)},
                   tpfuse.InvalidArgumentError, "bias has dtype torch.float32; tpfuse takes torch.bfloat16"),
}


@pytest.mark.parametrize("case", AG_FP8_CASES)
@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("return_gathered", [False, True])
def test_all_gather_fp8_bad_argument_raises_before_launch(group, case, device, return_gathered):
    """Each bad FP8 argument of the all-gather, named, through the op's implementation (CPU) and its fake one
    (meta)."""
    make_x, make_w, keywords, error, message = AG_FP8_CASES[case]
    keywords = {key: on_device(value(), device) if callable(value) else value for key, value in keywords.items()}
    with pytest.raises(error, match=re.escape(message)):
        tpfuse.all_gather_gemm(on_device(make_x(), device), on_device(make_w(), device), group,
                               return_gathered=return_gathered, **keywords)


@pytest.mark.parametrize("x_scale, w_scale, scaling", [
    ((), (1,), "tensorwise"), ((1, 1), (1, 1), "tensorwise"), ((M, 1), (1, N), "rowwise"), ((M,), (N,), "rowwise"),
    ((M, 1), (N, 1), "rowwise")])
@pytest.mark.parametrize("use_fast_accum", [False, True])
def test_all_gather_fp8_problem_has_the_c_abis_codes(x_scale, w_scale, scaling, use_fast_accum):
    problem = _checks.check_all_gather_problem(fp8(M, K), fp8(N, K), "nk", 4, bias=cpu(N), x_scale=scale(*x_scale),
                                               w_scale=scale(*w_scale), use_fast_accum=use_fast_accum)
    assert (problem.m, problem.n_per_rank, problem.k) == (4 * M, N, K)
    assert problem.dtype_code == _library.DTYPE_CODES[FP8] == 1
    assert problem.scaling == _library.SCALING_CODES[scaling]
    assert problem.accumulation == _library.ACCUMULATION_CODES["fast" if use_fast_accum else "promoted"]
    bf16 = _checks.check_all_gather_problem(cpu(M, K), cpu(N, K), "nk", 4, use_fast_accum=use_fast_accum)
    assert (bf16.dtype_code, bf16.scaling, bf16.accumulation) == (0, 0, 0)


QUANTIZE_CASES = {
    # name: (x, w, keyword arguments, the error, what the message says); the rest is all_gather_gemm's checks
    "x_fp8": (lambda: fp8(M, K), lambda: fp8(N, K), {"w_scale": lambda: scale(1, N)}, tpfuse.InvalidArgumentError,
              "x has dtype torch.float8_e4m3fn; quantize_all_gather_gemm quantizes torch.bfloat16 rows to "
              "torch.float8_e4m3fn (for FP8 x, call tpfuse.all_gather_gemm with x_scale)"),
    "x_3d": (lambda: cpu(2, M, K), lambda: fp8(N, K), {"w_scale": lambda: scale(1, N)}, tpfuse.InvalidArgumentError,
             "x has 3 dimensions (2, 64, 32); it must be a matrix"),
    "w_bf16": (lambda: cpu(M, K), lambda: cpu(N, K), {"w_scale": lambda: scale(1, N)}, tpfuse.InvalidArgumentError,
               "x has dtype torch.float8_e4m3fn and w torch.bfloat16"),
    "w_scale_tensorwise": (lambda: cpu(M, K), lambda: fp8(N, K), {"w_scale": lambda: scale(1)},
                           tpfuse.InvalidArgumentError,
                           "w_scale has shape (1,); with rowwise x_scale (64, 1) it must be (1, 48), (48, 1) or (48,), "
                           "one per output column (N/P)"),
    "k_not_multiple_of_16": (lambda: cpu(M, 40), lambda: fp8(N, 40), {"w_scale": lambda: scale(1, N)},
                             tpfuse.InvalidArgumentError, "K = 40 is not a multiple of 16"),
    "w_e5m2": (lambda: cpu(M, K), lambda: fp8(N, K, dtype=torch.float8_e5m2), {"w_scale": lambda: scale(1, N)},
               tpfuse.UnsupportedError, "w has dtype torch.float8_e5m2"),
    "scaling_unknown": (lambda: cpu(M, K), lambda: fp8(N, K), {"w_scale": lambda: scale(1), "scaling": "tensorwise"},
                        tpfuse.InvalidArgumentError, "scaling = 'tensorwise' must be 'rowwise' (one power-of-2 scale "
                        "per row, torchao's recipe) or 'blockwise' (one scale per 1 x 128 tile, DeepSeek-V3's)"),
    # The form decides what w_scale must be, whatever else its shape could be.
    "rowwise_blockwise_w_scale": (lambda: cpu(M, BK), lambda: fp8(N, BK), {"w_scale": lambda: scale(1, 2)},
                                  tpfuse.InvalidArgumentError, "w_scale has shape (1, 2); with rowwise x_scale (64, 1) "
                                  "it must be (1, 48), (48, 1) or (48,)"),
    "blockwise_rowwise_w_scale": (lambda: cpu(M, BK), lambda: fp8(N, BK),
                                  {"w_scale": lambda: scale(1, N), "scaling": "blockwise"}, tpfuse.InvalidArgumentError,
                                  "w_scale has shape (1, 48); with x_scale (64, 2) (blockwise: one per row of x and "
                                  "128 of K) it must be (1, 2), one per 128 x 128 block of w (ceil(N/P/128) x K/128)"),
    "blockwise_one_k_block_rowwise_w_scale": (lambda: cpu(M, 128), lambda: fp8(N, 128),
                                              {"w_scale": lambda: scale(N, 1), "scaling": "blockwise"},
                                              tpfuse.InvalidArgumentError,
                                              "w_scale has shape (48, 1); with x_scale (64, 1) (blockwise"),
    "blockwise_w_scale_column_major": (lambda: cpu(M, BK), lambda: fp8(256, BK),
                                       {"w_scale": lambda: scale(2, 2).t(), "scaling": "blockwise"},
                                       tpfuse.InvalidArgumentError,
                                       "w_scale (2, 2) with strides (1, 2) is not contiguous"),
    "blockwise_k_not_multiple_of_128": (lambda: cpu(M, 192), lambda: fp8(N, 192),
                                        {"w_scale": lambda: scale(1, 2), "scaling": "blockwise"},
                                        tpfuse.InvalidArgumentError, "K = 192 is not a multiple of 128"),
    "blockwise_fast_accum": (lambda: cpu(M, BK), lambda: fp8(N, BK),
                             {"w_scale": lambda: scale(1, 2), "scaling": "blockwise", "use_fast_accum": True},
                             tpfuse.InvalidArgumentError, "use_fast_accum=True with blockwise scales"),
}


@pytest.mark.parametrize("case", QUANTIZE_CASES)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_quantize_all_gather_bad_argument_raises_before_launch(group, case, device):
    make_x, make_w, keywords, error, message = QUANTIZE_CASES[case]
    keywords = {key: on_device(value(), device) if callable(value) else value for key, value in keywords.items()}
    with pytest.raises(error, match=re.escape(message)):
        tpfuse.quantize_all_gather_gemm(make_x().to(device), make_w().to(device), group, **keywords)


def test_fp8_drop_ins_take_bf16_only(group):
    """The BF16 drop-ins' schemas have no scales: FP8 goes through gemm_reduce_scatter and all_gather_gemm."""
    with pytest.raises(tpfuse.InvalidArgumentError, match=re.escape(
            "A has dtype torch.float8_e4m3fn: fused_matmul_reduce_scatter multiplies torch.bfloat16 matrices; for "
            "torch.float8_e4m3fn inputs call tpfuse.gemm_reduce_scatter with a_scale and w_scale")):
        tpfuse.fused_matmul_reduce_scatter(fp8(8, K), fp8(N, K).t(), "sum", 0, group.group_name)
    with pytest.raises(tpfuse.InvalidArgumentError, match=re.escape(
            "Bs[0] has dtype torch.float8_e4m3fn: fused_all_gather_matmul multiplies torch.bfloat16 matrices; for "
            "torch.float8_e4m3fn inputs call tpfuse.all_gather_gemm with x_scale and w_scale")):
        tpfuse.fused_all_gather_matmul(cpu(8, K), [fp8(N, K).t()], 0, group.group_name)


# --- Blockwise scales: a_scale (M, K/P/128), w_scale (ceil(N/128), K/P/128); the all-gather's x_scale (M/P, K/128),
# w_scale (ceil(N/P/128), K/128) ---


@pytest.mark.parametrize("m, n, k, a_scale, w_scale, scaling", [
    # K/P/128 = 1: (M, 1) is a_scale of both forms; w_scale tells them apart (ceil(N/128) rows, or one per column)
    (M, N, 128, (M, 1), (1, 1), "blockwise"), (M, N, 128, (M, 1), (1, N), "rowwise"),
    (M, N, 128, (M, 1), (N, 1), "rowwise"),
    (M, N, BK, (M, 2), (1, 2), "blockwise"), (M, 256, BK, (M, 2), (2, 2), "blockwise"),
    (M, 200, 384, (M, 3), (2, 3), "blockwise"),  # N not a multiple of 128: w's last block is partial
    # K/P/128 = N: w_scale (1, N) is of both forms; a_scale tells them apart
    (M, 8, 1024, (M, 8), (1, 8), "blockwise"), (M, 8, 1024, (M, 1), (1, 8), "rowwise"),
    (1, N, 128, (1, 1), (1, 1), "tensorwise"),  # every scale one element: tensorwise
])
@pytest.mark.parametrize("op", ["reduce-scatter", "all-gather"])
def test_blockwise_is_told_apart_by_the_pair_of_shapes(m, n, k, a_scale, w_scale, scaling, op):
    """The same rule in both ops, m the rows of a (the reduce-scatter's M, the all-gather's M/P), n w's rows."""
    if op == "reduce-scatter":
        problem = _checks.check_problem(fp8(m, k), fp8(n, k), "nk", 1 if m == 1 else 4, a_scale=scale(*a_scale),
                                        w_scale=scale(*w_scale))
    else:
        problem = _checks.check_all_gather_problem(fp8(m, k), fp8(n, k), "nk", 4, x_scale=scale(*a_scale),
                                                   w_scale=scale(*w_scale))
    assert problem.scaling == _library.SCALING_CODES[scaling]
    assert problem.accumulation == _library.ACCUMULATION_CODES["promoted"] and problem.dtype_code == 1


BLOCKWISE = {"a_scale": lambda: scale(M, 2), "w_scale": lambda: scale(1, 2)}
BLOCKWISE_CASES = {
    # name: (a, w, keyword arguments, what the message says); K/P = BK unless a and w say otherwise, P = 4
    "w_scale_rowwise": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "w_scale": lambda: scale(1, N)},
                        "w_scale has shape (1, 48); with a_scale (64, 2) (blockwise: one per row of a and 128 of K/P) "
                        "it must be (1, 2), one per 128 x 128 block of w (ceil(N/128) x K/P/128)"),
    "w_scale_rows": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "w_scale": lambda: scale(2, 2)},
                     "w_scale has shape (2, 2); with a_scale (64, 2) (blockwise"),
    "w_scale_transposed": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "w_scale": lambda: scale(2, 1)},
                           "w_scale has shape (2, 1); with a_scale (64, 2) (blockwise"),
    "a_scale_columns": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "a_scale": lambda: scale(M, 3)},
                        "a_scale has shape (64, 3); with w_scale (1, 2) (blockwise: one per 128 x 128 block of w) it "
                        "must be (64, 2), one per row of a (M) and 128 of K/P"),
    "a_scale_rowwise": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "a_scale": lambda: scale(M, 1)},
                        "a_scale has shape (64, 1); with w_scale (1, 2) (blockwise"),
    "a_scale_transposed": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "a_scale": lambda: scale(2, M)},
                           "a_scale has shape (2, 64); with w_scale (1, 2) (blockwise"),
    # torch._scaled_mm's blockwise a scale is column-major; tpfuse's are row-major
    "a_scale_column_major": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "a_scale": lambda: scale(2, M).t()},
                             "a_scale (64, 2) with strides (1, 64) is not contiguous"),
    "w_scale_column_major": (lambda: fp8(M, BK), lambda: fp8(256, BK),
                             {**BLOCKWISE, "w_scale": lambda: scale(2, 2).t()},
                             "w_scale (2, 2) with strides (1, 2) is not contiguous"),
    "a_scale_float64": (lambda: fp8(M, BK), lambda: fp8(N, BK),
                        {**BLOCKWISE, "a_scale": lambda: scale(M, 2, dtype=torch.float64)},
                        "a_scale has dtype torch.float64; scales are torch.float32"),
    "w_scale_bf16": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "w_scale": lambda: scale(1, 2, dtype=BF16)},
                     "w_scale has dtype torch.bfloat16; scales are torch.float32"),
    "k_not_multiple_of_128": (lambda: fp8(M, 192), lambda: fp8(N, 192), BLOCKWISE,
                              "K/P = 192 is not a multiple of 128: blockwise scales (a_scale (M, K/P/128), w_scale "
                              "(ceil(N/128), K/P/128)) cover 128 of K/P each"),
    "k_below_128": (lambda: fp8(M, 64), lambda: fp8(N, 64), {"a_scale": lambda: scale(M, 1),
                                                             "w_scale": lambda: scale(1, 1)},
                    "K/P = 64 is not a multiple of 128"),
    "fast_accum": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**BLOCKWISE, "use_fast_accum": True},
                   "use_fast_accum=True with blockwise scales: they apply where each 128 of K/P is added into the FP32 "
                   "sums (promoted accumulation), so use_fast_accum must be False"),
}


@pytest.mark.parametrize("case", BLOCKWISE_CASES)
@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("with_out", [False, True])
def test_blockwise_bad_argument_raises_before_launch(group, case, device, with_out):
    """Each bad blockwise argument, named (InvalidArgumentError): through the op (CPU), its fake implementation
    (meta) and the out= op."""
    make_a, make_w, keywords, message = BLOCKWISE_CASES[case]
    keywords = {key: on_device(value(), device) if callable(value) else value for key, value in keywords.items()}
    out = torch.empty(M // group.size(), make_w().shape[0], dtype=BF16, device=device) if with_out else None
    with pytest.raises(tpfuse.InvalidArgumentError, match=re.escape(message)):
        tpfuse.gemm_reduce_scatter(on_device(make_a(), device), on_device(make_w(), device), group, out=out,
                                   **keywords)


AG_BLOCKWISE = {"x_scale": lambda: scale(M, 2), "w_scale": lambda: scale(1, 2)}
AG_BLOCKWISE_CASES = {
    # name: (x, w, keyword arguments, what the message says); x is this rank's M/P = 64 rows, K = BK, P = 4
    "w_scale_rowwise": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**AG_BLOCKWISE, "w_scale": lambda: scale(1, N)},
                        "w_scale has shape (1, 48); with x_scale (64, 2) (blockwise: one per row of x and 128 of K) it "
                        "must be (1, 2), one per 128 x 128 block of w (ceil(N/P/128) x K/128)"),
    "w_scale_rows": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**AG_BLOCKWISE, "w_scale": lambda: scale(2, 2)},
                     "w_scale has shape (2, 2); with x_scale (64, 2) (blockwise"),
    "x_scale_columns": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**AG_BLOCKWISE, "x_scale": lambda: scale(M, 3)},
                        "x_scale has shape (64, 3); with w_scale (1, 2) (blockwise: one per 128 x 128 block of w) it "
                        "must be (64, 2), one per row of x (M/P) and 128 of K"),
    # x_scale is this rank's rows' (the kernel gathers them), not the gathered M's.
    "x_scale_gathered_rows": (lambda: fp8(M, BK), lambda: fp8(N, BK),
                              {**AG_BLOCKWISE, "x_scale": lambda: scale(4 * M, 2)},
                              "x_scale has shape (256, 2); with w_scale (1, 2) (blockwise"),
    "x_scale_column_major": (lambda: fp8(M, BK), lambda: fp8(N, BK),
                             {**AG_BLOCKWISE, "x_scale": lambda: scale(2, M).t()},
                             "x_scale (64, 2) with strides (1, 64) is not contiguous"),
    "w_scale_bf16": (lambda: fp8(M, BK), lambda: fp8(N, BK),
                     {**AG_BLOCKWISE, "w_scale": lambda: scale(1, 2, dtype=BF16)},
                     "w_scale has dtype torch.bfloat16; scales are torch.float32"),
    "k_not_multiple_of_128": (lambda: fp8(M, 192), lambda: fp8(N, 192), AG_BLOCKWISE,
                              "K = 192 is not a multiple of 128: blockwise scales (x_scale (M/P, K/128), w_scale "
                              "(ceil(N/P/128), K/128)) cover 128 of K each"),
    "fast_accum": (lambda: fp8(M, BK), lambda: fp8(N, BK), {**AG_BLOCKWISE, "use_fast_accum": True},
                   "use_fast_accum=True with blockwise scales: they apply where each 128 of K is added into the FP32 "
                   "sums (promoted accumulation), so use_fast_accum must be False"),
}


@pytest.mark.parametrize("case", AG_BLOCKWISE_CASES)
@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("return_gathered", [False, True])
def test_all_gather_blockwise_bad_argument_raises_before_launch(group, case, device, return_gathered):
    """Each bad blockwise argument of the all-gather, named (InvalidArgumentError): through both ops (CPU) and
    their fake implementations (meta)."""
    make_x, make_w, keywords, message = AG_BLOCKWISE_CASES[case]
    keywords = {key: on_device(value(), device) if callable(value) else value for key, value in keywords.items()}
    with pytest.raises(tpfuse.InvalidArgumentError, match=re.escape(message)):
        tpfuse.all_gather_gemm(on_device(make_x(), device), on_device(make_w(), device), group,
                               return_gathered=return_gathered, **keywords)


def test_all_gather_blockwise_problem_has_the_c_abis_codes():
    """x_scale (M/P, K/128) with w_scale (ceil(N/P/128), K/128), N/P = 200 a partial block: TPFUSE_SCALING_BLOCKWISE,
    promoted. With one row per rank, K = 128 and N/P at most 128 the scales are one element each, tensorwise by
    their shapes; quantize_all_gather_gemm's form (its x_scale is one per row) decides instead."""
    problem = _checks.check_all_gather_problem(fp8(M, 384), fp8(200, 384), "nk", 4, bias=cpu(200), batch=1,
                                               x_scale=scale(M, 3), w_scale=scale(2, 3))
    assert (problem.m, problem.n_per_rank, problem.k) == (4 * M, 200, 384)
    assert (problem.dtype_code, problem.scaling, problem.accumulation) == (1, 3, 0)
    one_row = (fp8(1, 128), fp8(N, 128), "nk", 4)
    assert _checks.check_all_gather_problem(*one_row, x_scale=scale(1, 1), w_scale=scale(1, 1)).scaling == 1
    assert _checks.check_all_gather_problem(*one_row, x_scale=scale(1, 1), w_scale=scale(1, 1),
                                            form=_library.SCALING_CODES["blockwise"]).scaling == 3
    assert _checks.check_all_gather_problem(*one_row, x_scale=scale(1, 1), w_scale=scale(1, N),
                                            form=_library.SCALING_CODES["rowwise"]).scaling == 2


@pytest.mark.parametrize("case", SLAB_CASES)
def test_batched_shard_of_whole_slabs_only(group, case):
    """With batch > 1 on more than one rank, the kernels need each rank's rows of a sequence in whole
    slabs of 64: valid, but unsupported, before anything is launched."""
    call, shard_rows = SLAB_CASES[case]
    with pytest.raises(tpfuse.UnsupportedError, match=f"each rank's share of a sequence is {shard_rows} rows; with "
                                                      "batch > 1 tpfuse needs a multiple of 64 rows"):
        call(group)
