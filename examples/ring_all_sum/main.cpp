// ring_all_sum: a verified ring all_sum over RDMA on tbverbs.
//
// Over real hardware (Thunderbolt Macs, or rdma-core NICs), one process per host:
//   JACCL_RANK=0 JACCL_COORDINATOR=10.0.0.1:5555 JACCL_IBV_DEVICES=devices.json ./ring_all_sum --size 64M
// (MLX_RANK, MLX_JACCL_COORDINATOR and MLX_IBV_DEVICES work too, or --rank, --coordinator, --devices).
// On the emulated fabric, N ranks on this machine:
//   ./ring_all_sum --local 4 --size 64M
#include "../../tools/common/launcher_env.hpp"
#include "device_file.hpp"
#include "launcher.hpp"
#include "algorithms.hpp"

#include <tbverbs/topology.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

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

using ring::DType;

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
// The closed-form input pattern: rank r's element i is  base[r][i % 61] + (r == 0 ? i % P : 0)
// (plus a high component for int64 and float64, a fractional one for floats), every value and
// every partial sum exactly representable, so the result is checked with ==, whatever the order
// of the additions.
constexpr std::size_t kPeriod = 61;
std::size_t index_period(DType t) {
  switch (t) {
  case DType::f32: return 4093;
  case DType::f16: return 1024;  // |sum| <= 3 x 64 + 1023 < 2048: exact in binary16
  case DType::bf16: return 16;   // |sum| <= 3 x 64 + 15 < 256: exact with 8 significant bits
  default: return 1048573;
  }
}

template <class T> T value(DType t, int r, std::size_t i) {
  const bool narrow = t == DType::f16 || t == DType::bf16;  // |base| <= 3: sums of 64 ranks stay exact
  const long long mix = static_cast<long long>((i % kPeriod) * 7 + static_cast<std::size_t>(r) * 13);
  const long long base = narrow ? mix % 7 - 3 : mix % 61 - 30;
  const long long idx = r == 0 ? static_cast<long long>(i % index_period(t)) : 0;
  switch (t) {
  case DType::f32: return static_cast<T>(static_cast<double>(base + idx) + 0.25 * r);
  case DType::f64: return static_cast<T>(static_cast<double>(base + idx) + 0.5 * (r + 1) + (r + 1) * 1073741824.0);
  case DType::i32: return static_cast<T>(base + idx);
  case DType::i64: return static_cast<T>(base + idx + (static_cast<long long>(r + 1) << 33));
  case DType::f16:
  case DType::bf16: return static_cast<T>(base + idx);  // plain small integers (the float value)
  }
  return T{};
}

template <class T> void fill_typed(DType t, int r, T* p, std::size_t count) {
  T tab[kPeriod];
  for (std::size_t k = 0; k < kPeriod; ++k) tab[k] = value<T>(t, r, k) - (r == 0 ? static_cast<T>(k % index_period(t)) : T{});
  const std::size_t P = index_period(t);
  std::size_t k = 0, q = 0;
  for (std::size_t i = 0; i < count; ++i) {
    p[i] = tab[k] + (r == 0 ? static_cast<T>(q) : T{});
    if (++k == kPeriod) k = 0;
    if (++q == P) q = 0;
  }
}

// Returns the number of mismatches; prints the first few.
template <class T> std::size_t check_typed(DType t, int rank, int n, const T* p, std::size_t count) {
  T tab[kPeriod];
  for (std::size_t k = 0; k < kPeriod; ++k) {
    T s{};
    for (int r = 0; r < n; ++r) s += value<T>(t, r, k) - (r == 0 ? static_cast<T>(k % index_period(t)) : T{});
    tab[k] = s;
  }
  const std::size_t P = index_period(t);
  std::size_t bad = 0, k = 0, q = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const T want = tab[k] + static_cast<T>(q);
    if (p[i] != want) {
      if (bad < 5)
        std::printf("rank %d: MISMATCH at element %zu: got %.17g, expected %.17g\n", rank, i,
                    static_cast<double>(p[i]), static_cast<double>(want));
      ++bad;
    }
    if (++k == kPeriod) k = 0;
    if (++q == P) q = 0;
  }
  return bad;
}

