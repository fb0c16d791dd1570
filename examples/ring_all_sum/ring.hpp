// A ring all_sum on tbverbs: the collective backend this example is about.
//
// Every rank has two links: to its right neighbour (rank + 1) and to its left one (rank - 1),
// usually on two Thunderbolt ports. The buffer is cut into `size` chunks; each chunk is cut in two
// halves that travel the ring in opposite directions, so both directions of every cable are busy
// at once. Each half is cut again into pieces ("messages") of at most `message_bytes`, and up to
// `window` messages per direction are in flight, with receives posted ahead as credits.
//
// Reduce-scatter (size - 1 steps) then all-gather (size - 1 steps). In direction R (rightwards)
// rank r sends chunk (r - s) and receives chunk (r - s - 1) at reduce-scatter step s; direction L
// mirrors it. A piece received during reduce-scatter lands in a scratch slot and is added into the
// output at once (overlapping the next pieces' transfer); during all-gather pieces land straight in
// the output.
//
// Credits without extra messages: on every cable both directions carry the same sequence of
// messages (the same step and piece numbers), so message j from the peer proves that the peer had
// posted its receives for my messages up to j + window before it sent it. A rank therefore sends its
// message j only after receiving the peer's message j - window, and posts its receives for the
// peer's messages up to j + window before sending its message j. Dependencies always point to
// smaller message numbers, so the schedule cannot deadlock, and no send ever meets an empty receive
// queue (which kills the direction on Apple's driver).
#pragma once

#include <tbverbs/link.hpp>
#include <tbverbs/side_channel.hpp>
#include <tbverbs/tbverbs.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ring {

using tbverbs::Error;
using tbverbs::ErrorKind;
using tbverbs::Result;
using tbverbs::Step;
using tbverbs::fail;

/// Element types the ring can sum. float16 and bfloat16 are stored as 16-bit patterns and added
/// in float32, rounded to nearest even (as MLX does on the CPU).
enum class DType { f32, f64, i32, i64, f16, bf16 };

inline std::size_t dtype_size(DType t) {
  switch (t) {
  case DType::f32:
  case DType::i32: return 4;
  case DType::f64:
  case DType::i64: return 8;
  case DType::f16:
  case DType::bf16: return 2;
  }
  return 1;
}
inline const char* dtype_name(DType t) {
  switch (t) {
  case DType::f32: return "float32";
  case DType::f64: return "float64";
  case DType::i32: return "int32";
  case DType::i64: return "int64";
  case DType::f16: return "float16";
  case DType::bf16: return "bfloat16";
  }
  return "?";
}

/// IEEE binary16 and bfloat16 to and from float (round to nearest even), without compiler
/// extensions, so the example builds with any C++20 compiler.
inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man x 2^-24, exact in float
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  const std::uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t float_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t sign = (u >> 16) & 0x8000u, man = u & 0x7fffffu;
  const int e32 = static_cast<int>((u >> 23) & 0xffu);
  if (e32 == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0u));
  const int exp = e32 - 127 + 15;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (exp <= 0) {                                                  // subnormal or zero
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    const std::uint32_t m = man | 0x800000u;
    const int shift = 14 - exp;
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(h);
}

/// dst[i] = a[i] + b[i] for `n` elements of `t` (dst may be a).
inline void add(DType t, void* dst, const void* a, const void* b, std::size_t n) {
  auto run = [&](auto* d, const auto* x, const auto* y) {
    for (std::size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
  };
  switch (t) {
  case DType::f32: run(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b)); break;
  case DType::f64: run(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b)); break;
  // Integers wrap (two's complement, as the hardware adds), never signed-overflow UB.
  case DType::i32:
    run(static_cast<std::uint32_t*>(dst), static_cast<const std::uint32_t*>(a), static_cast<const std::uint32_t*>(b));
    break;
  case DType::i64:
    run(static_cast<std::uint64_t*>(dst), static_cast<const std::uint64_t*>(a), static_cast<const std::uint64_t*>(b));
    break;
  case DType::f16:
  case DType::bf16: {
    auto* d = static_cast<std::uint16_t*>(dst);
    const auto* x = static_cast<const std::uint16_t*>(a);
    const auto* y = static_cast<const std::uint16_t*>(b);
    if (t == DType::f16)
      for (std::size_t i = 0; i < n; ++i) d[i] = float_to_f16(f16_to_float(x[i]) + f16_to_float(y[i]));
    else
      for (std::size_t i = 0; i < n; ++i) d[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(y[i]));
    break;
  }
  }
}

