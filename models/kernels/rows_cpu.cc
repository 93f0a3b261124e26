// The product of a few feature rows with a weight stored as a table of output rows, on the CPU:
// out[m, v] = x[m, d] . table[v, d] over d, read in one pass over the table; x and out float32,
// the table float32, bfloat16 or int8 (each value widened exactly; an int8 table's per-row scale is
// the caller's to apply: models/tables.Q8).
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
// give bit-identical dense outputs for the same features).
//
// Tile sizes follow the vector registers -march=native gives: AVX-512's 32 of 16 lanes, else 8
// lanes in tiles for 16 registers (AVX2's ymm; NEON's 32 of 4 lanes hold them too). AVX-512's
// tiles built for AVX2 spilled: SmolLM2's float32 head at 8 / 32 rows 41 / 148 ms against XLA's
// 7 / 17 (AMD EPYC with AVX2 only, 2 cores, 2026-12-06).
//
// A bfloat16 table on a CPU with AMX (Intel's tile units: built with -march=native where the
// compiler sees them, used once Linux grants the process the tile state) goes to AMX instead:
// each float32 feature is split into two bfloat16 parts (hi + lo: 16 of its 24 mantissa bits),
// and each part meets the table in TDPBF16PS, whose products of two bfloat16 are exact and whose
// sums are float32 (relative error ~3e-6 against float64, the vector path's ~3e-7). Why: from ~8
// feature rows the multiply-adds, not the table's bytes, bound the vector path on a 2-core
// machine (a batch-8 verify of 2 tokens cost 1.47 one-token steps), and AMX does them an order
// of magnitude faster. Each output is again the same sequence of tile operations whatever m is.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__FMA__) || (defined(__AMX_TILE__) && defined(__AMX_BF16__))
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#define SPECULAX_AMX 1
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#ifdef __AVX512F__
constexpr int kLanes = 16;
constexpr int kMaxRows = 8;  // feature rows per pass over a tile (accumulators in registers)
constexpr int kTileRows = 3;  // table rows per tile: 8 x 3 accumulators + 4 operands in 32 zmm
#else
constexpr int kLanes = 8;
constexpr int kMaxRows = 4;
constexpr int kTileRows = 2;  // 4 x 2 accumulators + 3 operands in 16 ymm
#endif
constexpr int64_t kChunkRows = 42 * kTileRows;  // table rows per unit of work among threads
// How far ahead of the tile being read its prefetch runs: whole tiles, at least one, at least
// this many bytes. Reading a tile of int8 rows (1.7 KB at d = 576) takes too little time to cover
// the memory's latency with one tile ahead: SmolLM2's int8 tables at one row read 16 GB/s that
// way, 23 with 4 tiles (6.9 KB) ahead (Zen 4, 2 cores); float32 tiles (6.9 KB) keep one ahead.
constexpr int64_t kPrefetchBytes = 8192;
constexpr int64_t kMinParallelBytes = 1 << 18;  // smaller tables: one thread (waking costs more)

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));
  return v;
}

typedef uint16_t Bf16xL __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t U32xL __attribute__((vector_size(kLanes * sizeof(uint32_t))));

inline Vec Load(const uint16_t* p) {  // bf16: the float32 with these bits on top, exact
  Bf16xL h;
  std::memcpy(&h, p, sizeof(h));
  const U32xL bits = __builtin_convertvector(h, U32xL) << 16;
  Vec v;
  std::memcpy(&v, &bits, sizeof(Vec));
  return v;
}

typedef int8_t I8xL __attribute__((vector_size(kLanes * sizeof(int8_t))));

inline Vec Load(const int8_t* p) {  // int8: exact in float32
#ifdef __AVX512F__  // GCC's generic conversion ran 3.6x slower than a float32 table (SmolLM2 head)
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(p))));
  Vec v;
  std::memcpy(&v, &f, sizeof(Vec));
  return v;
#else
  I8xL q;
  std::memcpy(&q, p, sizeof(q));
  return __builtin_convertvector(q, Vec);
#endif
}

inline float ToFloat(float f) { return f; }

inline float ToFloat(int8_t q) { return q; }