// 16-bit floats: the values are computed in float (exact small integers) and stored rounded.
void fill16(DType t, int r, std::uint16_t* p, std::size_t count) {
  std::uint16_t tab[kPeriod];
  const std::size_t P = index_period(t);
  auto conv = [t](float f) { return t == DType::f16 ? ring::float_to_f16(f) : ring::float_to_bf16(f); };
  if (r != 0) {
    for (std::size_t k = 0; k < kPeriod; ++k) tab[k] = conv(value<float>(t, r, k));
    for (std::size_t i = 0, k = 0; i < count; ++i, k = k + 1 == kPeriod ? 0 : k + 1) p[i] = tab[k];
    return;
  }
  std::size_t k = 0, q = 0;
  for (std::size_t i = 0; i < count; ++i) {
    p[i] = conv(value<float>(t, 0, k) - static_cast<float>(k % P) + static_cast<float>(q));
    if (++k == kPeriod) k = 0;
    if (++q == P) q = 0;
  }
}
std::size_t check16(DType t, int rank, int n, const std::uint16_t* p, std::size_t count) {
  const std::size_t P = index_period(t);
  float tab[kPeriod];
  for (std::size_t k = 0; k < kPeriod; ++k) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value<float>(t, r, k) - (r == 0 ? static_cast<float>(k % P) : 0.0f);
    tab[k] = s;
  }
  std::size_t bad = 0, k = 0, q = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const float want = tab[k] + static_cast<float>(q);
    const float got = t == DType::f16 ? ring::f16_to_float(p[i]) : ring::bf16_to_float(p[i]);
    if (got != want) {
      if (bad < 5) std::printf("rank %d: MISMATCH at element %zu: got %.9g, expected %.9g\n", rank, i, got, want);
      ++bad;
    }
    if (++k == kPeriod) k = 0;
    if (++q == P) q = 0;
  }
  return bad;
}

void fill(DType t, int r, void* p, std::size_t count) {
  switch (t) {
  case DType::f16:
  case DType::bf16: fill16(t, r, static_cast<std::uint16_t*>(p), count); break;
  case DType::f32: fill_typed(t, r, static_cast<float*>(p), count); break;
  case DType::f64: fill_typed(t, r, static_cast<double*>(p), count); break;
  case DType::i32: fill_typed(t, r, static_cast<std::int32_t*>(p), count); break;
  case DType::i64: fill_typed(t, r, static_cast<std::int64_t*>(p), count); break;
  }
}
std::size_t check(DType t, int rank, int n, const void* p, std::size_t count) {
  switch (t) {
  case DType::f16:
  case DType::bf16: return check16(t, rank, n, static_cast<const std::uint16_t*>(p), count);
  case DType::f32: return check_typed(t, rank, n, static_cast<const float*>(p), count);
  case DType::f64: return check_typed(t, rank, n, static_cast<const double*>(p), count);
  case DType::i32: return check_typed(t, rank, n, static_cast<const std::int32_t*>(p), count);
  case DType::i64: return check_typed(t, rank, n, static_cast<const std::int64_t*>(p), count);
  }
  return count;
}

// ---------------------------------------------------------------------------------------------

struct Options {
  int local = 0;
  int rank = -1;
  std::string coordinator, devices, library, emu_library = TBVERBS_RING_EMU_LIBRARY;
  std::string size = "64M", max_size, dtype = "float32", place = "both";
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
};

int fail_rank(int rank, const std::string& where, const tbverbs::Error& e, tbverbs::SideChannel* sc) {
  // Before the rank is known the line names the program, not "rank -1" (issue 13).
  if (rank < 0) std::fprintf(stderr, "ring_all_sum: FAILED during %s: %s\n", where.c_str(), e.message().c_str());
  else std::fprintf(stderr, "rank %d: FAILED during %s: %s\n", rank, where.c_str(), e.message().c_str());
  std::fflush(stderr);
  if (sc != nullptr && sc->valid()) sc->abort(e);  // the other ranks learn who failed, and why
  return 2;
}