/// How the ring is set up.
struct Config {
  int rank = 0;
  int size = 1;
  std::string left_device;   // device of the link to rank - 1
  std::string right_device;  // device of the link to rank + 1
  std::size_t message_bytes = 256 * 1024;  // largest message (a whole number of 4 KiB frames)
  int window = 8;                          // messages in flight per direction
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds gid_wait{1000};  // how long to wait for an IPv4-mapped GID to appear
  std::function<void(const std::string&)> log;  // progress lines
};

/// One device as the ring uses it.
struct Port {
  std::string name;
  std::optional<tbverbs::Context> context;
  std::optional<tbverbs::ProtectionDomain> pd;
  std::optional<tbverbs::GidSelection> gid;
};

/// A registered buffer: one page-aligned allocation, one memory region per device.
struct Buffer {
  std::optional<tbverbs::AlignedBuffer> memory;
  std::optional<tbverbs::MemoryRegion> mr[2];  // [0] on the left device, [1] on the right one
  std::byte* data() const { return memory->data(); }
  std::size_t size() const { return memory->size(); }
};

/// The ring: devices, links, buffers, and the all_sum.
class Ring {
public:
  /// Opens the devices, selects GIDs, connects and verifies both links, registers the buffers.
  static Result<std::unique_ptr<Ring>> create(const tbverbs::Library& lib, tbverbs::SideChannel& sc,
                                              const Config& cfg, std::size_t max_bytes) {
    auto r = std::unique_ptr<Ring>(new Ring(sc, cfg));
    if (auto s = r->open_ports(lib); !s) return fail(s.error());
    if (auto s = r->connect(); !s) return fail(s.error());
    if (auto s = r->allocate(max_bytes); !s) return fail(s.error());
    return r;
  }

  /// The input and output buffers (in-place runs use `input()` for both).
  Buffer& input() { return in_; }
  Buffer& output() { return out_; }
  const Config& config() const { return cfg_; }
  /// "Receives posted" with the two neighbours only (tbverbs::receives_posted on both links): what
  /// all_sum's `before_start` needs between back-to-back all_sums, since a rank only ever sends to
  /// its neighbours. A global barrier works too, but costs two hops through rank 0.
  Result<void> neighbours_posted() {
    ++epoch_;
    return tbverbs::receives_posted(mailbox_, links_, epoch_, std::chrono::steady_clock::now() + cfg_.timeout);
  }
  /// The phase the last failure happened in ("reduce-scatter step 2 ...").
  const std::string& where() const { return where_; }

  /// Sums `count` elements of `t` over all ranks: from input() into output(), or in place in
  /// input(). Every rank calls it with the same arguments. `before_start` runs after this rank's
  /// receives are posted and must not return before both neighbours have posted theirs: a barrier
  /// of every rank, or neighbours_posted().
  Result<void> all_sum(std::size_t count, DType t, bool in_place, const std::function<Result<void>()>& before_start);

private:
  Ring(tbverbs::SideChannel& sc, Config cfg) : sc_(sc), mailbox_(sc), cfg_(std::move(cfg)) {}

  Result<void> open_ports(const tbverbs::Library& lib);
  Result<void> connect();
  Result<void> allocate(std::size_t max_bytes);

  tbverbs::SideChannel& sc_;
  tbverbs::LinkMailbox mailbox_;
  Config cfg_;
  std::vector<std::unique_ptr<Port>> ports_;  // one per distinct device
  Port* side_[2] = {nullptr, nullptr};        // [0] left, [1] right
  std::vector<tbverbs::Link> links_;          // [0] left, [1] right
  Buffer in_, out_, scratch_;
  std::uint32_t epoch_ = 0;
  std::string where_;
};

inline void say(const Config& c, const std::string& s) {
  if (c.log) c.log(s);
}

