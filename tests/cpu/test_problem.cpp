// validate(), validate_operand(), the to_string()s of Status and Problem, and the rows of
// sequences (ops/sequence_rows.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/sequence_rows.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {
namespace {

// The docs/SPEC.md's 16 shapes: M x (N, K total), K split over P ranks.
std::vector<Problem> sweep(int world_size) {
  const int64_t ms[] = {512, 2048, 8192, 32768};
  const int64_t nk[][2] = {{8192, 8192}, {8192, 28672}, {6144, 6144}, {6144, 16384}};
  std::vector<Problem> out;
  for (int64_t m : ms)
    for (const auto& p : nk) out.push_back(Problem{m, p[0], p[1] / world_size, world_size});
  return out;
}

void expect_invalid(const Problem& p, const std::string& must_contain) {
  const Status s = validate(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << p.to_string();
  EXPECT_NE(s.message().find(must_contain), std::string::npos)
      << "message \"" << s.message() << "\" lacks \"" << must_contain << "\"";
}

TEST(Validate, SweepShapesPass) {
  for (int world_size : {1, 2, 4, 8}) {
    for (const Problem& p : sweep(world_size)) {
      for (WeightLayout layout : {WeightLayout::kKxN, WeightLayout::kNxK}) {
        Problem q = p;
        q.weight_layout = layout;
        const Status s = validate(q);
        EXPECT_TRUE(s.ok()) << q.to_string() << ": " << s.to_string();
      }
    }
  }
}

TEST(Validate, OddShapesPass) {
  // Any m divisible by P (rows per rank need not be a multiple of 8 or of a tile), n and k multiples of 8.
  const Problem good[] = {
      Problem{512, 8192, 1024, 8},  // 64 rows per rank
      Problem{8, 8, 8, 8},          // one row per rank
      Problem{24, 8, 8, 8},         // 3 rows per rank
      Problem{1000, 1000, 1000, 8}, // 125 rows per rank
      Problem{1, 8, 8, 1},
      Problem{6, 264, 136, 2},
      Problem{12, 520, 24, 4},
      Problem{int64_t(1) << 30, 8, 8, 8},
      Problem{2147483647, 8, 8, 1},  // INT32_MAX itself is allowed
  };
  for (const Problem& p : good) {
    const Status s = validate(p);
    EXPECT_TRUE(s.ok()) << p.to_string() << ": " << s.to_string();
  }
}

TEST(Validate, WorldSizeOutOfRange) {
  for (int world_size : {0, -1, 9, 16}) {
    expect_invalid(Problem{64, 64, 64, world_size}, "world_size = " + std::to_string(world_size));
  }
}

TEST(Validate, NonPositiveExtents) {
  expect_invalid(Problem{0, 64, 64, 1}, "problem.m = 0");
  expect_invalid(Problem{-8, 64, 64, 1}, "problem.m = -8");
  expect_invalid(Problem{64, 0, 64, 1}, "problem.n = 0");
  expect_invalid(Problem{64, -16, 64, 1}, "problem.n = -16");
  expect_invalid(Problem{64, 64, 0, 1}, "problem.k_per_rank = 0");
  expect_invalid(Problem{64, 64, -8, 1}, "problem.k_per_rank = -8");
}

TEST(Validate, ExtentsBeyond32BitIndices) {
  const int64_t big = int64_t(1) << 31;  // INT32_MAX + 1, a multiple of 8 and of every P
  expect_invalid(Problem{big, 64, 64, 8}, "problem.m = 2147483648");
  expect_invalid(Problem{64, big, 64, 8}, "problem.n = 2147483648");
  expect_invalid(Problem{64, 64, big, 8}, "problem.k_per_rank = 2147483648");
  expect_invalid(Problem{64, 64, big, 8}, "32-bit");
}

TEST(Validate, MNotDivisibleByWorldSize) {
  const Status s = validate(Problem{1000, 64, 64, 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "problem.m = 1000 is not divisible by world_size = 3");
  expect_invalid(Problem{516, 64, 64, 8}, "problem.m = 516");
  expect_invalid(Problem{2, 64, 64, 4}, "problem.m = 2");
}

TEST(Validate, RowsNotWhole16Bytes) {
  expect_invalid(Problem{64, 100, 64, 8}, "problem.n = 100");
  expect_invalid(Problem{64, 4, 64, 8}, "problem.n = 4");
  expect_invalid(Problem{64, 64, 1001, 8}, "problem.k_per_rank = 1001");
  expect_invalid(Problem{64, 64, 12, 8}, "multiple of 8");
}

TEST(Validate, BadWeightLayout) {
  expect_invalid(Problem{64, 64, 64, 8, static_cast<WeightLayout>(7)}, "weight_layout");
}

// Only the dtypes the compiled variants take pass; the message names the field (and the
// all-gather's problem says the same).
TEST(Validate, UnsupportedDType) {
  EXPECT_TRUE(validate(Problem{64, 64, 64, 8, WeightLayout::kNxK, DType::kBF16}).ok());
  const Status s = validate(Problem{64, 64, 64, 8, WeightLayout::kNxK, static_cast<DType>(7)});
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("problem.dtype = 7"), std::string::npos) << s.message();
  const Status g = validate(AllGatherProblem{64, 64, 64, 8, WeightLayout::kNxK, static_cast<DType>(7)});
  EXPECT_EQ(g.code(), StatusCode::kUnsupported);
  EXPECT_NE(g.message().find("problem.dtype = 7"), std::string::npos) << g.message();
}

// E4M3 (one byte an element) takes a scaling and an N x K weight, BF16 none; rows are whole 16-byte
// units of the dtype; the all-gather's problem by the same rules, naming its own fields.
TEST(Validate, E4M3TakesScalesAndAKMajorWeight) {
  EXPECT_EQ(element_bytes(DType::kE4M3), 1);
  EXPECT_EQ(element_bytes(DType::kBF16), 2);
  EXPECT_STREQ(to_string(DType::kE4M3), "E4M3");
  const auto e4m3 = [](int64_t n, int64_t k, WeightLayout layout, Scaling scaling) {
    Problem p{64, n, k, 8, layout, DType::kE4M3};
    p.scaling = scaling;
    return p;
  };
  for (const Scaling scaling : {Scaling::kTensorwise, Scaling::kRowwise}) {
    EXPECT_TRUE(validate(e4m3(64, 128, WeightLayout::kNxK, scaling)).ok()) << to_string(scaling);
    const Status kxn = validate(e4m3(64, 128, WeightLayout::kKxN, scaling));
    EXPECT_EQ(kxn.code(), StatusCode::kUnsupported);
    EXPECT_NE(kxn.message().find("FP8 takes an N x K weight"), std::string::npos) << kxn.message();
  }
  // 16 bytes a row: K in 16 E4M3 elements, where BF16 takes 8; N counts the BF16 output's columns.
  const Status k40 = validate(e4m3(64, 40, WeightLayout::kNxK, Scaling::kRowwise));
  EXPECT_EQ(k40.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k40.message().find("k_per_rank = 40 is not a multiple of 16 (E4M3 rows must be multiples of 16 bytes)"),
            std::string::npos)
      << k40.message();
  EXPECT_TRUE(validate(e4m3(24, 128, WeightLayout::kNxK, Scaling::kRowwise)).ok());
  const Status n12 = validate(e4m3(12, 128, WeightLayout::kNxK, Scaling::kRowwise));
  EXPECT_EQ(n12.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(n12.message().find("n = 12 is not a multiple of 8 (BF16 rows"), std::string::npos) << n12.message();
  const Status unscaled = validate(e4m3(64, 128, WeightLayout::kNxK, Scaling::kNone));
  EXPECT_EQ(unscaled.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unscaled.message().find("needs a scaling"), std::string::npos) << unscaled.message();
  Problem scaled_bf16{64, 64, 64, 8, WeightLayout::kNxK, DType::kBF16};
  scaled_bf16.scaling = Scaling::kTensorwise;
  const Status bf16 = validate(scaled_bf16);
  EXPECT_EQ(bf16.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bf16.message().find("scales are for E4M3 inputs"), std::string::npos) << bf16.message();
  Problem bad_accumulation = e4m3(64, 128, WeightLayout::kNxK, Scaling::kRowwise);
  bad_accumulation.accumulation = static_cast<Accumulation>(7);
  EXPECT_EQ(validate(bad_accumulation).code(), StatusCode::kInvalidArgument);

  // The all-gather's problem, by the same rules, naming its own fields.
  AllGatherProblem gathered{64, 64, 128, 8, WeightLayout::kNxK, DType::kE4M3};
  gathered.scaling = Scaling::kRowwise;
  EXPECT_TRUE(validate(gathered).ok()) << validate(gathered).message();
  gathered.k = 40;
  const Status g40 = validate(gathered);
  EXPECT_EQ(g40.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g40.message().find("problem.k = 40 is not a multiple of 16"), std::string::npos) << g40.message();
  gathered.k = 128;
  gathered.weight_layout = WeightLayout::kKxN;
  EXPECT_EQ(validate(gathered).code(), StatusCode::kUnsupported) << validate(gathered).message();

  const std::string printed = e4m3(64, 128, WeightLayout::kNxK, Scaling::kRowwise).to_string();
  EXPECT_NE(printed.find("dtype=E4M3 scaling=rowwise accumulation=promoted"), std::string::npos) << printed;
}

// Blockwise scales: E4M3 promoted, K per rank in whole 128-blocks of the scales (the message names
// k_per_rank; the all-gather's, k); fast accumulation refused; an unknown scaling names every Scaling.
TEST(Validate, BlockwiseScales) {
  const auto blockwise = [](int64_t k_per_rank, Accumulation accumulation) {
    Problem p{64, 256, k_per_rank, 8, WeightLayout::kNxK, DType::kE4M3};
    p.scaling = Scaling::kBlockwise;
    p.accumulation = accumulation;
    return p;
  };
  EXPECT_STREQ(to_string(Scaling::kBlockwise), "blockwise");
  EXPECT_EQ(kScaleBlock, 128);
  for (const int64_t k : {128, 256, 3584}) {
    EXPECT_TRUE(validate(blockwise(k, Accumulation::kPromoted)).ok()) << k;
  }
  const Status fast = validate(blockwise(256, Accumulation::kFast));
  EXPECT_EQ(fast.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fast.message().find("problem.accumulation = fast with blockwise scaling"), std::string::npos)
      << fast.message();
  for (const int64_t k : {16, 64, 192, 1040}) {  // multiples of 16 (E4M3 rows), not of 128
    const Status s = validate(blockwise(k, Accumulation::kPromoted));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << k;
    EXPECT_NE(s.message().find("problem.k_per_rank = " + std::to_string(k) + " is not a multiple of 128"),
              std::string::npos)
        << s.message();
  }
  Problem kxn = blockwise(256, Accumulation::kPromoted);
  kxn.weight_layout = WeightLayout::kKxN;
  EXPECT_EQ(validate(kxn).code(), StatusCode::kUnsupported) << validate(kxn).message();
  Problem bf16{64, 256, 256, 8, WeightLayout::kNxK, DType::kBF16};
  bf16.scaling = Scaling::kBlockwise;
  EXPECT_NE(validate(bf16).message().find("scales are for E4M3 inputs"), std::string::npos) << validate(bf16).message();
  const std::string printed = blockwise(256, Accumulation::kPromoted).to_string();
  EXPECT_NE(printed.find("dtype=E4M3 scaling=blockwise accumulation=promoted"), std::string::npos) << printed;

  AllGatherProblem gathered{64, 256, 256, 8, WeightLayout::kNxK, DType::kE4M3};
  gathered.scaling = Scaling::kBlockwise;
  EXPECT_TRUE(validate(gathered).ok()) << validate(gathered).message();
  gathered.k = 192;  // an invalid problem is named as such first, in the all-gather's fields
  const Status k192 = validate(gathered);
  EXPECT_EQ(k192.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k192.message().find("problem.k = 192 is not a multiple of 128"), std::string::npos) << k192.message();

  Problem unknown = blockwise(256, Accumulation::kPromoted);
  unknown.scaling = static_cast<Scaling>(9);
  const Status s = validate(unknown);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("problem.scaling = 9 is not a Scaling (kNone, kTensorwise, kRowwise or kBlockwise)"),
            std::string::npos)
      << s.message();
  unknown.scaling = Scaling::kNone;
  EXPECT_NE(validate(unknown).message().find("needs a scaling (kTensorwise, kRowwise or kBlockwise), not kNone"),
            std::string::npos)
      << validate(unknown).message();
}

// Rows in sequences: the batch divides m, each sequence divides over the ranks, and with several
// sequences a shard is whole 64-row slabs (else kUnsupported, naming the shard); one rank takes
// any batch. The all-gather's problem checks the same.
TEST(Validate, Sequences) {
  const auto with_batch = [](Problem p, int64_t batch) {
    p.batch = batch;
    return p;
  };
  for (const auto& [m, p, batch] : {std::tuple{8192, 8, 4}, std::tuple{1024, 8, 2}, std::tuple{3072, 8, 2},
                                    std::tuple{512, 2, 4}, std::tuple{96, 1, 3}, std::tuple{1000, 8, 1}}) {
    const Status s = validate(with_batch(Problem{m, 64, 64, p}, batch));
    EXPECT_TRUE(s.ok()) << m << " rows, P " << p << ", batch " << batch << ": " << s.to_string();
  }
  expect_invalid(with_batch(Problem{1024, 64, 64, 8}, 0), "problem.batch = 0");
  expect_invalid(with_batch(Problem{1024, 64, 64, 8}, 2048), "problem.batch = 2048");
  expect_invalid(with_batch(Problem{1024, 64, 64, 8}, 3), "does not divide problem.m = 1024");
  expect_invalid(with_batch(Problem{1024, 64, 64, 8}, 256), "a sequence of 4 rows");
  for (const auto& [m, p, batch, shard] :
       {std::tuple{2 * 4 * 96, 4, 2, 96}, std::tuple{4 * 8 * 32, 8, 4, 32}, std::tuple{2 * 2 * 100, 2, 2, 100}}) {
    const Status s = validate(with_batch(Problem{m, 64, 64, p}, batch));
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
    EXPECT_NE(s.message().find("is " + std::to_string(shard) + " rows"), std::string::npos) << s.message();
  }
  AllGatherProblem gather{2 * 4 * 96, 64, 64, 4};
  gather.batch = 2;
  EXPECT_EQ(validate(gather).code(), StatusCode::kUnsupported);
  gather.batch = 5;
  EXPECT_EQ(validate(gather).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(with_batch(Problem{1024, 64, 64, 8}, 2).to_string(),
            "m=1024 n=64 k_per_rank=64 world_size=8 weight_layout=NxK dtype=BF16 batch=2");
}

// SequenceRows: owner d's segment row i * shard + j is row i * s + d * shard + j of the full rows, a
// bijection onto them; one sequence is the plain split.
TEST(SequenceRowsTest, MapsEverySegmentRowOnceInSequenceOrder) {
  for (const auto& [p, batch, shard] :
       {std::tuple{8, 4, 128}, std::tuple{2, 3, 64}, std::tuple{4, 1, 100}, std::tuple{1, 5, 64}}) {
    const int64_t s = int64_t(p) * shard, segment_rows = int64_t(batch) * shard;
    const SequenceRows rows(batch, segment_rows, p);
    EXPECT_EQ(rows.batched(), batch > 1);
    EXPECT_EQ(rows.shard_rows(), shard);
    std::vector<int> hits(size_t(batch) * s, 0);
    for (int d = 0; d < p; ++d) {
      for (int r = 0; r < segment_rows; ++r) {
        const int row = rows.row_of(d, r);
        const int sequence = r / shard, j = r % shard;
        ASSERT_EQ(rows.sequence_of(r), sequence);
        ASSERT_EQ(row, sequence * s + d * shard + j) << "owner " << d << ", segment row " << r;
        if (batch == 1) ASSERT_EQ(row, d * segment_rows + r);
        ++hits[size_t(row)];
      }
    }
    for (size_t row = 0; row < hits.size(); ++row) ASSERT_EQ(hits[row], 1) << "row " << row;
  }
}

TEST(ValidateOperand, NullAndMisaligned) {
  alignas(16) static unsigned char buffer[64];
  EXPECT_TRUE(validate_operand(buffer, "a").ok());
  EXPECT_TRUE(validate_operand(buffer + 16, "a").ok());

  Status s = validate_operand(nullptr, "a");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "a must not be null");

  for (int offset : {1, 2, 8, 15}) {
    s = validate_operand(buffer + offset, "w");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << offset;
    EXPECT_EQ(s.message().rfind("w = 0x", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("is not 16-byte aligned"), std::string::npos) << s.message();
  }
}

TEST(ValidateOperand, MessageShowsTheAddress) {
  const Status s = validate_operand(reinterpret_cast<const void*>(uintptr_t(0x1008)), "c");
  EXPECT_EQ(s.message(), "c = 0x1008 is not 16-byte aligned");
}

TEST(StatusTest, ToString) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().to_string(), "ok");
  EXPECT_EQ(Status::InvalidArgument("x is bad").to_string(), "invalid argument: x is bad");
  EXPECT_EQ(Status(StatusCode::kPeerTimeout, "rank 3").to_string(), "peer timeout: rank 3");
  const StatusCode codes[] = {StatusCode::kOk,         StatusCode::kInvalidArgument, StatusCode::kUnsupported,
                              StatusCode::kCudaError,  StatusCode::kNcclError,       StatusCode::kPeerTimeout,
                              StatusCode::kInternal};
  for (StatusCode c : codes) EXPECT_STRNE(to_string(c), "unknown status");
}

TEST(StatusTest, ReturnIfErrorPropagates) {
  auto inner = [](bool fail) { return fail ? Status::Internal("boom") : Status::Ok(); };
  auto outer = [&](bool fail) -> Status {
    TPFUSE_RETURN_IF_ERROR(inner(fail));
    return Status::Unsupported("reached the end");
  };
  EXPECT_EQ(outer(true).code(), StatusCode::kInternal);
  EXPECT_EQ(outer(false).code(), StatusCode::kUnsupported);
}

TEST(ProblemTest, ToStringAndDerived) {
  const Problem p{8192, 6144, 2048, 8, WeightLayout::kKxN};
  EXPECT_EQ(p.to_string(), "m=8192 n=6144 k_per_rank=2048 world_size=8 weight_layout=KxN dtype=BF16");
  EXPECT_EQ(p.rows_per_rank(), 1024);
  EXPECT_DOUBLE_EQ(p.flops_per_rank(), 2.0 * 8192 * 6144 * 2048);
  EXPECT_STREQ(to_string(WeightLayout::kNxK), "NxK");
}

}  // namespace
}  // namespace tpfuse