int run_rank(const Options& o) {
  // Who am I, where is the coordinator, how many ranks, which devices: flags first, then the
  // launchers' variables (tools/common/launcher_env.hpp: mlx.launch, torchrun, Open MPI, PMI, Slurm).
  std::string launcher_problem;
  const auto job = cli::launcher_job(launcher_problem);
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
  if (rank < 0) return config_error(std::string("no rank: pass --rank or set ") + cli::kRankVariables + "; or run --local N");
  if (coordinator.empty())
    return config_error(std::string("no coordinator: pass --coordinator host:port or set ") + cli::kCoordinatorVariables +
                        (job->launcher.empty() ? std::string() : " (" + job->launcher + " gave the rank, not the coordinator)"));
  // No device file (or --no-device-file): the cables are discovered from the ports' subnets once
  // the side channel is up (tbverbs/topology.hpp); the number of ranks then comes from --ranks.
  const bool discover = o.no_device_file || devices_path.empty();
  int n = 0;
  ring::Config cfg;
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

  // The device file (device_file.hpp: JACCL's matrix or mlx.distributed_config's hostfile).
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
  cfg.rank = rank;
  cfg.size = n;
  cfg.left_devices = cables->left;
  cfg.right_devices = cables->right;
  cfg.mesh_devices = cables->others;
  }
  cfg.rank = rank;
  cfg.size = n;
  auto msg = parse_size(o.message);
  if (!msg || *msg < 4096 || *msg % 4096 != 0)
    return config_error("--message-bytes must be a whole number of 4 KiB frames");
  cfg.message_bytes = *msg;
  cfg.window = std::max(1, o.window);
  if (o.memory == "auto") cfg.memory = ring::Memory::automatic;
  else if (o.memory == "registered") cfg.memory = ring::Memory::registered;
  else if (o.memory == "staged") cfg.memory = ring::Memory::staged;
  else return config_error("--memory must be auto, registered or staged");
  if (o.transport == "auto") cfg.transport = ring::Transport::automatic;
  else if (o.transport == "send") cfg.transport = ring::Transport::send;
  else if (o.transport == "write") cfg.transport = ring::Transport::write;
  else return config_error("--transport must be auto, send or write");
  if (o.algorithm == "auto") cfg.algorithm = ring::Algorithm::automatic;
  else if (o.algorithm == "ring") cfg.algorithm = ring::Algorithm::ring;
  else if (o.algorithm == "latency") cfg.algorithm = ring::Algorithm::latency;
  else if (o.algorithm == "mesh") cfg.algorithm = ring::Algorithm::mesh;
  else return config_error("--algorithm must be auto, ring, latency or mesh");
  cfg.timeout = std::chrono::milliseconds(o.timeout_ms);
  cfg.gid_wait = std::chrono::milliseconds(o.gid_wait_ms);
  cfg.log = [&, rank](const std::string& s) {
    if (!o.quiet) std::printf("rank %d: %s\n", rank, s.c_str());
    std::fflush(stdout);
  };
  // Explain mode (--explain or TBVERBS_EXPLAIN=1): every QP attribute, MR layout and budget with
  // its reason, one line each, prefixed like every other line of this rank (also with --quiet).
  if (o.explain) tbverbs::set_explain(true);
  tbverbs::set_explain_sink([rank](std::string_view l) {
    std::printf("rank %d: explain: %.*s\n", rank, static_cast<int>(l.size()), l.data());
    std::fflush(stdout);
  });

  // Sizes and types.
  std::vector<DType> types;
  if (o.dtype == "all") types = {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16};
  else if (o.dtype == "float32" || o.dtype == "f32") types = {DType::f32};
  else if (o.dtype == "float64" || o.dtype == "f64") types = {DType::f64};
  else if (o.dtype == "int32" || o.dtype == "i32") types = {DType::i32};
  else if (o.dtype == "int64" || o.dtype == "i64") types = {DType::i64};
  else if (o.dtype == "float16" || o.dtype == "f16") types = {DType::f16};
  else if (o.dtype == "bfloat16" || o.dtype == "bf16") types = {DType::bf16};
  else return config_error("--dtype must be float32, float64, int32, int64, float16, bfloat16 or all");
  std::vector<bool> places;
  if (o.place == "in") places = {true};
  else if (o.place == "out") places = {false};
  else if (o.place == "both") places = {false, true};
  else return config_error("--place must be in, out or both");
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
  std::size_t max_bytes = 0;
  for (std::size_t s : sizes) max_bytes = std::max(max_bytes, by_count ? s * 8 : s);

  // The side channel: rendezvous through rank 0, full mesh, liveness.
  tbverbs::SideChannelOptions sco;
  sco.rank = rank;
  sco.size = n;
  sco.coordinator = coordinator;
  // The job token: from the launcher's job id when there is one (--local passes a random one), so
  // two jobs that happen to use the same coordinator port refuse each other instead of joining
  // (issue 9); otherwise from the coordinator address, the same on every rank.
  const std::string job_id = env_of({"TBVERBS_JOB_ID", "SLURM_JOB_ID", "MLX_JOB_ID"}).value_or("");
  sco.job_token = tbverbs::side_channel_token("tbverbs ring_all_sum " + coordinator + " " + job_id);
  sco.timeout = cfg.timeout;
  auto sc = tbverbs::SideChannel::connect(sco);
  if (!sc) return fail_rank(rank, "the side-channel rendezvous with " + coordinator, sc.error(), nullptr);

  auto lib = tbverbs::Library::load(o.library);
  if (!lib) return fail_rank(rank, "loading the verbs library", lib.error(), &*sc);

  std::optional<tbverbs::Topology> topo;
  if (discover) {
    // Which device faces which rank, from the subnets the ports publish; the ring follows the
    // cables (in rank order when they allow it).
    auto t = tbverbs::discover_topology(*lib, *sc);
    if (!t) return fail_rank(rank, "discovering the cables", t.error(), &*sc);
    topo.emplace(std::move(*t));
    for (const auto& p : topo->problems()) cfg.log("topology: " + p);
    auto order = topo->ring();
    if (!order) {
      // Every rank computed the same graph and fails the same way: say what was found (also
      // with --quiet), then the error naming the hops without a cable.
      if (o.quiet)
        for (const auto& p : topo->problems()) std::fprintf(stderr, "rank %d: topology: %s\n", rank, p.c_str());
      for (const auto& c : topo->cables()) std::fprintf(stderr, "rank %d: topology: cable %s\n", rank, topo->describe_cable(c).c_str());
      return fail_rank(rank, "building the ring from the discovered cables", order.error(), nullptr);
    }
    cfg.order = *order;
    std::string line;
    for (int r : cfg.order) line += (line.empty() ? "" : " -> ") + std::to_string(r);
    cfg.log("ring order " + line + " -> " + std::to_string(cfg.order[0]) + " (discovered, no device file)");
    int pos = 0;
    for (int i = 0; i < n; ++i)
      if (cfg.order[static_cast<std::size_t>(i)] == rank) pos = i;
    const int left = cfg.order[static_cast<std::size_t>((pos + n - 1) % n)];
    const int right = cfg.order[static_cast<std::size_t>((pos + 1) % n)];
    auto mine = [&](int peer) {
      std::vector<std::string> d;
      for (const auto& c : topo->between(rank, peer)) {
        d.push_back(topo->end(c, rank).device);
        cfg.log("cable to rank " + std::to_string(peer) + ": " + topo->describe_cable(c));
      }
      return d;
    };
    if (n == 2) {
      // The cables between the two ranks are shared out as a device file would (even ones carry
      // position 0's rightward hop, odd ones position 1's; one cable carries both).
      const auto cables = mine(right);
      std::vector<std::string> even, odd;
      for (std::size_t k = 0; k < cables.size(); ++k) (k % 2 == 0 ? even : odd).push_back(cables[k]);
      if (odd.empty()) odd = even;
      cfg.right_devices = pos == 0 ? even : odd;
      cfg.left_devices = pos == 0 ? odd : even;
    } else {
      cfg.right_devices = mine(right);
      cfg.left_devices = mine(left);
      // A fully connected job: the first cable to every other rank, for the mesh all_sum.
      cfg.mesh_devices.assign(static_cast<std::size_t>(n), std::string());
      for (int p = 0; p < n; ++p)
        if (p != rank && p != left && p != right)
          if (const auto c = topo->between(rank, p); !c.empty())
            cfg.mesh_devices[static_cast<std::size_t>(p)] = topo->end(c.front(), rank).device;
    }
  }
  if (cfg.algorithm == ring::Algorithm::mesh && n >= 4) {
    int missing = 0;
    for (int p = 0; p < n; ++p) {
      const int pos = static_cast<int>(std::find(cfg.order.begin(), cfg.order.end(), rank) - cfg.order.begin());
      const bool neighbour = cfg.order.empty() ? (p == (rank + 1) % n || p == (rank + n - 1) % n)
                                               : (p == cfg.order[static_cast<std::size_t>((pos + 1) % n)] ||
                                                  p == cfg.order[static_cast<std::size_t>((pos + n - 1) % n)]);
      if (p != rank && !neighbour && (static_cast<std::size_t>(p) >= cfg.mesh_devices.size() || cfg.mesh_devices[static_cast<std::size_t>(p)].empty()))
        ++missing;
    }
    if (missing > 0)
      return config_error("--algorithm mesh needs a cable between every pair of ranks: rank " + std::to_string(rank) +
                          " has none toward " + std::to_string(missing) + " rank(s) (a fully connected device file, "
                          "or --local N --mesh)");
  }
  auto ringp = ring::Ring::create(*lib, *sc, cfg, max_bytes);
  if (!ringp) {
    // Discovered cables whose RTR times out: the addresses say these two ports share a subnet, the
    // driver says they are not the ends of one cable (the addresses are crossed between cables).
    const tbverbs::Error& e = ringp.error();
    if (topo && e.step == tbverbs::Step::modify_qp_rtr && e.is(ETIMEDOUT))
      if (auto c = topo->cable_of(rank, e.device.view()))
        std::fprintf(stderr,
                     "rank %d: topology: crossed? the subnets pair %s, but RTR toward it timed out: that port's "
                     "cable goes elsewhere; give the two ends of each cable one /30 of their own\n",
                     rank, topo->describe_cable(*c).c_str());
    return fail_rank(rank, "setting up the ring", ringp.error(), &*sc);
  }
  ring::Ring& R = **ringp;

  cfg.log("algorithm " + R.algorithm_rule());

  // The results in the conventions of nccl-tests (rank 0 prints them): one row per (type, size),
  // out-of-place and in-place side by side, or with --csv one line per run.
  struct Run {
    bool done = false;
    double us = 0, algbw = 0, busbw = 0;
    std::uint64_t wrong = 0;
  };
  // One verified and timed all_sum; returns the launcher's exit code on failure.
  auto run_one = [&](DType t, std::size_t count, bool in_place, Run& res) -> int {
    const std::size_t bytes = count * ring::dtype_size(t);
    int iters = o.iters;
    if (iters <= 0) iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / std::max<std::size_t>(bytes, 1), 3, 50));
    void* in = R.input().data();
    void* out = in_place ? in : R.output().data();
    const std::string what = " (" + human(bytes) + " " + ring::dtype_name(t) + ", " +
                             ring::algorithm_name(R.choose(bytes)) + ")";
    // 1. The verified run: fresh input, a poisoned output (stale data must not pass the check),
    //    a barrier of every rank before the first send.
    fill(t, rank, in, count);
    if (!in_place) std::memset(out, 0xff, bytes);
    if (auto r = R.all_sum(count, t, in_place, [&] { return sc->barrier(); }); !r)
      return fail_rank(rank, R.where() + what, r.error(), &*sc);
    const std::size_t bad = check(t, rank, n, out, count);
    // 2. Timed runs, back to back as nccl-tests times them: between two all_sums a rank only
    //    tells its two neighbours that its receives are posted. In place, each run sums the
    //    previous sums (integers wrap, floats grow): same work, checked in step 1.
    auto neighbours = [&] { return R.neighbours_posted(); };
    for (int it = 0; it < o.warmup; ++it)
      if (auto r = R.all_sum(count, t, in_place, neighbours); !r)
        return fail_rank(rank, R.where() + what, r.error(), &*sc);
    if (auto b = sc->barrier(); !b) return fail_rank(rank, "the barrier before the timed runs", b.error(), &*sc);
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it)
      if (auto r = R.all_sum(count, t, in_place, neighbours); !r)
        return fail_rank(rank, R.where() + what, r.error(), &*sc);
    const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Every rank's verdict and time, so rank 0's summary covers the whole job: the slowest
    // rank's time, the wrong elements of all.
    std::byte mine[16];
    std::uint64_t bad64 = bad, ns = static_cast<std::uint64_t>(total_s * 1e9);
    std::memcpy(mine, &bad64, 8);
    std::memcpy(mine + 8, &ns, 8);
    auto all = sc->all_gather(mine);
    if (!all) return fail_rank(rank, "gathering the results", all.error(), &*sc);
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
    res.busbw = res.algbw * 2.0 * (n - 1) / n;  // nccl-tests' bus bandwidth of all_reduce
    return 0;
  };
  if (rank == 0) {
    if (o.csv) {
      std::printf("size_bytes,count,type,redop,place,time_us,algbw_gbps,busbw_gbps,wrong\n");
    } else {
      std::printf("#\n# all_sum over %d ranks; %s iterations per size, %d warm-up; time: the slowest rank's mean\n"
                  "# algorithm %s\n",
                  n, o.iters > 0 ? std::to_string(o.iters).c_str() : "3 to 50 (by size)", o.warmup,
                  R.algorithm_rule().c_str());
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
      const std::size_t es = ring::dtype_size(t);
      const std::size_t count = by_count ? s : std::max<std::size_t>(1, s / es);
      const std::size_t bytes = count * es;
      Run res[2];  // out of place, in place
      for (bool in_place : places) {
        Run& r = res[in_place ? 1 : 0];
        if (const int rc = run_one(t, count, in_place, r); rc != 0) return rc;
        busbw_sum += r.busbw;
        ++busbw_runs;
        wrong_total += r.wrong;
        if (r.wrong != 0) exit_code = 3;
        if (rank == 0 && o.csv)
          std::printf("%zu,%zu,%s,sum,%s,%.3f,%.6f,%.6f,%" PRIu64 "\n", bytes, count, ring::dtype_name(t),
                      in_place ? "in" : "out", r.us, r.algbw, r.busbw, r.wrong);
      }
      if (rank == 0 && !o.csv) {
        std::printf("  %10zu %12zu %8s %5s %7s", bytes, count, ring::dtype_name(t), "sum", ring::algorithm_name(R.choose(bytes)));
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
  if (auto b = sc->barrier(); !b) return fail_rank(rank, "the final barrier", b.error(), &*sc);
  for (const std::string& line : R.traffic()) cfg.log(line);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ring_all_sum: a verified ring all_sum (reduce-scatter + all-gather, both ring directions) on tbverbs"};
  Options o;
  app.add_option("--local", o.local, "Run N ranks on an emulated ring on this machine (Thunderbolt unless --profile)");
  app.add_option("--rank", o.rank, "This process' rank (default: $JACCL_RANK or $MLX_RANK)");
  app.add_option("--coordinator", o.coordinator, "host:port of rank 0 (default: $JACCL_COORDINATOR or $MLX_JACCL_COORDINATOR)");
  app.add_option("--devices", o.devices, "JACCL-style device file (default: $JACCL_IBV_DEVICES or $MLX_IBV_DEVICES)");
  app.add_option("--library", o.library, "verbs library to load (default: $TBVERBS_LIBRARY, then the platform's)");
  app.add_option("--emu-library", o.emu_library, "emulated verbs library for --local")->capture_default_str();
  app.add_option("-b,--size", o.size, "bytes per rank, e.g. 4K, 64M (the first of a sweep)")->capture_default_str();
  app.add_option("-e,--max-size", o.max_size, "sweep: multiply the size by --factor up to this");
  app.add_option("-f,--factor", o.factor, "sweep: the factor between sizes")->capture_default_str();
  app.add_option("--count", o.counts, "element counts (instead of --size), any numbers >= 1, comma-separated")
      ->delimiter(',');
  app.add_option("--dtype", o.dtype, "float32, float64, int32, int64, float16, bfloat16 or all")->capture_default_str();
  app.add_option("--place", o.place, "out (out-of-place), in (in-place) or both")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size, 1 or more (default: by size, 3 to 50)")->check(CLI::Range(1, 1000000000));
  app.add_option("-w,--warmup", o.warmup, "untimed iterations per size")->check(CLI::Range(0, 1000000000))->capture_default_str();
  app.add_option("--message-bytes", o.message, "largest message (whole 4 KiB frames)")->capture_default_str();
  app.add_option("--window", o.window, "messages in flight per direction")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--memory", o.memory,
                 "auto, registered (user buffers as regions of at most max_mr_size) or staged (copies through "
                 "registered scratch slots); auto registers while the regions fit the devices' budget")
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
                 "--local: the emulated NICs: thunderbolt (Apple's driver, UC), rdma-core-rc, rdma-core-roce (mlx5: "
                 "RoCE v1 and v2 entries per address) or rdma-core-ib (InfiniBand: LIDs, no IPv4 GIDs); see docs/rdma-core.md")
      ->check(CLI::IsMember({"thunderbolt", "rdma-core-rc", "rdma-core-roce", "rdma-core-ib"}))
      ->capture_default_str();
  const CLI::Validator local_rank([&o](std::string& v) { return o.local < 1 ? std::string("applies to --local N only") : std::strtol(v.c_str(), nullptr, 10) < o.local ? std::string() : "must be a rank of --local " + std::to_string(o.local) + ": 0.." + std::to_string(o.local - 1); }, "RANK");  // --local is parsed first
  app.add_option("--kill-rank", o.kill_rank, "--local: SIGKILL this rank during the run (failure test)")->check(CLI::Range(0, 63))->check(local_rank);
  app.add_option("--stop-rank", o.stop_rank, "--local: SIGSTOP this rank during the run (alive but silent)")->check(CLI::Range(0, 63))->check(local_rank);
  app.add_option("--kill-after", o.kill_after_ms, "--local: ms after the start for --kill-rank or --stop-rank")
      ->check(CLI::Range(0, 3600000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (o.local > 0) {
    if (o.mesh && o.cables != 1) {
      std::fprintf(stderr, "--mesh has one cable between every pair of hosts: no --cables\n");
      return 2;
    }
    if (o.cables < 1 || o.cables > 16) {
      std::fprintf(stderr, "--cables must be 1..16\n");
      return 2;
    }
    if (!(o.link_gbps >= 0 && o.link_gbps <= 1e4) || !(o.link_latency_us >= 0 && o.link_latency_us <= 1e7)) {
      std::fprintf(stderr, "--link-gbps must be 0..10000 GB/s and --link-latency-us 0..10000000\n");
      return 2;
    }
    const ring::LinkModel link{o.link_gbps, o.link_latency_us};
    if (!o.write_fabric.empty()) {
      std::ofstream(o.write_fabric) << (o.mesh ? ring::mesh_fabric(o.local, o.quirks, o.profile, link)
                                               : ring::ring_fabric(o.local, o.cables, o.quirks, o.profile, link))
                                            .dump(2)
                                     << "\n";
      std::printf("wrote the fabric of a %d-host ring to %s\n", o.local, o.write_fabric.c_str());
      return 0;
    }
    ring::LocalOptions lo;
    lo.ranks = o.local;
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    lo.self = len > 0 ? std::string(self, static_cast<std::size_t>(len)) : std::string(argv[0]);
    lo.emu_library = o.emu_library;
    if (lo.emu_library.empty()) {
      std::fprintf(stderr, "--local needs the emulated verbs library: pass --emu-library PATH\n");
      return 2;
    }
    lo.fabric = o.fabric;
    lo.timeout = std::chrono::milliseconds(o.timeout_ms);
    lo.kill_rank = o.stop_rank >= 0 ? o.stop_rank : o.kill_rank;
    lo.stop = o.stop_rank >= 0;
    lo.kill_after = std::chrono::milliseconds(o.kill_after_ms);
    lo.keep = o.keep;
    lo.cables = o.cables;
    lo.quirks = o.quirks;
    lo.profile = o.profile;
    lo.no_device_file = o.no_device_file;
    lo.link = link;
    lo.mesh = o.mesh;
    // The ranks get every argument except the launcher's own.
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto takes_value = [&](const char* name) { return a == name; };
      if (takes_value("--local") || takes_value("--fabric") || takes_value("--kill-rank") || takes_value("--stop-rank") ||
          takes_value("--kill-after") || takes_value("--emu-library") || takes_value("--write-fabric") ||
          takes_value("--quirk") || takes_value("--cables") || takes_value("--profile") || takes_value("--link-gbps") ||
          takes_value("--link-latency-us")) {
        ++i;
        continue;
      }
      if (a == "--keep" || a == "--mesh" || a.rfind("--local=", 0) == 0 || a.rfind("--fabric=", 0) == 0 ||
          a.rfind("--kill-rank=", 0) == 0 || a.rfind("--stop-rank=", 0) == 0 || a.rfind("--kill-after=", 0) == 0 || a.rfind("--emu-library=", 0) == 0 ||
          a.rfind("--quirk=", 0) == 0 || a.rfind("--cables=", 0) == 0 || a.rfind("--profile=", 0) == 0 ||
          a.rfind("--link-gbps=", 0) == 0 || a.rfind("--link-latency-us=", 0) == 0)
        continue;
      lo.args.push_back(a);
    }
    return ring::run_local(lo);
  }
  return run_rank(o);
}