inline Result<void> Ring::open_ports(const tbverbs::Library& lib) {
  const std::string names[2] = {cfg_.left_device, cfg_.right_device};
  const char* side_name[2] = {"left", "right"};
  for (int s = 0; s < 2; ++s) {
    for (auto& p : ports_)
      if (p->name == names[s]) side_[s] = p.get();
    if (side_[s] != nullptr) continue;
    auto p = std::make_unique<Port>();
    p->name = names[s];
    where_ = "opening device " + names[s];
    auto ctx = tbverbs::Context::open(lib, names[s]);
    if (!ctx) return fail(ctx.error());
    p->context.emplace(std::move(*ctx));
    where_ = "checking port 1 of " + names[s];
    if (auto port = p->context->require_active_port(1); !port) return fail(port.error());
    // The IPv4-mapped GID appears only once the interface has an address, and may arrive late
    // (APIPA): re-read the table until it is there or the bound passes.
    where_ = "selecting the GID of " + names[s];
    const auto until = std::chrono::steady_clock::now() + cfg_.gid_wait;
    for (;;) {
      auto table = p->context->gid_table(1);
      if (!table) return fail(table.error());
      auto sel = table->select();
      if (sel) {
        p->gid.emplace(*sel);
        break;
      }
      if (!sel.error().is(ErrorKind::no_ipv4_gid) || std::chrono::steady_clock::now() >= until)
        return fail(sel.error());
      ::usleep(50 * 1000);
    }
    where_ = "allocating the protection domain of " + names[s];
    auto pd = p->context->alloc_pd();
    if (!pd) return fail(pd.error());
    p->pd.emplace(std::move(*pd));
    side_[s] = p.get();
    ports_.push_back(std::move(p));
  }
  for (int s = 0; s < 2; ++s) {
    const auto& g = *side_[s]->gid;
    const int peer = s == 0 ? (cfg_.rank + cfg_.size - 1) % cfg_.size : (cfg_.rank + 1) % cfg_.size;
    say(cfg_, std::string(side_name[s]) + " link to rank " + std::to_string(peer) + ": " + side_[s]->name +
                  " port " + std::to_string(g.port()) + " GID[" + std::to_string(g.index()) + "] " +
                  g.gid().to_string() + " (" + std::string(g.reason()) + ")");
  }
  return {};
}

inline Result<void> Ring::connect() {
  const int n = cfg_.size, r = cfg_.rank;
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  const std::uint32_t frames = tbverbs::frames_of(cfg_.message_bytes);
  // Depths in 4 KiB frames: 2 x window messages may be posted ahead per direction, and the
  // driver takes at most 4095 frames per queue, so large messages mean a smaller window.
  const int fit = static_cast<int>((tbverbs::max_depth_frames - frames) / (2 * frames));
  if (fit < 1)
    return fail(Error::make(Step::configure, ErrorKind::capacity,
                            "messages of " + std::to_string(cfg_.message_bytes) +
                                " bytes are too large for a window of one within 4095 frames"));
  if (cfg_.window > fit) {
    say(cfg_, "window lowered from " + std::to_string(cfg_.window) + " to " + std::to_string(fit) +
                  " messages: " + std::to_string(frames) + " frames each, 4095 frames per queue");
    cfg_.window = fit;
  }
  const std::uint32_t depth = std::min<std::uint32_t>(tbverbs::max_depth_frames, frames * 2 * cfg_.window + frames);
  tbverbs::LinkSpec specs[2];
  for (int s = 0; s < 2; ++s) {
    Port& p = *side_[s];
    specs[s].peer = s == 0 ? left : right;
    specs[s].id = static_cast<std::uint32_t>(s == 0 ? left : r);  // the cable's index: its left end's rank
    specs[s].context = &*p.context;
    specs[s].pd = &*p.pd;
    specs[s].recipe.emplace(tbverbs::QpRecipe::for_platform(p.context->platform(), *p.gid));
    specs[s].recipe->capacities({depth, depth, 1, 1, 0});
  }
  tbverbs::LinkOptions opt;
  opt.warmup_bytes = cfg_.message_bytes;
  opt.timeout = cfg_.timeout;
  opt.on_retry = [&](std::uint32_t id, int attempt, const std::string& why) {
    say(cfg_, "link " + std::to_string(id) + ": warm-up attempt " + std::to_string(attempt) + " failed (" + why +
                  "); recreating the QP and CQ with a new PSN");
  };
  where_ = "connecting the links (endpoint exchange, warm-up)";
  auto links = tbverbs::connect_links(mailbox_, specs, opt);
  if (!links) return fail(links.error());
  links_ = std::move(*links);
  for (int s = 0; s < 2; ++s)
    say(cfg_, std::string(s == 0 ? "left" : "right") + " link " + std::to_string(links_[s].id()) + " to rank " +
                  std::to_string(links_[s].peer()) + " verified (warm-up of " + std::to_string(cfg_.message_bytes) +
                  " bytes both ways, attempt " + std::to_string(links_[s].attempts()) + ")");
  return {};
}

