// ring_all_sum: the collectives layer's verified benchmark (nccl-tests' conventions), over RDMA on
// tbverbs. Every run is checked element by element against closed-form arithmetic; then timed.
//
// Over real hardware (Thunderbolt Macs, or rdma-core NICs), one process per host:
//   JACCL_RANK=0 JACCL_COORDINATOR=10.0.0.1:5555 JACCL_IBV_DEVICES=devices.json ./ring_all_sum --size 64M
// (MLX_RANK, MLX_JACCL_COORDINATOR and MLX_IBV_DEVICES work too, or --rank, --coordinator, --devices).
// On the emulated fabric, N ranks on this machine:
//   ./ring_all_sum --local 4 --size 64M [--collective all_gather] [--op max]
//
// Everything that moves data is tbverbs::Communicator (tbverbs/collective.hpp); this file reads the
// options, fills and checks the buffers, times the calls and prints the table. launcher.hpp is the
// --local launcher (N ranks of this program on an emulated fabric).
#include "device_file.hpp"
#include "launcher.hpp"

#include <tbverbs/collective.hpp>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#ifndef TBVERBS_RING_EMU_LIBRARY
#define TBVERBS_RING_EMU_LIBRARY ""
#endif

namespace {

using ring::kMaxBytes;
using ring::parse_rank;
using ring::parse_size;
using tbverbs::DType;
using tbverbs::ReduceOp;
using tbverbs::collective::Collective;

std::string human(std::size_t b) {
  char buf[32];
  if (b >= (1u << 30) && b % (1u << 30) == 0) std::snprintf(buf, sizeof buf, "%zu GiB", b >> 30);
  else if (b >= (1u << 20) && b % (1u << 20) == 0) std::snprintf(buf, sizeof buf, "%zu MiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%zu KiB", b >> 10);
  else std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

std::optional<std::string> env_of(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v != nullptr && *v != '\0') return std::string(v);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// The closed-form inputs. Element i of rank r's vector (i counts over the whole vector: all_reduce's,
// all_gather's output, reduce_scatter's input):
//   sum, min, max:  base(r, i % 61) + (r == 0 ? i % P : 0)  (plus a high component for int64 and
//                   float64, a fractional one for floats);
//   prod:           +-1 everywhere except one rank per element, which holds +-2;
// every value and every partial result is exactly representable in the type, so results are
// checked with ==, whatever the order of the combination. The expected results come from tables
// over i % 61 (and i % (n + 1) for prod), so a check costs a few loads per element.
constexpr std::size_t kPeriod = 61;
std::size_t index_period(DType t) {
  switch (t) {
  case DType::f32: return 4093;
  case DType::f16: return 1024;  // |sum| <= 3 x 64 + 1023 < 2048: exact in binary16
  case DType::bf16: return 16;   // |sum| <= 3 x 64 + 15 < 256: exact with 8 significant bits
  case DType::i8: return 64;     // |element| <= 3 + 63 < 128: min and max compare what was sent
  case DType::u8: return 128;    // 0 <= element <= 6 + 127 < 256
  default: return 1048573;
  }
}

// base(r, k) with rank 0's index term left out, as a double (exact in every type).
// Unsigned types get non-negative bases (min and max compare them unsigned); integer sums and
// products may wrap: the expected values wrap the same way (to_element).
double base_value(DType t, int r, std::size_t k) {
  const bool narrow = t == DType::f16 || t == DType::bf16 || t == DType::i8 || t == DType::u8; // |base| <= 3: sums of 64 ranks stay exact
  const bool is_unsigned = t == DType::u8 || t == DType::u32 || t == DType::u64;
  const long long mix = static_cast<long long>(k * 7 + static_cast<std::size_t>(r) * 13);
  const double base = static_cast<double>(narrow ? mix % 7 - 3 : mix % 61 - 30) + (is_unsigned ? (narrow ? 3 : 30) : 0);
  switch (t) {
  case DType::f32: return base + 0.25 * r;
  case DType::f64: return base + 0.5 * (r + 1) + (r + 1) * 1073741824.0;
  case DType::i64:
  case DType::u64: return base + static_cast<double>(static_cast<long long>(r + 1) << 33);
  default: return base;
  }
}
// prod's sign of rank r at k = i % 61.
double prod_sign(int r, std::size_t k) { return (k * 7 + static_cast<std::size_t>(r) * 13) % 61 % 3 == 0 ? -1.0 : 1.0; }

// The element pattern of a job: fills a rank's vector and checks a result, over any range of
// element indices.
struct Pattern {
  DType type;
  ReduceOp op;
  int n;
  std::size_t period;              // P, the index term's period
  std::vector<double> rank_base;   // n x 61: base_value (sum, min, max) or prod_sign (prod)
  std::vector<double> combined;    // 61: the ranks 1..n-1 combined (sum/min/max), all n signs (prod)

  Pattern(DType t, ReduceOp o, int ranks) : type(t), op(o), n(ranks), period(index_period(t)) {
    rank_base.resize(static_cast<std::size_t>(n) * kPeriod);
    combined.resize(kPeriod);
    for (std::size_t k = 0; k < kPeriod; ++k) {
      double c = op == ReduceOp::prod ? 1.0 : 0.0;
      for (int r = 0; r < n; ++r) {
        const double v = op == ReduceOp::prod ? prod_sign(r, k) : base_value(t, r, k);
        rank_base[static_cast<std::size_t>(r) * kPeriod + k] = v;
        if (op == ReduceOp::prod) c *= v;
        else if (r == 1) c = v;
        else if (r > 1) c = op == ReduceOp::min ? std::min(c, v) : op == ReduceOp::max ? std::max(c, v) : c + v; // sum, avg
      }
      combined[k] = c;
    }
  }
  // Rank r's element i.
  double input(int r, std::size_t i) const {
    const double b = rank_base[static_cast<std::size_t>(r) * kPeriod + i % kPeriod];
    if (op == ReduceOp::prod) return i % static_cast<std::size_t>(n + 1) == static_cast<std::size_t>(r) ? 2 * b : b;
    return r == 0 ? b + static_cast<double>(i % period) : b;
  }
  // Element i combined over every rank.
  double result(std::size_t i) const {
    const std::size_t k = i % kPeriod;
    if (op == ReduceOp::prod) return i % static_cast<std::size_t>(n + 1) < static_cast<std::size_t>(n) ? 2 * combined[k] : combined[k];
    const double r0 = rank_base[k] + static_cast<double>(i % period);
    if (n == 1) return r0;
    switch (op) {
    case ReduceOp::min: return std::min(r0, combined[k]);
    case ReduceOp::max: return std::max(r0, combined[k]);
    default: return r0 + combined[k]; // sum; avg's sum (check() divides it as the layer does)
    }
  }
};

template <class T> T to_element(double v) {
  if constexpr (std::is_same_v<T, tbverbs::float16> || std::is_same_v<T, tbverbs::bfloat16>) return T::from_float(static_cast<float>(v));
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<long long>(v)); // wraps, as the layer's integers do
  else return static_cast<T>(v);
}
// avg's result from the exact sum: rounded to T, then divided by the ranks once in T (16-bit
// types in float32), as docs/collectives.md defines ReduceOp::avg.
template <class T> T average(double sum, int n) {
  const T s = to_element<T>(sum);
  if constexpr (std::is_same_v<T, tbverbs::float16> || std::is_same_v<T, tbverbs::bfloat16>) return T::from_float(s.to_float() / static_cast<float>(n));
  else return static_cast<T>(s / static_cast<T>(n));
}
template <class T> double from_element(T v) {
  if constexpr (std::is_same_v<T, tbverbs::float16> || std::is_same_v<T, tbverbs::bfloat16>) return v.to_float();
  else return static_cast<double>(v);
}

// dst[j] = rank r's element first + j, for j < count.
void fill(const Pattern& p, int r, std::size_t first, std::byte* dst, std::size_t count) {
  tbverbs::with_dtype(p.type, [&]<class T>() {
    T* d = reinterpret_cast<T*>(dst);
    for (std::size_t j = 0; j < count; ++j) d[j] = to_element<T>(p.input(r, first + j));
  });
}
// Mismatches of got[j] against want(first + j); prints the first few.
template <class Want>
std::size_t check(const Pattern& p, int rank, std::size_t first, const std::byte* got, std::size_t count, Want want) {
  return tbverbs::with_dtype(p.type, [&]<class T>() -> std::size_t {
    const T* g = reinterpret_cast<const T*>(got);
    std::size_t bad = 0;
    for (std::size_t j = 0; j < count; ++j) {
      const T w = p.op == ReduceOp::avg ? average<T>(want(first + j), p.n) : to_element<T>(want(first + j));
      if (!(g[j] == w)) {
        if (bad < 5)
          std::printf("rank %d: MISMATCH at element %zu: got %.17g, expected %.17g\n", rank, first + j,
                      from_element(g[j]), from_element(w));
        ++bad;
      }
    }
    return bad;
  });
}

// ---------------------------------------------------------------------------------------------

struct Options {
  int local = 0;
  int rank = -1;
  std::string coordinator, devices, library, emu_library = TBVERBS_RING_EMU_LIBRARY;
  std::string size = "64M", max_size, dtype = "float32", place = "both";
  std::string collective = "all_reduce", op = "sum";
  int root = 0;
  std::vector<std::size_t> counts;
  int factor = 2;
  int iters = 0, warmup = 1;
  std::string message = "256K";
  int window = 8;
  int timeout_ms = 30000, gid_wait_ms = 1000;
  bool csv = false, quiet = false, keep = false, no_device_file = false, explain = false;
  int ranks = 0;
  std::string fabric, write_fabric, memory = "auto", transport = "auto", algorithm = "auto";
  double link_gbps = 0, link_latency_us = 0;
  std::vector<std::string> quirks;
  std::string profile = "thunderbolt";
  int cables = 1;
  bool mesh = false;
  int kill_rank = -1, stop_rank = -1, kill_after_ms = 1000;
  std::string kill_after_line;
};

int fail_rank(int rank, const std::string& where, const tbverbs::Error& e) {
  // Before the rank is known the line names the program, not "rank -1" (issue 13). The
  // communicator has told the other ranks already (they fail with "rank N aborted: ...").
  if (rank < 0) std::fprintf(stderr, "ring_all_sum: FAILED during %s: %s\n", where.c_str(), e.message().c_str());
  else std::fprintf(stderr, "rank %d: FAILED during %s: %s\n", rank, where.c_str(), e.message().c_str());
  std::fflush(stderr);
  return 2;
}

// What each collective's table row means, in nccl-tests' conventions: `size` is the whole vector
// (all_reduce's, reduce's and broadcast's buffer, all_gather's and gather's output,
// reduce_scatter's and scatter's input, all_to_all's input), a rank's own block is size / n;
// busbw = algbw x the factor below (nccl-tests' factors: the bytes an optimal algorithm's busiest
// link moves per byte of size).
double busbw_factor(Collective c, int n) {
  switch (c) {
  case Collective::all_reduce: return 2.0 * (n - 1) / n;
  case Collective::all_gather:
  case Collective::reduce_scatter:
  case Collective::gather:
  case Collective::scatter:
  case Collective::all_to_all: return static_cast<double>(n - 1) / n;
  default: return 1.0; // broadcast, reduce
  }
}

// Whether `c` cuts the vector into one block per rank.
bool cuts_blocks(Collective c) {
  return c == Collective::all_gather || c == Collective::reduce_scatter || c == Collective::gather || c == Collective::scatter ||
         c == Collective::all_to_all;
}

// Whether `c` takes a root.
bool rooted(Collective c) { return c == Collective::broadcast || c == Collective::reduce || c == Collective::gather || c == Collective::scatter; }

// The buffers of one run: `count` elements of the whole vector, `block` a rank's share; the
// input and output inside the program's two buffers (in place: inside the output buffer).
struct RunBuffers {
  Collective kind;
  int rank, root;
  std::size_t count, block, es;
  bool in_place;
  // Elements of the input and output spans.
  std::size_t in_elems() const { return kind == Collective::all_gather || kind == Collective::gather ? block : count; }
  std::size_t out_elems() const { return kind == Collective::reduce_scatter || kind == Collective::scatter ? block : count; }
  // In place, the input is the output (all_reduce, reduce), this rank's block of it (all_gather,
  // gather), or the output is this rank's block of the input (scatter).
  std::byte* input(std::byte* in_buf, std::byte* out_buf) const {
    if (!in_place) return in_buf;
    return kind == Collective::all_gather || kind == Collective::gather ? out_buf + mine() * es : out_buf;
  }
  std::byte* output(std::byte* out_buf) const { return in_place && kind == Collective::scatter ? out_buf + mine() * es : out_buf; }
  // This rank's first element of a blocked vector.
  std::size_t mine() const { return static_cast<std::size_t>(rank) * block; }
};

// Rank `rank`'s input of a run (broadcast and scatter: the root's only).
void fill_input(const Pattern& pat, const RunBuffers& b, std::byte* in, std::byte* out) {
  switch (b.kind) {
  case Collective::all_gather:
  case Collective::gather: fill(pat, b.rank, 0, in, b.block); break;
  case Collective::broadcast:
    if (b.rank == b.root) fill(pat, b.rank, 0, out, b.count);
    break;
  case Collective::scatter:
    if (b.rank == b.root) fill(pat, b.rank, 0, in, b.count);
    break;
  default: fill(pat, b.rank, 0, in, b.count); break;
  }
}

// Wrong elements of rank `rank`'s result (none to check where the rank keeps no result).
std::size_t check_result(const Pattern& pat, const RunBuffers& b, int n, const std::byte* out) {
  const int rank = b.rank;
  auto blocks = [&](auto want_of_block) {
    std::size_t bad = 0;
    for (int q = 0; q < n; ++q) bad += check(pat, rank, 0, out + static_cast<std::size_t>(q) * b.block * b.es, b.block, want_of_block(q));
    return bad;
  };
  switch (b.kind) {
  case Collective::reduce:
    if (rank != b.root) return 0;
    [[fallthrough]];
  case Collective::all_reduce: return check(pat, rank, 0, out, b.count, [&](std::size_t i) { return pat.result(i); });
  case Collective::reduce_scatter: return check(pat, rank, b.mine(), out, b.block, [&](std::size_t i) { return pat.result(i); });
  case Collective::gather:
    if (rank != b.root) return 0;
    [[fallthrough]];
  case Collective::all_gather: // block q is rank q's vector
    return blocks([&](int q) { return [&pat, q](std::size_t i) { return pat.input(q, i); }; });
  case Collective::all_to_all: // block q is rank q's block `rank`
    return blocks([&](int q) { return [&pat, q, first = b.mine()](std::size_t i) { return pat.input(q, first + i); }; });
  case Collective::scatter: return check(pat, rank, b.mine(), out, b.block, [&](std::size_t i) { return pat.input(b.root, i); });
  default: return check(pat, rank, 0, out, b.count, [&](std::size_t i) { return pat.input(b.root, i); });
  }
}

int run_rank(const Options& o) {
  // Who am I, where is the coordinator, how many ranks, which devices: flags first, then the
  // launchers' variables (tbverbs/collective/launcher.hpp: mlx.launch, torchrun, Open MPI, PMI, Slurm).
  std::string launcher_problem;
  const auto job = tbverbs::launcher_job(launcher_problem);
  if (!job) {
    std::fprintf(stderr, "ring_all_sum: FAILED during configuration: %s\n", launcher_problem.c_str());
    return 2;
  }
  const int rank = o.rank >= 0 ? o.rank : job->rank.value_or(-1);
  const std::string coordinator = !o.coordinator.empty() ? o.coordinator : job->coordinator;
  const std::string devices_path =
      !o.devices.empty() ? o.devices : env_of({"JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"}).value_or("");
  // The text itself, uncut: as an Error it read "FAILED during configuration: configuration:
  // invalid argument: ..." and was cut at 256 characters (issue 13).
  auto config_error = [&](const std::string& what) {
    if (rank < 0) std::fprintf(stderr, "ring_all_sum: FAILED during configuration: %s\n", what.c_str());
    else std::fprintf(stderr, "rank %d: FAILED during configuration: %s\n", rank, what.c_str());
    return 2;
  };
  if (rank < 0) return config_error(std::string("no rank: pass --rank or set ") + tbverbs::launcher_rank_variables + "; or run --local N");
  if (coordinator.empty())
    return config_error(std::string("no coordinator: pass --coordinator host:port or set ") + tbverbs::launcher_coordinator_variables +
                        (job->launcher.empty() ? std::string() : " (" + job->launcher + " gave the rank, not the coordinator)"));

  tbverbs::CommunicatorOptions co;
  co.rank = rank;
  co.coordinator = coordinator;
  co.library = o.library;
  // No device file (or --no-device-file): the communicator discovers the cables from the ports'
  // subnets once the side channel is up (tbverbs/topology.hpp); the number of ranks then comes
  // from --ranks.
  const bool discover = o.no_device_file || devices_path.empty();
  int n = 0;
  if (discover) {
    n = o.ranks;
    if (n <= 0)
      if (auto v = env_of({"TBVERBS_RANKS"})) n = parse_rank(*v).value_or(-1);
    if (n <= 0 && job->size) n = *job->size; // the launcher's WORLD_SIZE, OMPI_COMM_WORLD_SIZE, ...
    if (n < 2 || n > 64)
      return config_error(std::string(o.no_device_file ? "--no-device-file" : "no device file") +
                          ": give the number of ranks with --ranks N (or TBVERBS_RANKS), 2..64, so the cables can be "
                          "discovered; or pass --devices FILE (JACCL_IBV_DEVICES)");
    if (rank >= n) return config_error("rank " + std::to_string(rank) + " is outside the job's " + std::to_string(n) + " ranks");
  } else {
    // The device file (JACCL's matrix or mlx.distributed_config's hostfile), read here so that its
    // problems are configuration errors; the communicator gets the cables it lists.
    std::string text;
    {
      std::ifstream f(devices_path);
      if (!f) return config_error("cannot read the device file " + devices_path);
      text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    std::string problem;
    auto cables = ring::parse_device_file(text, rank, problem);
    if (!cables) return config_error(devices_path + ": " + problem);
    n = cables->ranks;
    if (o.rank < 0 && job->size && *job->size != n)
      return config_error(job->size_variable + "=" + std::to_string(*job->size) + " (" + job->launcher + ") but " +
                          devices_path + " lists " + std::to_string(n) + " ranks");
    tbverbs::collective::Cabling c;
    c.left = cables->left;
    c.right = cables->right;
    c.mesh = cables->others;
    co.cabling = std::move(c);
  }
  co.size = n;
  auto msg = parse_size(o.message);
  if (!msg || *msg < 4096 || *msg % 4096 != 0 || *msg > (std::size_t{16} << 20))
    return config_error("--message-bytes must be a whole number of 4 KiB frames, at most 16M");
  co.message_bytes = *msg;
  co.window = std::max(1, o.window);
  using tbverbs::collective::Algorithm;
  using tbverbs::collective::Memory;
  using tbverbs::collective::Transport;
  using tbverbs::collective::parse_setting;
  using tbverbs::collective::setting_choices;
  const auto memory = parse_setting<Memory>(o.memory);
  if (!memory) return config_error("--memory must be " + setting_choices<Memory>());
  co.memory = *memory;
  const auto transport = parse_setting<Transport>(o.transport);
  if (!transport) return config_error("--transport must be " + setting_choices<Transport>());
  co.transport = *transport;
  const auto algorithm = parse_setting<Algorithm>(o.algorithm);
  if (!algorithm) return config_error("--algorithm must be " + setting_choices<Algorithm>());
  co.algorithm = *algorithm;
  std::optional<Collective> parsed_kind;
  for (Collective c : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter, Collective::broadcast,
                       Collective::reduce, Collective::gather, Collective::scatter, Collective::all_to_all})
    if (o.collective == tbverbs::collective::collective_name(c)) parsed_kind = c;
  if (!parsed_kind)
    return config_error("--collective must be all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter or all_to_all");
  const Collective kind = *parsed_kind;
  std::optional<ReduceOp> parsed_op;
  for (ReduceOp r : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
    if (o.op == tbverbs::reduce_op_name(r)) parsed_op = r;
  if (!parsed_op) return config_error("--op must be sum, prod, min, max or avg");
  const ReduceOp op = *parsed_op;
  const bool reduces = kind == Collective::all_reduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
  if (!reduces && op != ReduceOp::sum) return config_error("--op applies to all_reduce, reduce_scatter and reduce");
  if (o.root < 0 || o.root >= n) return config_error("--root " + std::to_string(o.root) + " is not a rank of 0.." + std::to_string(n - 1));
  co.timeout = std::chrono::milliseconds(o.timeout_ms);
  co.gid_wait = std::chrono::milliseconds(o.gid_wait_ms);
  // The job token: from the job's secret (TBVERBS_JOB_SECRET or _FILE; --local makes one), so only
  // ranks given it can join; without one, from the launcher's job id and the coordinator address
  // (two jobs on one port refuse each other; anyone who can reach the port can compute it, and
  // the side channel says so once).
  auto secret = tbverbs::job_secret_from_env();
  if (!secret) return config_error(std::string(secret.error().detail.view()));
  co.job_secret = *secret;
  if (co.job_secret.empty()) {
    const std::string job_id = env_of({"TBVERBS_JOB_ID", "SLURM_JOB_ID", "MLX_JOB_ID"}).value_or("");
    co.job_token = tbverbs::side_channel_token("tbverbs ring_all_sum " + coordinator + " " + job_id);
  }
  auto log = [&o, rank](const std::string& s) {
    if (!o.quiet) std::printf("rank %d: %s\n", rank, s.c_str());
    std::fflush(stdout);
  };
  co.log = log;
  // Explain mode (--explain or TBVERBS_EXPLAIN=1): every QP attribute, MR layout and budget with
  // its reason, one line each, prefixed like every other line of this rank (also with --quiet).
  if (o.explain) tbverbs::set_explain(true);
  tbverbs::set_explain_sink([rank](std::string_view l) {
    std::printf("rank %d: explain: %.*s\n", rank, static_cast<int>(l.size()), l.data());
    std::fflush(stdout);
  });
  // The mesh all_reduce needs a cable between every pair of ranks (ring neighbours have theirs).
  if (co.algorithm == Algorithm::mesh && n >= 4 && co.cabling) {
    int missing = 0;
    for (int p = 0; p < n; ++p) {
      const bool neighbour = p == (rank + 1) % n || p == (rank + n - 1) % n;
      if (p != rank && !neighbour && (static_cast<std::size_t>(p) >= co.cabling->mesh.size() || co.cabling->mesh[static_cast<std::size_t>(p)].empty()))
        ++missing;
    }
    if (missing > 0)
      return config_error("--algorithm mesh needs a cable between every pair of ranks: rank " + std::to_string(rank) +
                          " has none toward " + std::to_string(missing) + " rank(s) (a fully connected device file, "
                          "or --local N --mesh)");
  }

  // Sizes and types.
  // Every type by its name or short name (f32 ... u64, in DType's order); avg takes the floating ones.
  constexpr const char* short_names[] = {"f32", "f64", "i32", "i64", "f16", "bf16", "i8", "u8", "u32", "u64"};
  std::vector<DType> types;
  for (int v = 0; v <= static_cast<int>(tbverbs::last_dtype); ++v) {
    const auto t = static_cast<DType>(v);
    if (o.dtype == tbverbs::dtype_name(t) || o.dtype == short_names[v] || (o.dtype == "all" && (op != ReduceOp::avg || tbverbs::dtype_is_floating(t))))
      types.push_back(t);
  }
  if (types.empty()) return config_error("--dtype must be float32, float64, float16, bfloat16, int8, int32, int64, uint8, uint32, uint64 or all");
  if (op == ReduceOp::avg && !tbverbs::dtype_is_floating(types.front()))
    return config_error("--op avg takes floating-point types (the layer refuses an integer average)");
  std::vector<bool> places;
  if (o.place == "in") places = {true};
  else if (o.place == "out") places = {false};
  else if (o.place == "both") places = {false, true};
  else return config_error("--place must be in, out or both");
  // reduce_scatter's and all_to_all's input and output must not overlap (docs/collectives.md): no
  // in-place column.
  if (kind == Collective::reduce_scatter || kind == Collective::all_to_all) {
    places.erase(std::remove(places.begin(), places.end(), true), places.end());
    if (places.empty())
      return config_error("--place in: " + o.collective + " runs out of place only (its input and output must not overlap)");
  }
  // (count in elements, or bytes) per run.
  std::vector<std::size_t> sizes;  // bytes, or elements when --count is given
  const bool by_count = !o.counts.empty();
  if (by_count) {
    sizes = o.counts;
    if (std::find(sizes.begin(), sizes.end(), std::size_t{0}) != sizes.end())
      return config_error("--count: element counts must be at least 1");
    for (std::size_t c : sizes)
      if (c > kMaxBytes / 8)
        return config_error("--count " + std::to_string(c) + ": at most " + std::to_string(kMaxBytes / 8) +
                            " elements (" + std::to_string(kMaxBytes) + " bytes of the widest type)");
  } else {
    auto lo = parse_size(o.size);
    auto hi = o.max_size.empty() ? lo : parse_size(o.max_size);
    if (!lo || !hi || *lo == 0 || *hi < *lo)
      return config_error("--size/--max-size: sizes like 4K, 64M, 1G, from 1 byte to " + std::to_string(kMaxBytes) +
                          " (a number alone is bytes; K, M and G are 1024-based)");
    if (o.factor < 2 || o.factor > 1024) return config_error("--factor must be 2..1024");
    const auto f = static_cast<std::size_t>(o.factor);
    for (std::size_t s = *lo; s <= *hi; s *= f) {  // *hi <= kMaxBytes: the multiplication cannot wrap
      sizes.push_back(s);
      if (s > *hi / f) break;
    }
  }
  // Elements of the whole vector for a size: whole blocks of n for the collectives that split it.
  const bool blocks = cuts_blocks(kind);
  auto elements = [&](std::size_t s, DType t) {
    std::size_t c = by_count ? s : std::max<std::size_t>(1, s / tbverbs::dtype_size(t));
    if (blocks) c = std::max<std::size_t>(1, c / static_cast<std::size_t>(n)) * static_cast<std::size_t>(n);
    return c;
  };
  std::size_t max_bytes = 0;
  for (DType t : types)
    for (std::size_t s : sizes) {
      const std::size_t run = elements(s, t) * tbverbs::dtype_size(t);
      max_bytes = std::max(max_bytes, run);
      // A size the run cannot take as it is: said, never rounded in silence.
      if (!by_count && run != s && rank == 0)
        std::printf("# note: --size %zu runs %zu bytes of %s (whole elements%s)\n", s, run,
                    std::string(tbverbs::dtype_name(t)).c_str(), blocks ? ", and blocks of the same number on every rank" : "");
    }

  // The communicator: side-channel rendezvous, devices, links verified, credits posted.
  auto comm = tbverbs::Communicator::connect(co);
  if (!comm) return fail_rank(rank, "setting up the ring", comm.error());
  if (co.algorithm == Algorithm::mesh && n >= 4 && !comm->network()->fully_connected())
    return config_error("--algorithm mesh needs a cable between every pair of ranks: the discovered cables leave rank " +
                        std::to_string(rank) + " without one toward some rank (a fully connected fabric: --local N --mesh)");
  tbverbs::SideChannel& sc = comm->side_channel();
  log("algorithm " + comm->algorithm_rule());

  // The buffers: page-aligned, as large as the largest run. A rank's input is the whole vector
  // for all_reduce, reduce_scatter and broadcast, its own block for all_gather; its output the
  // whole vector, or its block for reduce_scatter.
  // (In place only: no separate input buffer, so the resident memory is the vector's and the
  // communicator's.)
  const bool out_of_place = std::find(places.begin(), places.end(), false) != places.end();
  auto in_buf = tbverbs::AlignedBuffer::allocate(out_of_place ? max_bytes : 0);
  auto out_buf = tbverbs::AlignedBuffer::allocate(max_bytes);
  if (!in_buf || !out_buf) return fail_rank(rank, "allocating the buffers", (!in_buf ? in_buf : out_buf).error());
  // --memory auto: the two buffers are registered once, as a program that calls collectives on
  // the same buffers registers them (docs/collectives.md, "Memory"), while they fit the devices'
  // MR budget; past it they are staged. (registered: the layer's cache registers them on first
  // use; staged: never.) Released before close(): a registration must not outlive its communicator.
  std::vector<tbverbs::MemoryRegistration> registrations;
  if (co.memory == Memory::automatic && comm->network() != nullptr) {
    for (auto* b : {&*in_buf, &*out_buf}) {
      if (b == &*in_buf && !out_of_place) continue;
      auto reg = comm->register_memory(std::span<const std::byte>(b->data(), max_bytes));
      if (reg) {
        registrations.push_back(std::move(*reg));
      } else if (reg.error().is(tbverbs::ErrorKind::capacity)) {
        log("memory: staged (" + std::string(reg.error().detail.view()) + ")");
        registrations.clear();
        break;
      } else {
        return fail_rank(rank, "registering the buffers", reg.error());
      }
    }
    if (!registrations.empty())
      log("memory: " + std::string(out_of_place ? "the input and output buffers" : "the buffer") + " registered (" +
          std::to_string(max_bytes) + " bytes each)");
  }

  // The results in the conventions of nccl-tests (rank 0 prints them): one row per (type, size),
  // out-of-place and in-place side by side, or with --csv one line per run.
  struct Run {
    bool done = false;
    double us = 0, algbw = 0, busbw = 0;
    std::uint64_t wrong = 0;
  };
  const std::string cname(tbverbs::collective::collective_name(kind));
  const char* redop = reduces ? tbverbs::reduce_op_name(op).data() : "none"; // its names are string literals
  // The algorithm a run takes, from the bytes of one rank's block (the whole vector for all_reduce).
  auto algorithm_of = [&](std::size_t bytes) {
    const bool per_block = blocks && kind != Collective::all_to_all; // all_to_all gathers every rank's whole input
    return std::string(tbverbs::collective::algorithm_name(comm->algorithm_for(kind, per_block ? bytes / static_cast<std::size_t>(n) : bytes)));
  };
  // One verified and timed collective; returns the launcher's exit code on failure.
  auto run_one = [&](DType t, std::size_t count, bool in_place, Run& res) -> int {
    const std::size_t es = tbverbs::dtype_size(t);
    const std::size_t bytes = count * es;
    const std::size_t block = blocks ? count / static_cast<std::size_t>(n) : count;
    int iters = o.iters;
    if (iters <= 0) iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / std::max<std::size_t>(bytes, 1), 3, 50));
    const Pattern pat(t, op, n);
    const RunBuffers rb{kind, rank, o.root, count, block, es, in_place};
    std::byte* const out_base = out_buf->data();
    std::byte* const in = rb.input(in_buf->data(), out_base);
    std::byte* const out = rb.output(out_base);
    const std::span<const std::byte> in_span(in, rb.in_elems() * es);
    const std::span<std::byte> out_span(out, rb.out_elems() * es);
    auto call = [&]() -> tbverbs::Result<void> {
      switch (kind) {
      case Collective::all_reduce: return comm->all_reduce(in_span, out_span, t, op);
      case Collective::all_gather: return comm->all_gather(in_span, out_span, t);
      case Collective::reduce_scatter: return comm->reduce_scatter(in_span, out_span, t, op);
      case Collective::reduce: return comm->reduce(in_span, out_span, t, op, o.root);
      case Collective::gather: return comm->gather(in_span, out_span, t, o.root);
      case Collective::scatter: return comm->scatter(in_span, out_span, t, o.root);
      case Collective::all_to_all: return comm->all_to_all(in_span, out_span, t);
      default: return comm->broadcast(out_span, t, o.root);
      }
    };
    const std::string what = cname + " (" + human(bytes) + " " + std::string(tbverbs::dtype_name(t)) + ", " + algorithm_of(bytes) + ")";
    // 1. The verified run: fresh input, a poisoned output buffer (stale data must not pass the
    //    check: in place too, where the previous run left other blocks correct), a barrier of
    //    every rank before the first send.
    std::memset(out_base, 0xff, bytes);
    fill_input(pat, rb, in, out);
    if (auto b = sc.barrier(); !b) return fail_rank(rank, "the barrier before " + what, b.error());
    if (auto r = call(); !r) return fail_rank(rank, what, r.error());
    const std::size_t bad = check_result(pat, rb, n, out);
    // 2. Timed runs, back to back as nccl-tests times them (the communicator's credits travel in
    //    band: no side-channel traffic between two calls). In place, each run works on the previous
    //    results (integers wrap, floats grow): same work, checked in step 1.
    for (int it = 0; it < o.warmup; ++it)
      if (auto r = call(); !r) return fail_rank(rank, what, r.error());
    if (auto b = sc.barrier(); !b) return fail_rank(rank, "the barrier before the timed runs", b.error());
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it)
      if (auto r = call(); !r) return fail_rank(rank, what, r.error());
    const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Every rank's verdict and time, so rank 0's summary covers the whole job: the slowest
    // rank's time, the wrong elements of all.
    std::byte verdict[16];
    std::uint64_t bad64 = bad, ns = static_cast<std::uint64_t>(total_s * 1e9);
    std::memcpy(verdict, &bad64, 8);
    std::memcpy(verdict + 8, &ns, 8);
    auto all = sc.all_gather(verdict);
    if (!all) return fail_rank(rank, "gathering the results", all.error());
    std::uint64_t ns_max = 0;
    for (int k = 0; k < n; ++k) {
      std::uint64_t b = 0, u = 0;
      std::memcpy(&b, (*all)[static_cast<std::size_t>(k)].data(), 8);
      std::memcpy(&u, (*all)[static_cast<std::size_t>(k)].data() + 8, 8);
      res.wrong += b;
      ns_max = std::max(ns_max, u);
    }
    const double sec = static_cast<double>(ns_max) * 1e-9 / iters;
    res.done = true;
    res.us = sec * 1e6;
    res.algbw = sec > 0 ? static_cast<double>(bytes) / sec / 1e9 : 0;
    res.busbw = res.algbw * busbw_factor(kind, n);
    return 0;
  };
  if (rank == 0) {
    if (o.csv) {
      std::printf("size_bytes,count,type,redop,place,time_us,algbw_gbps,busbw_gbps,wrong\n");
    } else {
      std::printf("#\n# %s over %d ranks%s; %s iterations per size, %d warm-up; time: the slowest rank's mean\n"
                  "# algorithm %s\n",
                  kind == Collective::all_reduce && op == ReduceOp::sum ? "all_sum" : (cname + (reduces ? std::string(" (") + redop + ")" : "")).c_str(),
                  n, rooted(kind) ? (", root " + std::to_string(o.root)).c_str() : "",
                  o.iters > 0 ? std::to_string(o.iters).c_str() : "3 to 50 (by size)", o.warmup,
                  kind == Collective::all_reduce ? comm->algorithm_rule().c_str() : "the layer's choice per size (the algo column)");
      std::printf("#\n# %46s %-37s %s\n", "", "out-of-place", "in-place");
      std::printf("# %10s %12s %8s %5s %7s %10s %8s %8s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop",
                  "algo", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
      std::printf("# %10s %12s %8s %5s %7s %10s %8s %8s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "",
                  "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    std::fflush(stdout);
  }
  int exit_code = 0;
  double busbw_sum = 0;
  int busbw_runs = 0;
  std::uint64_t wrong_total = 0;
  for (DType t : types)
    for (std::size_t s : sizes) {
      const std::size_t count = elements(s, t);
      const std::size_t bytes = count * tbverbs::dtype_size(t);
      Run res[2];  // out of place, in place
      for (bool in_place : places) {
        Run& r = res[in_place ? 1 : 0];
        if (const int rc = run_one(t, count, in_place, r); rc != 0) return rc;
        busbw_sum += r.busbw;
        ++busbw_runs;
        wrong_total += r.wrong;
        if (r.wrong != 0) exit_code = 3;
        if (rank == 0 && o.csv)
          std::printf("%zu,%zu,%s,%s,%s,%.3f,%.6f,%.6f,%" PRIu64 "\n", bytes, count, std::string(tbverbs::dtype_name(t)).c_str(),
                      redop, in_place ? "in" : "out", r.us, r.algbw, r.busbw, r.wrong);
      }
      if (rank == 0 && !o.csv) {
        std::printf("  %10zu %12zu %8s %5s %7s", bytes, count, std::string(tbverbs::dtype_name(t)).c_str(), redop, algorithm_of(bytes).c_str());
        for (const Run& r : res) {
          if (r.done) std::printf(" %10.1f %8.3f %8.3f %6" PRIu64, r.us, r.algbw, r.busbw, r.wrong);
          else std::printf(" %10s %8s %8s %6s", "-", "-", "-", "-");
        }
        std::printf("\n");
      }
      if (rank == 0) std::fflush(stdout);
    }
  if (rank == 0 && !o.csv) {
    std::printf("# Wrong elements       : %" PRIu64 " %s\n", wrong_total, wrong_total == 0 ? "OK" : "WRONG");
    std::printf("# Avg bus bandwidth    : %.3f GB/s (mean of the %d runs above)\n#\n",
                busbw_runs > 0 ? busbw_sum / busbw_runs : 0.0, busbw_runs);
    std::fflush(stdout);
  }
  for (const std::string& line : comm->traffic()) log(line);
  registrations.clear();
  // close(): every rank waits for the others before the links go (a rank that left early would
  // look lost to one still completing its last call).
  if (auto c = comm->close(); !c) return fail_rank(rank, "the final barrier", c.error());
  return exit_code;
}

// Options that each parse but together cannot be honoured: the reason, or "". Refused before
// anything runs (a run that silently ignored one would not be the run asked for).
std::string refused_combination(const CLI::App& app, const Options& o) {
  if (app.count("--root") > 0 && o.collective != "broadcast" && o.collective != "reduce" && o.collective != "gather" &&
      o.collective != "scatter")
    return "--root applies to --collective broadcast, reduce, gather and scatter (" + o.collective + " has no root)";
  if (o.kill_rank >= 0 && o.stop_rank >= 0) return "--kill-rank and --stop-rank: give one (the launcher fails one rank per run)";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ring_all_sum: the collectives layer's verified benchmark (all_reduce by default: the all_sum) on tbverbs"};
  Options o;
  app.add_option("--local", o.local, "Run N ranks on an emulated ring on this machine (Thunderbolt unless --profile)");
  app.add_option("--rank", o.rank, "This process' rank (default: $JACCL_RANK or $MLX_RANK)");
  app.add_option("--coordinator", o.coordinator, "host:port of rank 0 (default: $JACCL_COORDINATOR or $MLX_JACCL_COORDINATOR)");
  app.add_option("--devices", o.devices, "JACCL-style device file (default: $JACCL_IBV_DEVICES or $MLX_IBV_DEVICES)");
  app.add_option("--library", o.library, "verbs library to load (default: $TBVERBS_LIBRARY, then the platform's)");
  app.add_option("--emu-library", o.emu_library, "emulated verbs library for --local")->capture_default_str();
  app.add_option("-b,--size", o.size, "bytes of the whole vector (nccl-tests' size: all_gather's output, reduce_scatter's input; a "
                 "rank's block is size / ranks), e.g. 4K, 64M (the first of a sweep)")->capture_default_str();
  app.add_option("-e,--max-size", o.max_size, "sweep: multiply the size by --factor up to this");
  app.add_option("-f,--factor", o.factor, "sweep: the factor between sizes")->capture_default_str();
  app.add_option("--count", o.counts, "element counts (instead of --size), any numbers >= 1, comma-separated")
      ->delimiter(',');
  app.add_option("--collective", o.collective,
                 "all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter or all_to_all (nccl-tests' "
                 "sizes: the whole vector; a rank's block is size / ranks)")
      ->capture_default_str();
  app.add_option("--op", o.op, "sum, prod, min, max or avg (all_reduce, reduce_scatter, reduce; avg: floating types)")->capture_default_str();
  app.add_option("--root", o.root, "the root rank of broadcast, reduce, gather and scatter")->check(CLI::Range(0, 63))->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32, float64, float16, bfloat16, int8, int32, int64, uint8, uint32, uint64 or all")->capture_default_str();
  app.add_option("--place", o.place, "out (out-of-place), in (in-place) or both")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size, 1 or more (default: by size, 3 to 50)")->check(CLI::Range(1, 1000000000));
  app.add_option("-w,--warmup", o.warmup, "untimed iterations per size")->check(CLI::Range(0, 1000000000))->capture_default_str();
  app.add_option("--message-bytes", o.message, "largest message (whole 4 KiB frames)")->capture_default_str();
  app.add_option("--window", o.window, "messages in flight per direction")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--memory", o.memory,
                 "auto, registered (user buffers as regions of at most max_mr_size) or staged (copies through "
                 "registered scratch slots); auto registers the two buffers once (register_memory) while they fit "
                 "the devices' MR budget, else stages")
      ->capture_default_str();
  app.add_option("--transport", o.transport,
                 "auto, send (SEND/RECV) or write (RDMA WRITE with immediate into the peer's buffer; RC only, "
                 "SEND/RECV on Thunderbolt); auto takes the one measured faster on the emulator")
      ->capture_default_str();
  app.add_option("--algorithm", o.algorithm,
                 "auto, ring (reduce-scatter + all-gather, both directions), latency (every vector floor(n/2) hops "
                 "both ways, summed locally) or mesh (every vector straight to every rank: a fully connected job); "
                 "auto takes mesh (fully connected) or latency up to the measured crossover, ring above")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_ms, "ms: bound of every wait (no progress, side channel)")->capture_default_str();
  app.add_option("--gid-wait", o.gid_wait_ms, "ms to wait for an IPv4-mapped GID to appear")->check(CLI::Range(0, 3600000))->capture_default_str();
  app.add_flag("--csv", o.csv,
               "print the results as CSV (rank 0): a header line size_bytes,count,type,redop,place,time_us,"
               "algbw_gbps,busbw_gbps,wrong and one line per run, instead of the table");
  app.add_flag("--quiet", o.quiet, "no set-up lines");
  app.add_flag("--no-device-file", o.no_device_file,
               "discover which device faces which rank from the ports' subnets (one /30 per cable), as happens "
               "when no device file is given; with --local N the ranks get no device file");
  app.add_option("--ranks", o.ranks, "number of ranks when there is no device file (default: $TBVERBS_RANKS)");
  app.add_flag("--explain", o.explain,
               "print every INIT/RTR/RTS attribute, the capacities, the MR layout and the budget, each with why "
               "(TBVERBS_EXPLAIN=1)");
  app.add_option("--fabric", o.fabric, "--local: use this existing fabric file (its state is kept between runs)");
  app.add_option("--write-fabric", o.write_fabric, "--local: write the ring fabric for N hosts to this file and exit");
  app.add_flag("--keep", o.keep, "--local: keep the temporary directory");
  app.add_option("--quirk", o.quirks,
                 "--local: play a contested reading of Apple's driver, NAME=VALUE (repeatable; see docs/emulator.md), "
                 "e.g. empty_rq=drop, macos=26.2, mr_access=remote_required, completion_channels=on");
  app.add_flag("--mesh", o.mesh,
               "--local: a fully connected fabric (a cable between every pair of hosts) instead of a ring; the ring "
               "runs on it, and the mesh all_sum");
  app.add_option("--cables", o.cables, "--local: cables between neighbours (each one carries traffic)")
      ->capture_default_str();
  app.add_option("--link-gbps", o.link_gbps,
                 "--local: pace every cable direction at this bandwidth (GB/s = 10^9 bytes/s; 0: unpaced)");
  app.add_option("--link-latency-us", o.link_latency_us, "--local: and deliver each message this many us later");
  app.add_option("--profile", o.profile,
                 "--local: the emulated NICs: thunderbolt (Apple's driver, UC), usb4-rdma (the Linux Thunderbolt "
                 "driver usb4_rdma: RC between Linux hosts, Apple's UC toward a Mac), rdma-core-rc, rdma-core-roce "
                 "(mlx5: RoCE v1 and v2 entries per address) or rdma-core-ib (InfiniBand: LIDs, no IPv4 GIDs); a "
                 "comma-separated list gives the hosts its profiles in turn (thunderbolt,usb4-rdma: Macs and Linux "
                 "hosts alternate); see docs/rdma-core.md and docs/thunderbolt.md")
      ->capture_default_str(); // checked by tbverbs-emu run
  const CLI::Validator local_rank([&o](std::string& v) { return o.local < 1 ? std::string("applies to --local N only") : std::strtol(v.c_str(), nullptr, 10) < o.local ? std::string() : "must be a rank of --local " + std::to_string(o.local) + ": 0.." + std::to_string(o.local - 1); }, "RANK");  // --local is parsed first
  app.add_option("--kill-rank", o.kill_rank, "--local: SIGKILL this rank during the run (failure test)")->check(CLI::Range(0, 63))->check(local_rank);
  app.add_option("--stop-rank", o.stop_rank, "--local: SIGSTOP this rank during the run (alive but silent)")->check(CLI::Range(0, 63))->check(local_rank);
  app.add_option("--kill-after-line", o.kill_after_line,
                 "--local: count --kill-after from the first line a rank prints that contains this text "
                 "(\"# all_sum over\": rank 0's table header, once the ring is set up), not from the start");
  app.add_option("--kill-after", o.kill_after_ms, "--local: ms after the start (or --kill-after-line) for --kill-rank or --stop-rank")
      ->check(CLI::Range(0, 3600000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (const std::string why = refused_combination(app, o); !why.empty()) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 2;
  }

  if (o.local > 0) { // this process becomes `tbverbs-emu run` (launcher.hpp), which checks the fabric options
    ring::LocalOptions lo;
    lo.ranks = o.local;
    lo.emu_library = o.emu_library;
    lo.fabric = o.fabric;
    lo.timeout = std::chrono::milliseconds(o.timeout_ms);
    lo.kill_rank = o.stop_rank >= 0 ? o.stop_rank : o.kill_rank;
    lo.stop = o.stop_rank >= 0;
    lo.kill_after = std::chrono::milliseconds(o.kill_after_ms);
    lo.kill_after_line = o.kill_after_line;
    lo.keep = o.keep;
    lo.cables = o.cables;
    lo.quirks = o.quirks;
    lo.profile = o.profile;
    lo.no_device_file = o.no_device_file;
    lo.link = ring::LinkModel{o.link_gbps, o.link_latency_us};
    lo.mesh = o.mesh;
    if (!o.write_fabric.empty()) return ring::write_fabric(lo, o.write_fabric);
    // The ranks get every argument except the launcher's own.
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto takes_value = [&](const char* name) { return a == name; };
      if (takes_value("--local") || takes_value("--fabric") || takes_value("--kill-rank") || takes_value("--stop-rank") ||
          takes_value("--kill-after") || takes_value("--kill-after-line") || takes_value("--emu-library") || takes_value("--write-fabric") ||
          takes_value("--quirk") || takes_value("--cables") || takes_value("--profile") || takes_value("--link-gbps") ||
          takes_value("--link-latency-us")) {
        ++i;
        continue;
      }
      if (a == "--keep" || a == "--mesh" || a.rfind("--local=", 0) == 0 || a.rfind("--fabric=", 0) == 0 ||
          a.rfind("--kill-rank=", 0) == 0 || a.rfind("--stop-rank=", 0) == 0 || a.rfind("--kill-after=", 0) == 0 || a.rfind("--kill-after-line=", 0) == 0 || a.rfind("--emu-library=", 0) == 0 ||
          a.rfind("--quirk=", 0) == 0 || a.rfind("--cables=", 0) == 0 || a.rfind("--profile=", 0) == 0 ||
          a.rfind("--link-gbps=", 0) == 0 || a.rfind("--link-latency-us=", 0) == 0)
        continue;
      lo.args.push_back(a);
    }
    return ring::run_local(lo);
  }
  return run_rank(o);
}