inline float ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// a * b + c in one rounding, spelled out: the file builds with -ffp-contract=off, since GCC's own
// fusing of a * b + c differed between the M / NB instantiations of Tile (an AVX2 build gave a
// row alone and the same row among others results 1 ulp apart).
inline Vec MulAdd(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (Vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  for (int i = 0; i < kLanes; ++i) c[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return c;
#endif
}

inline float LaneSum(Vec a) {  // halves added pairwise: lanes i and i + L/2, then i + L/4, ...
  float s[kLanes];
  std::memcpy(s, &a, sizeof(s));
  for (int half = kLanes / 2; half > 0; half /= 2)
    for (int i = 0; i < half; ++i) s[i] += s[i + half];
  return s[0];
}

// Table rows [n, n + NB) against M feature rows from x; out rows are v apart. Each table chunk is
// loaded once for M rows and each feature chunk once for NB table rows. The bytes of the tile
// `ahead` elements on (kPrefetchBytes) are prefetched in address order as this one's are read:
// without it the hardware's prefetch fell behind from 2 rows on (Intel, SmolLM2's head at 4 / 8
// rows: 4.9 / 6.1 ms, prefetched 2.2 / 2.6; one row 2.5 / 2.2), and prefetched row by row (NB
// interleaved streams) an AMD EPYC (Zen 4) core read ~14 GB/s where one stream reads ~27 (in
// address order ~23).
template <int M, int NB, typename T>
inline void Tile(const float* x, const T* table, float* out, int64_t d, int64_t v, int64_t n,
                 int64_t ahead) {
  const int64_t body = d - d % kLanes;
  const T* w = table + n * d;
  const T* next = w + ahead;
  Vec acc[M][NB] = {};
  for (int64_t k = 0; k < body; k += kLanes) {
    Vec wk[NB];
    for (int b = 0; b < NB; ++b) {
      // Into L2, not L1 (prefetcht1): at 8 feature rows (18 KB of them) the next tile's 7 KB
      // in L1 evicted the features (Zen 4, 8 rows from DRAM: 27 against 18 GMAC/s a core).
      __builtin_prefetch(next + k * NB + b * kLanes, 0, 2);  // past the table's end: a no-op
      wk[b] = Load(w + b * d + k);
    }
    for (int j = 0; j < M; ++j) {
      // One load of the feature chunk, held in a register for the NB products: GCC folded it into
      // each multiply-add instead, NB loads (Zen 4, 8 rows from L1: 27 against 49 GMAC/s a core;
      // from DRAM, with the prefetch into L2: 27 against 36).
      Vec xk = Load(x + j * d + k);
#ifdef __AVX512F__
      asm("" : "+v"(xk));
#endif
      for (int b = 0; b < NB; ++b) acc[j][b] = MulAdd(wk[b], xk, acc[j][b]);
    }
  }
  for (int j = 0; j < M; ++j)
    for (int b = 0; b < NB; ++b) {
      float tail = 0.0f;
      for (int64_t k = body; k < d; ++k) tail += ToFloat(w[b * d + k]) * x[j * d + k];
      out[j * v + n + b] = LaneSum(acc[j][b]) + tail;
    }
}

// Table rows [n0, n1) against m feature rows, a tile of table rows at a time: passes of kMaxRows
// feature rows, then one of R (the rest), while the tile's rows stay in L1. One function per R,
// kept out of line: inlined into a larger caller, GCC kept the accumulators on the stack (a store
// and a load each multiply-add; int8 tables at ~10 GB/s where this reads ~22 on one core).
template <int R, typename T>
__attribute__((noinline)) void RowsOf(const float* x, const T* table, float* out, int64_t m,
                                      int64_t d, int64_t v, int64_t n0, int64_t n1) {
  const int64_t full = m - R;  // rows in passes of kMaxRows before the last R
  const int64_t tile = kTileRows * d;  // a tile's elements
  const int64_t ahead = tile * std::max<int64_t>(1, kPrefetchBytes / (tile * sizeof(T)));
  int64_t n = n0;
  for (; n + kTileRows <= n1; n += kTileRows) {
    for (int64_t j = 0; j < full; j += kMaxRows)
      Tile<kMaxRows, kTileRows, T>(x + j * d, table, out + j * v, d, v, n, ahead);
    Tile<R, kTileRows, T>(x + full * d, table, out + full * v, d, v, n, ahead);
  }
  for (; n < n1; ++n) {
    for (int64_t j = 0; j < full; j += kMaxRows)
      Tile<kMaxRows, 1, T>(x + j * d, table, out + j * v, d, v, n, ahead);
    Tile<R, 1, T>(x + full * d, table, out + full * v, d, v, n, ahead);
  }
}

// RowsOf<R> for R = (m - 1) % kMaxRows + 1, the rows of the last pass.
template <typename T, int R = 1>
void Rows(const float* x, const T* table, float* out, int64_t m, int64_t d, int64_t v,
          int64_t n0, int64_t n1) {
  if (m == 0) return;  // no feature rows (RowsOf takes at least one)
  if constexpr (R < kMaxRows) {
    if ((m - 1) % kMaxRows + 1 != R) return Rows<T, R + 1>(x, table, out, m, d, v, n0, n1);
  }
  RowsOf<R, T>(x, table, out, m, d, v, n0, n1);
}

#ifdef SPECULAX_AMX
constexpr int kAmxRows = 16;  // table rows per tile (and columns of a feature tile)
constexpr int kAmxDepth = 32;  // bf16 values of d per tile row (64 bytes)
constexpr int kGroupRows = 8;  // feature rows per feature tile: each row's two parts, 16 columns

// Whether the process may use the tile registers: Linux grants their state on request
// (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), once per process.
bool AmxGranted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}

inline uint16_t Bf16Nearest(float f) {  // round to nearest even (features are finite)
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// The features as the tiles' right operand: each float32 feature as two bfloat16 parts, hi (x
// rounded) and lo (the rest rounded): 16 of its 24 mantissa bits. For each group of 8 rows (zero
// rows past m) and 32-wide slice of d, a tile [16 pairs of d][16 columns: row, part][2] (1 KiB).
std::vector<uint16_t> Operands(const float* x, int64_t m, int64_t d) {
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows, slices = d / kAmxDepth;
  const int64_t block = kAmxRows * kAmxDepth;
  std::vector<uint16_t> b(groups * slices * block, 0);
  for (int64_t j = 0; j < m; ++j) {
    uint16_t* tile = b.data() + (j / kGroupRows) * slices * block + (j % kGroupRows) * 4;
    const float* xj = x + j * d;
    for (int64_t s = 0; s < slices; ++s, tile += block)
      for (int k = 0; k < kAmxDepth; ++k) {  // pair k / 2 of the slice, element k % 2
        const float f = xj[s * kAmxDepth + k];
        const uint16_t hi = Bf16Nearest(f);
        uint16_t* at = tile + (k / 2) * 2 * kAmxRows + k % 2;
        at[0] = hi;
        at[2] = Bf16Nearest(f - ToFloat(hi));
      }
  }
  return b;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// One accumulator tile [16 table rows][16 columns] into out: a row's hi and lo sums added.
inline void Emit(const float* c, float* out, int64_t m, int64_t v, int64_t n, int64_t j0) {
  const int64_t rows = std::min<int64_t>(kGroupRows, m - j0);
  for (int64_t j = 0; j < rows; ++j)
    for (int i = 0; i < kAmxRows; ++i)
      out[(j0 + j) * v + n + i] = c[i * kAmxRows + 2 * j] + c[i * kAmxRows + 2 * j + 1];
}

// Table rows [n0, n1) (a multiple of 16 apart) against the feature groups, two table tiles by
// two feature tiles at a time: tiles 0-1 hold table slices, 2-3 feature slices, 4-7 accumulate
// (each load serves two products).
void AmxRows(const uint16_t* ops, const uint16_t* table, float* out, int64_t m, int64_t d,
             int64_t v, int64_t n0, int64_t n1) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kAmxRows;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows, slices = d / kAmxDepth;
  const int64_t block = kAmxRows * kAmxDepth, stride = d * sizeof(uint16_t);
  alignas(64) float c[kAmxRows * kAmxRows];
  for (int64_t n = n0; n < n1; n += 2 * kAmxRows) {
    const bool two_n = n + kAmxRows < n1;
    const uint16_t* w0 = table + n * d;
    const uint16_t* w1 = w0 + kAmxRows * d;
    for (int64_t g = 0; g < groups; g += 2) {
      const bool two_g = g + 1 < groups;
      const uint16_t* b0 = ops + g * slices * block;
      const uint16_t* b1 = b0 + slices * block;
      _tile_zero(4);
      _tile_zero(5);
      _tile_zero(6);
      _tile_zero(7);
      for (int64_t s = 0; s < slices; ++s) {
        _tile_loadd(0, w0 + s * kAmxDepth, stride);
        _tile_loadd(2, b0 + s * block, 64);
        _tile_dpbf16ps(4, 0, 2);
        if (two_g) {
          _tile_loadd(3, b1 + s * block, 64);
          _tile_dpbf16ps(5, 0, 3);
        }
        if (two_n) {
          _tile_loadd(1, w1 + s * kAmxDepth, stride);
          _tile_dpbf16ps(6, 1, 2);
          if (two_g) _tile_dpbf16ps(7, 1, 3);
        }
      }
      const int64_t j0 = g * kGroupRows, j1 = j0 + kGroupRows;
      _tile_stored(4, c, 64);
      Emit(c, out, m, v, n, j0);
      if (two_g) {
        _tile_stored(5, c, 64);
        Emit(c, out, m, v, n, j1);
      }
      if (two_n) {
        _tile_stored(6, c, 64);
        Emit(c, out, m, v, n + kAmxRows, j0);
        if (two_g) {
          _tile_stored(7, c, 64);
          Emit(c, out, m, v, n + kAmxRows, j1);
        }
      }
    }
  }
  _tile_release();
}
#endif

// The caller works too: more helpers than the other cores would take turns on them.
int64_t Cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Chunks of table rows taken in turn by the calling thread and by tasks on XLA's intra-op pool.
// The caller takes chunks too, so the call finishes even when no pool thread is free; state is
// shared so that a task starting after the call returned finds no chunk left and touches nothing
// else.
template <typename T>
struct Shared {
  const float* x;
  const T* table;
  float* out;
  int64_t m, d, v, chunks, chunk_rows = kChunkRows;
  const uint16_t* amx = nullptr;  // the features as AMX operands (Operands), or none
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Chunk(int64_t n0, int64_t n1) {  // table rows [n0, n1)
#ifdef SPECULAX_AMX
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (amx) return AmxRows(amx, table, out, m, d, v, n0, n1);
    }
#endif
    Rows(x, table, out, m, d, v, n0, n1);
  }

  void Work() {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
      const int64_t n0 = c * chunk_rows, n1 = std::min(v, n0 + chunk_rows);
      Chunk(n0, n1);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Whether a bfloat16 table goes to AMX: it depends on the machine and the shapes, never on m,
// so a row's path (and result) is the same whatever rows share the call.
bool UsesAmx(int64_t d, int64_t v) {
#ifdef SPECULAX_AMX
  return d % kAmxDepth == 0 && v % kAmxRows == 0 && AmxGranted();
#else
  (void)d, (void)v;
  return false;
#endif
}

template <typename T>
void Run(ffi::ThreadPool& pool, const float* x, const T* table, float* out, int64_t m, int64_t d,
         int64_t v, bool amx) {
  auto shared = std::make_shared<Shared<T>>();
  shared->x = x;
  shared->table = table;
  shared->out = out;
  shared->m = m;
  shared->d = d;
  shared->v = v;
#ifdef SPECULAX_AMX
  std::vector<uint16_t> operands;
  if (std::is_same_v<T, uint16_t> && amx && UsesAmx(d, v)) {
    operands = Operands(x, m, d);
    shared->amx = operands.data();
    shared->chunk_rows = 8 * kAmxRows;
  }
#endif
  shared->chunks = (v + shared->chunk_rows - 1) / shared->chunk_rows;
  const bool small = v * d * static_cast<int64_t>(sizeof(T)) < kMinParallelBytes;
  const int64_t helpers =
      small ? 0 : std::min<int64_t>({pool.num_threads(), Cores() - 1, shared->chunks - 1});
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([shared] { shared->Work(); });
  shared->Work();
  while (shared->done.load(std::memory_order_acquire) < shared->chunks) std::this_thread::yield();
}

// x [m, d] float32, table [v, d] float32, bfloat16 or int8 -> out [m, v] float32; amx: whether a
// bfloat16 table may go to AMX (where UsesAmx; other tables never do).
ffi::Error RowsDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer table,
                   ffi::ResultBuffer<ffi::F32> out, bool amx) {
  const auto xd = x.dimensions(), td = table.dimensions();
  if (xd.size() != 2 || td.size() != 2 || xd[1] != td[1])
    return ffi::Error::InvalidArgument("rows_dot takes x [m, d] and table [v, d]");
  const int64_t m = xd[0], d = xd[1], v = td[0];
  switch (table.element_type()) {
    case ffi::F32:
      Run(pool, x.typed_data(), table.typed_data<float>(), out->typed_data(), m, d, v, amx);
      break;
    case ffi::BF16:
      Run(pool, x.typed_data(), table.reinterpret_data<uint16_t>(), out->typed_data(), m, d, v,
          amx);
      break;
    case ffi::S8:
      Run(pool, x.typed_data(), table.reinterpret_data<int8_t>(), out->typed_data(), m, d, v,
          amx);
      break;
    default:
      return ffi::Error::InvalidArgument("rows_dot takes a float32, bfloat16 or int8 table");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpeculaxRowsDot, RowsDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("amx"));

// 1 where bfloat16 tables of suitable shapes go to AMX on this machine (rows_cpu.amx()), else 0.
extern "C" int SpeculaxRowsAmx() { return UsesAmx(32, 16) ? 1 : 0; }

// The vector lanes the kernel was built for (16 with AVX-512, else 8): rows_cpu.max_rows().
extern "C" int SpeculaxRowsLanes() { return kLanes; }