inline Result<void> Ring::allocate(std::size_t max_bytes) {
  where_ = "registering buffers";
  auto reg = [&](Buffer& b, std::size_t bytes) -> Result<void> {
    auto m = tbverbs::AlignedBuffer::allocate(bytes);
    if (!m) return fail(m.error());
    b.memory.emplace(std::move(*m));
    for (int s = 0; s < 2; ++s) {
      if (s == 1 && side_[1] == side_[0]) break;  // one device: one region serves both links
      auto mr = side_[s]->pd->reg_mr(*b.memory);
      if (!mr) return fail(mr.error());
      b.mr[s].emplace(std::move(*mr));
    }
    return {};
  };
  if (auto s = reg(in_, max_bytes); !s) return s;
  if (auto s = reg(out_, max_bytes); !s) return s;
  // Scratch: per direction 2 x window slots of one message each, plus one page at the end for the
  // placeholder of empty messages.
  if (auto s = reg(scratch_, 2 * 2 * static_cast<std::size_t>(cfg_.window) * cfg_.message_bytes + 4096); !s) return s;
  return {};
}

inline Result<void> Ring::all_sum(std::size_t count, DType t, bool in_place,
                                  const std::function<Result<void>()>& before_start) {
  using clock = std::chrono::steady_clock;
  const int n = cfg_.size, r = cfg_.rank;
  const std::size_t es = dtype_size(t);
  const std::size_t W = static_cast<std::size_t>(cfg_.window);
  const std::size_t S = 2 * W;  // scratch slots per direction
  const std::size_t pe = std::max<std::size_t>(1, cfg_.message_bytes / es);  // elements per message
  auto chunk_begin = [&](int c) { return count * static_cast<std::size_t>(c) / static_cast<std::size_t>(n); };
  const std::size_t max_chunk = (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
  const std::size_t max_half = (max_chunk + 1) / 2;
  const std::size_t m = std::max<std::size_t>(1, (max_half + pe - 1) / pe);  // messages per half-chunk
  const std::size_t steps = 2 * static_cast<std::size_t>(n - 1);
  const std::size_t T = steps * m;  // messages per direction

  std::byte* const src = in_.data();                           // this rank's contribution
  std::byte* const dst = in_place ? in_.data() : out_.data();  // the result
  Buffer& dbuf = in_place ? in_ : out_;
  const std::size_t slot_bytes = cfg_.message_bytes;

  // Element range [b, e) of message j in direction d (0 = R, 1 = L), as sent (send) or received.
  auto mod = [n](long long x) { return static_cast<int>(((x % n) + n) % n); };
  auto chunk_of = [&](int d, std::size_t step, bool sending) {
    const long long s = static_cast<long long>(step);
    const bool rs = step < static_cast<std::size_t>(n - 1);
    const long long sp = s - (n - 1);
    if (d == 0) return sending ? (rs ? mod(r - s) : mod(r + 1 - sp)) : (rs ? mod(r - s - 1) : mod(r - sp));
    return sending ? (rs ? mod(r + s) : mod(r - 1 + sp)) : (rs ? mod(r + s + 1) : mod(r + sp));
  };
  struct Range {
    std::size_t b, e;
  };
  auto range = [&](int d, std::size_t j, bool sending) {
    const int c = chunk_of(d, j / m, sending);
    const std::size_t cb = chunk_begin(c), ce = chunk_begin(c + 1);
    const std::size_t mid = cb + (ce - cb + 1) / 2;
    const std::size_t hb = d == 0 ? cb : mid, he = d == 0 ? mid : ce;
    const std::size_t k = j % m;
    const std::size_t b = std::min(he, hb + k * pe), e = std::min(he, hb + (k + 1) * pe);
    return Range{b, e};
  };

  // Per direction d: links_[1 - d] sends it (R goes right), links_[d] receives it.
  // Note the MR index: mr[s] is the region on side s's device.
  auto mr_on = [&](Buffer& b, int side) -> tbverbs::MemoryRegion& { return b.mr[side] ? *b.mr[side] : *b.mr[0]; };
  std::size_t posted[2] = {0, 0}, received[2] = {0, 0}, sent[2] = {0, 0}, send_done[2] = {0, 0};
  const std::size_t max_in_flight = S;

  auto is_rs = [&](std::size_t j) { return j / m < static_cast<std::size_t>(n - 1); };
  // An empty piece (fewer elements than ranks, or uneven halves) still travels, so that both
  // directions of a cable keep the same message numbering, but as a 4-byte placeholder in the
  // scratch buffer's last page: whether Apple's driver accepts zero-length work requests is
  // not documented. Both sides know the piece is empty, so the frame counts still match.
  constexpr std::size_t placeholder = 4;
  const std::size_t placeholder_off = 2 * S * slot_bytes;

  auto post_recv = [&](int d) -> Result<void> {
    const int side = d == 0 ? 0 : 1;  // R arrives from the left, L from the right
    const std::size_t j = posted[d];
    const Range rg = range(d, j, false);
    const std::size_t len = (rg.e - rg.b) * es;
    tbverbs::Result<tbverbs::abi::ibv_sge> sge = fail(Error());
    if (len == 0) {
      sge = mr_on(scratch_, side).sge(placeholder_off, placeholder);
    } else if (is_rs(j)) {
      const std::size_t off = (static_cast<std::size_t>(d) * S + j % S) * slot_bytes;
      sge = mr_on(scratch_, side).sge(off, len);
    } else {
      sge = mr_on(dbuf, side).sge(rg.b * es, len);
    }
    if (!sge) return fail(sge.error());
    if (auto p = links_[side].qp().recv(j, *sge); !p) return fail(p.error());
    ++posted[d];
    return {};
  };
  auto post_send = [&](int d) -> Result<void> {
    const int side = d == 0 ? 1 : 0;  // R goes to the right
    const std::size_t j = sent[d];
    const Range rg = range(d, j, true);
    const std::size_t len = (rg.e - rg.b) * es;
    // Step 0 sends this rank's own input; later steps send what was reduced or gathered.
    Buffer& from = (j < m && !in_place) ? in_ : dbuf;
    auto sge = len == 0 ? mr_on(scratch_, side).sge(placeholder_off, placeholder) : mr_on(from, side).sge(rg.b * es, len);
    if (!sge) return fail(sge.error());
    if (auto p = links_[side].qp().send((std::uint64_t{1} << 40) | j, *sge); !p) return fail(p.error());
    ++sent[d];
    return {};
  };
  auto on_recv = [&](int d, const tbverbs::WorkCompletion& wc) -> Result<void> {
    const std::size_t j = received[d];
    if (wc.wr_id() != j)
      return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                              "receive completions out of order: got message " + std::to_string(wc.wr_id()) +
                                  ", expected " + std::to_string(j)));
    const Range rg = range(d, j, false);
    const std::size_t want = rg.e > rg.b ? (rg.e - rg.b) * es : placeholder;
    if (wc.byte_len() != want)
      return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                              "message " + std::to_string(j) + " carried " + std::to_string(wc.byte_len()) +
                                  " bytes, expected " + std::to_string(want)));
    if (is_rs(j) && rg.e > rg.b) {
      const std::size_t off = (static_cast<std::size_t>(d) * S + j % S) * slot_bytes;
      add(t, dst + rg.b * es, src + rg.b * es, scratch_.data() + off, rg.e - rg.b);
    }
    ++received[d];
    return {};
  };

  // 1. Receives posted ahead (the credits), then the caller's barrier: no rank sends before
  //    every rank has posted.
  for (int d = 0; d < 2; ++d)
    while (posted[d] < std::min(T, S))
      if (auto p = post_recv(d); !p) {
        where_ = "posting the first receives";
        return p;
      }
  if (auto b = before_start(); !b) {
    where_ = "the barrier before the all_sum";
    return b;
  }

  auto describe_wait = [&]() {
    std::string w;
    for (int d = 0; d < 2; ++d) {
      if (received[d] < T) {
        const std::size_t step = received[d] / m;
        const int from = d == 0 ? (r + n - 1) % n : (r + 1) % n;
        w += std::string(w.empty() ? "" : ", ") + "message " + std::to_string(received[d]) + "/" +
             std::to_string(T) + " from rank " + std::to_string(from) + " (" +
             (step < static_cast<std::size_t>(n - 1) ? "reduce-scatter step " + std::to_string(step)
                                                     : "all-gather step " + std::to_string(step - (n - 1))) +
             ")";
      }
    }
    return w;
  };

  // 2. The progress loop: completions in, receives re-posted, sends out; never blocks for
  //    longer than a slice, probes the side channel for dead or aborting ranks.
  tbverbs::WorkCompletion wc[32];
  auto last_progress = clock::now();
  auto last_check = last_progress;
  unsigned idle = 0;
  tbverbs::Link* both[2] = {&links_[0], &links_[1]};
  auto handle = [&](int side, std::size_t n) -> Result<void> {
    for (std::size_t k = 0; k < n; ++k) {
      if (wc[k].is_recv()) {
        if (auto p = on_recv(side == 0 ? 0 : 1, wc[k]); !p) {
          where_ = "reducing a received message";
          return p;
        }
      } else {
        ++send_done[side == 0 ? 1 : 0];  // sends on the left link are direction L
      }
    }
    return {};
  };
  for (;;) {
    bool progress = false;
    if (idle > 16) {
      // Nothing happened for a while: sleep on both CQs' channels (bounded), so an idle rank
      // gives its core to the ranks that have work (the emulator runs them all on one host).
      std::size_t which = 0;
      auto got = tbverbs::wait_any(both, wc, which, clock::now() + std::chrono::milliseconds(10));
      if (!got) {
        where_ = "waiting for completions of " + describe_wait();
        return fail(got.error());
      }
      if (*got > 0) {
        if (auto h = handle(static_cast<int>(which), *got); !h) return h;
        progress = true;
      }
    }
    for (int side = 0; side < 2; ++side) {
      auto got = links_[side].cq().poll(wc);
      if (!got) {
        where_ = "polling the " + std::string(side == 0 ? "left" : "right") + " link's CQ while waiting for " +
                 describe_wait();
        return fail(got.error());
      }
      if (auto h = handle(side, *got); !h) return h;
      if (*got > 0) progress = true;
    }
    for (int d = 0; d < 2; ++d) {
      const int o = 1 - d;  // the other direction shares the links: its receives are our credits
      // Receives: up to S ahead of what was consumed (scratch slots free again).
      while (posted[d] < T && posted[d] < received[d] + S) {
        if (auto p = post_recv(d); !p) {
          where_ = "posting receives";
          return p;
        }
        progress = true;
      }
      // Sends: data ready, credit from the peer, our receives for the peer ahead, queue room.
      while (sent[d] < T) {
        const std::size_t j = sent[d];
        if (j >= m && received[d] < j - m + 1) break;           // data of the previous step
        if (j >= W && received[o] < j - W + 1) break;           // credit: peer posted for j
        if (posted[o] < std::min(T, j + W + 1)) break;          // our receives ahead of our send
        if (sent[d] - send_done[d] >= max_in_flight) break;     // send queue room
        if (auto p = post_send(d); !p) {
          where_ = "posting sends";
          return p;
        }
        progress = true;
      }
    }
    if (received[0] == T && received[1] == T && send_done[0] == T && send_done[1] == T) break;

    const auto now = clock::now();
    if (progress) {
      last_progress = now;
      idle = 0;
    } else {
      ++idle;
    }
    if (now - last_check > std::chrono::milliseconds(20)) {
      last_check = now;
      if (auto alive = sc_.check_peers(); !alive) {
        where_ = "the all_sum, waiting for " + describe_wait();
        return fail(alive.error());
      }
    }
    if (now - last_progress > cfg_.timeout) {
      where_ = "the all_sum";
      Error e = Error::make(Step::collective, ErrorKind::timeout,
                            "no progress for " + std::to_string(cfg_.timeout.count()) + " ms waiting for " +
                                describe_wait());
      return fail(e);
    }
  }
  // Every chunk of the output was written by an all-gather receive, except this rank's fully
  // reduced halves, which its last reductions wrote.
  return {};
}

}  // namespace ring
