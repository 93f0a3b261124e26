// The product of a few feature rows with a weight stored as a table of output rows, on the CPU:
// out[m, v] = x[m, d] . table[v, d] over d, read in one pass over the table.
//
// Why a kernel of our own: XLA:CPU runs this product (one to a few dozen rows, the table as
// large as a layer's weight or the vocabulary head) well under the machine's bandwidth: its
// matrix-vector dot for one row, YNNPACK's GEMM for two or more, a 2-row step costing ~1.3
// one-row steps (models/tables.py). Decoding reads every weight once per step, so the step's
// floor is the weights' bytes over the bandwidth; this kernel streams each table row once and
// multiplies it with every feature row while it is in registers.
//
// Each output element is the same sequence of fused multiply-adds over d in 16 lanes, then the
// same pairwise sum of the lanes, whatever m is and whichever thread computes it: a row's result
// does not depend on which other rows share the call (a one-token step and a verify forward
// give bit-identical logits for the same position).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;
constexpr int kMaxRows = 8;  // feature rows per pass over the table (accumulators in registers)
constexpr int64_t kChunkRows = 128;  // table rows per unit of work shared among threads
constexpr int64_t kMinParallelBytes = 1 << 18;  // smaller tables: one thread (waking costs more)

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float))));
typedef float Vec4 __attribute__((vector_size(4 * sizeof(float))));
typedef float Vec2 __attribute__((vector_size(2 * sizeof(float))));

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));
  return v;
}

inline float LaneSum(Vec a) {  // halves added pairwise: lanes i and i + 8, then i + 4, ...
  const Vec8 a8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 a4 = __builtin_shufflevector(a8, a8, 0, 1, 2, 3) +
                  __builtin_shufflevector(a8, a8, 4, 5, 6, 7);
  const Vec2 a2 = __builtin_shufflevector(a4, a4, 0, 1) + __builtin_shufflevector(a4, a4, 2, 3);
  return a2[0] + a2[1];
}

// Table rows [n, n + NB) against M feature rows from x; out rows are v apart. Each table chunk
// is loaded once for M rows and each feature chunk once for NB table rows (loads, not flops,
// bound the few-row product once the table is in flight).
template <int M, int NB>
inline void Tile(const float* x, const float* table, float* out, int64_t d, int64_t v,
                 int64_t n) {
  const int64_t body = d - d % kLanes;
  const float* w = table + n * d;
  Vec acc[M][NB] = {};
  for (int64_t k = 0; k < body; k += kLanes) {
    Vec wk[NB];
    for (int b = 0; b < NB; ++b) wk[b] = Load(w + b * d + k);
    for (int j = 0; j < M; ++j) {
      const Vec xk = Load(x + j * d + k);
      for (int b = 0; b < NB; ++b) acc[j][b] += wk[b] * xk;
    }
  }
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < NB; ++b) {
      float tail = 0.0f;
      for (int64_t k = body; k < d; ++k) tail += w[b * d + k] * x[j * d + k];
      out[j * v + n + b] = LaneSum(acc[j][b]) + tail;
    }
}

template <int M>
void Block(const float* x, const float* table, float* out, int64_t d, int64_t v, int64_t n0,
           int64_t n1) {
  constexpr int kNB = M <= 4 ? 4 : 3;  // M x NB accumulators within the 32 vector registers
  int64_t n = n0;
  for (; n + kNB <= n1; n += kNB) Tile<M, kNB>(x, table, out, d, v, n);
  for (; n < n1; ++n) Tile<M, 1>(x, table, out, d, v, n);
}

void Rows(const float* x, const float* table, float* out, int64_t m, int64_t d, int64_t v,
          int64_t n0, int64_t n1) {
  for (int64_t j0 = 0; j0 < m; j0 += kMaxRows) {
    const float* xj = x + j0 * d;
    float* oj = out + j0 * v;
    switch (std::min<int64_t>(m - j0, kMaxRows)) {
      case 1: Block<1>(xj, table, oj, d, v, n0, n1); break;
      case 2: Block<2>(xj, table, oj, d, v, n0, n1); break;
      case 3: Block<3>(xj, table, oj, d, v, n0, n1); break;
      case 4: Block<4>(xj, table, oj, d, v, n0, n1); break;
      case 5: Block<5>(xj, table, oj, d, v, n0, n1); break;
      case 6: Block<6>(xj, table, oj, d, v, n0, n1); break;
      case 7: Block<7>(xj, table, oj, d, v, n0, n1); break;
      default: Block<8>(xj, table, oj, d, v, n0, n1); break;
    }
  }
}

// The caller works too: more helpers than the other cores would take turns on them.
int64_t Cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Chunks of table rows taken in turn by the calling thread and by tasks on XLA's intra-op pool.
// The caller takes chunks too, so the call finishes even when no pool thread is free; state is
// shared so that a task starting after the call returned finds no chunk left and touches nothing
// else.
struct Shared {
  const float* x;
  const float* table;
  float* out;
  int64_t m, d, v, chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
      Rows(x, table, out, m, d, v, c * kChunkRows, std::min(v, (c + 1) * kChunkRows));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error RowsDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> table,
                   ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), td = table.dimensions();
  if (xd.size() != 2 || td.size() != 2 || xd[1] != td[1])
    return ffi::Error::InvalidArgument("rows_dot takes x [m, d] and table [v, d]");
  const int64_t m = xd[0], d = xd[1], v = td[0];
  auto shared = std::make_shared<Shared>();
  shared->x = x.typed_data();
  shared->table = table.typed_data();
  shared->out = out->typed_data();
  shared->m = m;
  shared->d = d;
  shared->v = v;
  shared->chunks = (v + kChunkRows - 1) / kChunkRows;
  const int64_t helpers = v * d * static_cast<int64_t>(sizeof(float)) < kMinParallelBytes
                              ? 0
                              : std::min<int64_t>({pool.num_threads(), Cores() - 1, shared->chunks - 1});
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([shared] { shared->Work(); });
  shared->Work();
  while (shared->done.load(std::memory_order_acquire) < shared->chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpeculaxRowsDot, RowsDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
