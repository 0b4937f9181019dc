// Google Benchmark of the torch-free allocator core on a DeepSeek-V4-sized
// pool: 4,096 SWA slots and 65,536 logical compress blocks (CSA k=32, HCA k=1).
// Each iteration is one operation; the mix holds occupancy steady so the
// figures are per-op costs in a realistic, non-empty state.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "core/slots/coordinator.h"
#include "core/config/sizing.h"

namespace {

constexpr int64_t kSwa = 4096, kBlocks = 65536;

ukv::Coordinator v4_pool() {
  const auto slots = ukv::slot_counts(kSwa, kBlocks, {32, 1}, 128);
  return ukv::Coordinator(kSwa, {{32, slots[0]}, {1, slots[1]}}, 128);
}

// Steady-state compress churn: free a random held block, allocate one.
void BM_CompressAllocFree(benchmark::State& state) {
  const int64_t type = state.range(0);
  auto c = v4_pool();
  std::vector<int64_t> held;
  for (int64_t i = 0; i < kBlocks / 2; ++i) held.push_back(c.alloc_compress(type));
  std::mt19937_64 rng(1);
  for (auto _ : state) {
    const size_t i = rng() % held.size();
    c.free_compress(type, held[i]);
    held[i] = c.alloc_compress(type);
  }
  state.SetItemsProcessed(2 * state.iterations());  // one free + one alloc
}
BENCHMARK(BM_CompressAllocFree)->Arg(0)->Arg(1)->ArgName("type");

// SWA window churn with compress borrowing the released slots: per iteration
// SWA frees its oldest block, compress borrows (evicting it), the oldest
// borrowed block is freed once 64 are out, and SWA allocates again.
void BM_SwaChurnWithBorrowing(benchmark::State& state) {
  auto c = v4_pool();
  std::vector<int64_t> swa;
  for (int64_t i = 0; i < kSwa / 2; ++i) swa.push_back(c.alloc_swa());
  for (int64_t i = 0; i < kBlocks; ++i) c.alloc_compress(0);  // own region full: later allocs borrow
  std::deque<int64_t> borrowed;
  size_t next = 0;
  for (auto _ : state) {
    c.free_swa(swa[next]);
    borrowed.push_back(c.alloc_compress(0));
    if (borrowed.size() > 64) {
      c.free_compress(0, borrowed.front());
      borrowed.pop_front();
    }
    swa[next] = c.alloc_swa();
    next = (next + 1) % swa.size();
    c.take_evicted_swa();
  }
  state.SetItemsProcessed(4 * state.iterations());  // free_swa, alloc_compress, free_compress, alloc_swa
}
BENCHMARK(BM_SwaChurnWithBorrowing);

// The batch pattern of the Python batch API (alloc_compress_n then
// free_compress_many of the same ids) on a half-full pool, per block, so the
// two figures compare like for like.
void BM_CompressBatch(benchmark::State& state) {
  const int64_t type = state.range(0), n = state.range(1);
  auto c = v4_pool();
  for (int64_t i = 0; i < kBlocks / 2; ++i) c.alloc_compress(type);
  for (auto _ : state) {
    const std::vector<int64_t> ids = c.alloc_compress_n(type, n);
    c.free_compress_many(type, ids.data(), ids.size());
  }
  state.SetItemsProcessed(2 * n * state.iterations());  // n allocs + n frees
}
BENCHMARK(BM_CompressBatch)->ArgsProduct({{0, 1}, {16, 64, 256, 1024, 4096}})->ArgNames({"type", "n"});

void BM_JointAdmissionCheck(benchmark::State& state) {
  auto c = v4_pool();
  for (int64_t i = 0; i < kSwa / 2; ++i) c.alloc_swa();
  const std::vector<int64_t> demand = {64, 64};
  for (auto _ : state) benchmark::DoNotOptimize(c.can_allocate_jointly(2, demand));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_JointAdmissionCheck);

}  // namespace
