// tbverbs-probe: what a Mac owner runs first. Two hosts measure, together, every behaviour of the
// verbs driver that the field disagrees on (docs/field-reports.md section 4b), and report it: as a
// table, as one JSON object (--json) for a bug report, and as a profile the library loads
// (--profile-out FILE, then TBVERBS_PROFILE=FILE) so measured values replace assumed defaults.
//
//   tbverbs-probe --server [--port 18520]          # on one Mac
//   tbverbs-probe --connect HOST[:PORT]            # on the other (HOST: the first Mac's address)
//   tbverbs-probe --local [--quirk NAME=VALUE ...] # both ends on the emulator, this machine
//   torchrun --nproc-per-node 1 --nnodes 2 ... tbverbs-probe   # or mpirun/srun/mlx.launch: rank
//                                                  # 0 serves, rank 1 connects (launcher_env.hpp)
//
// Every item is measured under a deadline, on fresh queue pairs, and every QP, CQ, MR and PD is
// a tbverbs handle (RAII): whatever fails, nothing is left behind (the report says how many QPs
// and MRs the process still holds at the end: none). Both ends run the same sequence of steps,
// kept in step over the side channel; a step that fails on one end is skipped on both.
#include "../common/cli_args.hpp"
#include "../common/launcher_env.hpp"
#include "../common/local_scratch.hpp"
#include "../common/size_arg.hpp"
#include "probe_token.hpp"

#include <tbverbs/budget.hpp>
#include <tbverbs/explain.hpp>
#include <tbverbs/measured_profile.hpp>
#include <tbverbs/side_channel.hpp>
#include <tbverbs/tbverbs.hpp>
#include <tbverbs/topology.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#ifndef TBVERBS_PROBE_EMU_LIBRARY
#define TBVERBS_PROBE_EMU_LIBRARY ""
#endif

using namespace tbverbs;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  bool server = false, local = false, as_json = false, quick = false, keep = false;
  std::string connect, device, library, emu_library = TBVERBS_PROBE_EMU_LIBRARY, profile_out;
  std::vector<std::string> quirks;
  int port = 18520;
  int timeout_ms = 15000;  // bound of every side-channel step
  int wait_ms = 1000;      // how long a message may take before it counts as not delivered
  int iters = 1000;        // latency round trips
  std::string bw_bytes = "64M";
  int max_qps = 64, max_mrs = 1024;
  std::uint64_t max_mr_bytes = std::uint64_t{1} << 30;
  std::string token;       // shared secret both ends must give (--token, --token-file, TBVERBS_PROBE_TOKEN)
};

std::string first_line(const std::string& m) { return m.substr(0, m.find('\n')); }
std::string errtext(const Error& e) { return first_line(e.message()); }

std::string sysctl_string(const char* name) {
#if defined(__APPLE__)
  char buf[128] = {};
  std::size_t len = sizeof buf - 1;
  if (::sysctlbyname(name, buf, &len, nullptr, 0) == 0) return buf;
#else
  (void)name;
#endif
  return {};
}

// Memory for the region-size sweep: mapped, never touched by us (AlignedBuffer zeroes its pages,
// which for a 1 GiB attempt would cost a second and a gigabyte of memory before the driver says no).
class Mapping {
public:
  explicit Mapping(std::size_t bytes) : len_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
    p_ = p == MAP_FAILED ? nullptr : p;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (p_ != nullptr) ::munmap(p_, len_);
  }
  std::span<std::byte> bytes() const { return {static_cast<std::byte*>(p_), p_ ? len_ : 0}; }

private:
  void* p_ = nullptr;
  std::size_t len_ = 0;
};

// ---------------------------------------------------------------------------------------------
// One end of the probe: its device, the side channel to the other end, and the report.

struct End {
  const Options* o = nullptr;
  int rank = 0, peer = 1;
  SideChannel* sc = nullptr;
  const Library* lib = nullptr;
  std::optional<Context> ctx;
  std::optional<ProtectionDomain> pd;
  std::optional<GidSelection> gid;
  std::optional<GidTable> table;
  PortAttributes port;
  DeviceAttributes dev;
  json report = json::object();   // results, by key
  json details = json::object();  // how each was measured / why
  std::vector<std::string> errors;
  std::uint32_t sent = 0, received = 0; // number the messages each way, so the ends stay in step

  std::chrono::milliseconds wait() const { return std::chrono::milliseconds(o->wait_ms); }
  SideChannelDeadline dl() const { return Clock::now() + std::chrono::milliseconds(o->timeout_ms); }
  bool apple() const { return ctx->platform() == Platform::apple; }

  // Side-channel messages of the probe: a step number, then the payload. Both ends call the
  // same sequence, so a message from another step means the ends went out of step: an error.
  Result<void> send(const json& j) {
    const std::string s = std::to_string(++sent) + " " + j.dump();
    return sc->send_to(peer, std::as_bytes(std::span(s.data(), s.size())), dl());
  }
  Result<json> recv() {
    auto r = sc->recv_from(peer, dl());
    if (!r) return fail(r.error());
    const std::string s(reinterpret_cast<const char*>(r->data()), r->size());
    const auto sp = s.find(' ');
    if (sp == std::string::npos || std::to_string(++received) != s.substr(0, sp))
      return fail(Error::make(Step::side_channel, ErrorKind::bad_frame,
                              "the other probe is out of step (another tbverbs version?)"));
    try {
      return json::parse(s.substr(sp + 1));
    } catch (const std::exception& e) {
      return fail(Error::make(Step::side_channel, ErrorKind::bad_frame, std::string("probe message: ") + e.what()));
    }
  }
  // Sends mine and returns the peer's.
  Result<json> swap(const json& mine) {
    if (auto s = send(mine); !s) return fail(s.error());
    return recv();
  }
  // Both ends' "I could do my part": true only when both could.
  Result<bool> agree(bool ok) {
    auto r = swap(json(ok));
    if (!r) return fail(r.error());
    return ok && r->is_boolean() && r->get<bool>();
  }

  void result(const std::string& key, json value, const std::string& detail) {
    report[key] = std::move(value);
    details[key] = detail;
  }
};

// A connected pair of queue pairs (one on each end), made for one measurement and destroyed after.
struct Pair {
  std::optional<CompletionQueue> cq;
  std::optional<QueuePair> qp;
};

// Creates a CQ and a QP from `recipe`, exchanges endpoints, connects. Returns an empty Pair
// (and why in `why`) when either end failed; the side channel's errors are returned as errors.
Result<Pair> make_pair(End& e, const QpRecipe& recipe, std::string& why, CqWait wait = CqWait::poll,
                       int entries = 0) {
  Pair p;
  const auto& c = recipe.requested_capacities();
  int want = entries > 0 ? entries : static_cast<int>(c.max_send_wr + c.max_recv_wr + 16);
  if (e.dev.max_cqe > 0) want = std::min(want, e.dev.max_cqe);
  auto cq = e.ctx->create_cq(want, wait);
  std::optional<PreparedQueuePair> prep;
  json mine = nullptr;
  if (!cq) why = errtext(cq.error());
  else if (auto q = recipe.prepare(*e.pd, *cq); !q) why = errtext(q.error());
  else {
    prep.emplace(std::move(*q));
    const auto w = prep->endpoint().serialize();
    std::string hex;
    for (std::byte b : w) {
      char h[3];
      std::snprintf(h, sizeof h, "%02x", static_cast<unsigned>(b));
      hex += h;
    }
    mine = hex;
  }
  auto theirs = e.swap(mine);
  if (!theirs) return fail(theirs.error());
  bool ok = prep.has_value() && theirs->is_string();
  if (prep && !theirs->is_string()) why = "the other end could not create its queue pair";
  if (ok) {
    const std::string hex = theirs->get<std::string>();
    std::vector<std::byte> raw;
    bool hex_ok = hex.size() % 2 == 0;
    for (std::size_t i = 0; hex_ok && i + 1 < hex.size(); i += 2) {
      unsigned v = 0;
      const auto [end, ec] = std::from_chars(hex.data() + i, hex.data() + i + 2, v, 16);
      hex_ok = ec == std::errc() && end == hex.data() + i + 2;
      raw.push_back(static_cast<std::byte>(v));
    }
    auto remote = hex_ok ? Endpoint::parse(raw)
                         : Result<Endpoint>(fail(Error::make(Step::parse_endpoint, ErrorKind::bad_frame,
                                                             "the other end's endpoint is not hexadecimal")));
    if (!remote) {
      why = errtext(remote.error());
      ok = false;
    } else {
      if (explain_enabled())
        for (const auto& l : explain_queue_pair(recipe, e.port, prep->capacities(), prep->endpoint(), *remote, "probe"))
          explain(l);
      auto qp = std::move(*prep).connect(*remote);
      if (!qp) {
        why = errtext(qp.error());
        ok = false;
      } else {
        p.qp.emplace(std::move(*qp));
      }
    }
  }
  auto both = e.agree(ok);
  if (!both) return fail(both.error());
  if (!*both) {
    if (ok) why = "the other end could not connect its queue pair";
    p.qp.reset();
    return Pair{};
  }
  p.cq.emplace(std::move(*cq));
  return p;
}

QpRecipe base_recipe(const End& e, std::uint32_t depth = 64) {
  QpRecipe r = QpRecipe::for_platform(e.ctx->platform(), *e.gid);
  r.capacities({depth, depth, 1, 1, 0});
  return r;
}

// A registered buffer for a measurement.
struct Buf {
  std::optional<AlignedBuffer> mem;
  std::optional<MemoryRegion> mr;
  Result<abi::ibv_sge> sge(std::size_t off, std::size_t len) const { return mr->sge(off, len); }
  std::byte* data() const { return mem->data(); }
};
Result<Buf> make_buf(const End& e, std::size_t bytes) {
  Buf b;
  auto m = AlignedBuffer::allocate(bytes);
  if (!m) return fail(m.error());
  b.mem.emplace(std::move(*m));
  auto mr = e.pd->reg_mr_two_sided(b.mem->bytes());
  if (!mr) return fail(mr.error());
  b.mr.emplace(std::move(*mr));
  return b;
}

// Waits for a completion of `wr_id` on `cq` until `deadline`. Returns: 1 success (byte_len in
// `len`), 0 nothing by the deadline, -1 a failed completion (its status in `why`).
int await(CompletionQueue& cq, std::uint64_t wr_id, Clock::time_point deadline, std::uint32_t* len, std::string* why,
          std::vector<std::uint64_t>* others = nullptr) {
  for (;;) {
    WorkCompletion wc[8];
    auto got = cq.wait(wc, deadline);
    if (!got) {
      if (got.error().is(ErrorKind::timeout)) return 0;
      if (why) *why = errtext(got.error());
      return -1;
    }
    int found = 0;
    for (std::size_t i = 0; i < *got; ++i) {
      if (wc[i].wr_id() == wr_id) {
        found = 1;
        if (len) *len = wc[i].byte_len();
      } else if (others) {
        others->push_back(wc[i].wr_id());
      }
    }
    if (found) return 1;
  }
}

void fill(std::byte* p, std::size_t n, std::uint32_t tag) {
  auto* w = reinterpret_cast<std::uint32_t*>(p);
  for (std::size_t i = 0; i < n / 4; ++i) w[i] = static_cast<std::uint32_t>(i * 2654435761u) ^ tag;
}
bool check(const std::byte* p, std::size_t n, std::uint32_t tag) {
  const auto* w = reinterpret_cast<const std::uint32_t*>(p);
  for (std::size_t i = 0; i < n / 4; ++i)
    if (w[i] != (static_cast<std::uint32_t>(i * 2654435761u) ^ tag)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Local measurements (each end alone).

constexpr Access kAccessSets[] = {Access::none, Access::local_write, Access::local_write | Access::remote_write,
                                  Access::local_write | Access::remote_read,
                                  Access::local_write | Access::remote_write | Access::remote_read};

void probe_mr_access(End& e) {
  auto b = AlignedBuffer::allocate(frame_bytes);
  if (!b) return e.errors.push_back("mr_access: " + errtext(b.error()));
  json sets = json::object();
  bool plain_ok = false, plain_bad = false, remote_ok = false, remote_bad = false;
  std::string refused;
  for (Access a : kAccessSets) {
    auto mr = e.pd->reg_mr(b->bytes(), a);
    const bool remote = includes(a, Access::remote_write) || includes(a, Access::remote_read);
    const std::string name = detail::access_names(static_cast<unsigned>(a));
    sets[name] = static_cast<bool>(mr);
    if (mr) (remote ? remote_ok : plain_ok) = true;
    else {
      (remote ? remote_bad : plain_bad) = true;
      refused += (refused.empty() ? "" : ", ") + name + " (" + std::string(detail::errno_name(mr.error().sys_errno)) + ")";
    }
  }
  std::string verdict = "mixed";
  if (!plain_bad && !remote_bad) verdict = "any";
  else if (plain_ok && !remote_ok) verdict = "local_write_only";
  else if (remote_ok && !plain_ok) verdict = "remote_required";
  else if (!plain_ok && !remote_ok) verdict = "none";
  e.result("mr_access", verdict,
           "reg_mr of one page with each access set; " + (refused.empty() ? "all accepted" : "refused: " + refused));
  e.report["mr_access_sets"] = sets;
}

void probe_max_mr_bytes(End& e) {
  std::uint64_t ok = 0, refused = 0;
  std::string why;
  const auto until = Clock::now() + std::chrono::milliseconds(e.o->timeout_ms);
  auto try_size = [&](std::uint64_t n) {
    Mapping m(static_cast<std::size_t>(n));
    if (m.bytes().empty()) {
      why = "mmap of " + std::to_string(n) + " bytes failed";
      return false;
    }
    auto mr = e.pd->reg_mr_two_sided(m.bytes());
    if (!mr) why = std::to_string(n) + " bytes: " + std::string(detail::errno_name(mr.error().sys_errno));
    return static_cast<bool>(mr);
  };
  for (std::uint64_t n = frame_bytes; n <= e.o->max_mr_bytes && Clock::now() < until; n *= 2) {
    if (!try_size(n)) {
      refused = n;
      break;
    }
    ok = n;
  }
  // The reported max_mr_size is rarely a power of two (16,384,000 on Thunderbolt): try it too.
  if (e.dev.max_mr_size > ok && (refused == 0 || e.dev.max_mr_size < refused) && e.dev.max_mr_size <= e.o->max_mr_bytes &&
      try_size(e.dev.max_mr_size))
    ok = e.dev.max_mr_size;
  e.result("max_mr_bytes", ok,
           "one region, doubling from 4 KiB (capped at " + std::to_string(e.o->max_mr_bytes) + "), then max_mr_size " +
               std::to_string(e.dev.max_mr_size) + "; " + (refused ? "refused at " + why : "never refused"));
}

void probe_max_mrs(End& e) {
  const int cap = e.o->max_mrs;
  auto b = AlignedBuffer::allocate(static_cast<std::size_t>(cap) * frame_bytes);
  if (!b) return e.errors.push_back("max_mrs: " + errtext(b.error()));
  std::vector<MemoryRegion> held; // RAII: all deregistered when this returns
  held.reserve(static_cast<std::size_t>(cap));
  std::string why = "not refused up to the cap of " + std::to_string(cap);
  const auto until = Clock::now() + std::chrono::milliseconds(e.o->timeout_ms);
  for (int i = 0; i < cap && Clock::now() < until; ++i) {
    auto mr = e.pd->reg_mr_two_sided(b->bytes().subspan(static_cast<std::size_t>(i) * frame_bytes, frame_bytes));
    if (!mr) {
      why = "registration " + std::to_string(i + 1) + " refused with " +
            std::string(detail::errno_name(mr.error().sys_errno));
      break;
    }
    held.push_back(std::move(*mr));
  }
  e.result("max_mrs", held.size(), "one-page regions until refusal (max_mr says " + std::to_string(e.dev.max_mr) + "); " + why);
}

void probe_max_qps(End& e) {
  auto cq = e.ctx->create_cq(64, CqWait::poll);
  if (!cq) return e.errors.push_back("max_qps: " + errtext(cq.error()));
  std::vector<PreparedQueuePair> held; // RAII: all destroyed when this returns
  std::string why = "not refused up to the cap of " + std::to_string(e.o->max_qps);
  const QpRecipe r = base_recipe(e, 16);
  const auto until = Clock::now() + std::chrono::milliseconds(e.o->timeout_ms);
  for (int i = 0; i < e.o->max_qps && Clock::now() < until; ++i) {
    auto q = r.prepare(*e.pd, *cq);
    if (!q) {
      why = "create_qp " + std::to_string(i + 1) + " failed with " + std::string(detail::errno_name(q.error().sys_errno));
      break;
    }
    held.push_back(std::move(*q));
  }
  e.result("max_qps", held.size(), "queue pairs until refusal (max_qp says " + std::to_string(e.dev.max_qp) + "); " + why);
}

// ---------------------------------------------------------------------------------------------
// Two-ended measurements. Rank 1 (the client) sends, rank 0 (the server) receives, unless said.

Result<void> probe_mtu4096(End& e) {
  QpRecipe r = base_recipe(e);
  r.mtu(Mtu::mtu4096);
  std::string why;
  auto p = make_pair(e, r, why);
  if (!p) return fail(p.error());
  const bool ok = p->qp.has_value();
  e.result("path_mtu_4096_accepted", ok, ok ? "RTR with path_mtu 4096 accepted on both ends" : "RTR refused: " + why);
  return {};
}

Result<void> probe_empty_rq(End& e) {
  std::string why;
  auto p = make_pair(e, base_recipe(e), why);
  if (!p) return fail(p.error());
  if (!p->qp) {
    e.result("empty_rq", "untested", "no queue pair: " + why);
    return {};
  }
  auto buf = make_buf(e, 2 * frame_bytes);
  auto ok = e.agree(static_cast<bool>(buf));
  if (!ok) return fail(ok.error());
  if (!*ok) {
    e.result("empty_rq", "untested", "registration failed");
    return {};
  }
  constexpr std::uint32_t tag_a = 0xA0A0A0A0u, tag_b = 0xB0B0B0B0u;
  const std::size_t len = 1024;  // one frame
  std::string verdict = "untested", detail;
  if (e.rank == 1) {
    // The send meets an empty receive queue: the server posts nothing until told it was sent.
    fill(buf->data(), len, tag_a);
    auto sge = buf->sge(0, len);
    auto s = p->qp->send(1, *sge);
    bool completed_early = false;
    if (s) completed_early = await(*p->cq, 1, Clock::now() + std::chrono::milliseconds(100), nullptr, nullptr) == 1;
    if (auto r = e.send(json{{"sent", static_cast<bool>(s)}, {"completed", completed_early}}); !r) return fail(r.error());
    auto first = e.recv();
    if (!first) return fail(first.error());
    if (first->value("delivered", false)) {
      verdict = "wait";
      if (!completed_early) await(*p->cq, 1, Clock::now() + e.wait(), nullptr, nullptr);
    } else {
      // Lost. Does the direction still deliver? The server's receive is still posted.
      fill(buf->data() + frame_bytes, len, tag_b);
      auto sge2 = buf->sge(frame_bytes, len);
      auto s2 = p->qp->send(2, *sge2);
      if (auto r = e.send(json(static_cast<bool>(s2))); !r) return fail(r.error());
      auto second = e.recv();
      if (!second) return fail(second.error());
      verdict = second->value("verdict", std::string("untested"));
    }
    auto v = e.recv();
    if (!v) return fail(v.error());
    detail = v->value("detail", std::string());
  } else {
    auto sent = e.recv();
    if (!sent) return fail(sent.error());
    const bool early = sent->value("completed", false);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto sge = buf->sge(0, len);
    auto r1 = p->qp->recv(10, *sge);
    std::uint32_t got = 0;
    std::string werr;
    int st = r1 ? await(*p->cq, 10, Clock::now() + e.wait(), &got, &werr) : -1;
    const bool a = st == 1 && check(buf->data(), len, tag_a);
    if (auto r = e.send(json{{"delivered", a}}); !r) return fail(r.error());
    if (a) {
      verdict = "wait";
      detail = std::string("a send posted before any receive ") + (early ? "completed at once and " : "did not complete, ") +
               "was delivered once the receive was posted 100 ms later: credit-based flow control held it";
    } else {
      auto s2 = e.recv();
      if (!s2) return fail(s2.error());
      st = await(*p->cq, 10, Clock::now() + e.wait(), &got, &werr);
      const bool b = st == 1 && check(buf->data(), len, tag_b);
      const bool late_a = st == 1 && check(buf->data(), len, tag_a);
      verdict = b ? "drop" : late_a ? "wait" : "kill";
      detail = b ? "the send that met the empty receive queue was lost (its send " +
                       std::string(early ? "completed" : "did not complete") +
                       "); a second send, after the receive was posted, was delivered: the QP lives"
                 : late_a ? "the first send arrived late (more than " + std::to_string(e.o->wait_ms) + " ms)"
                          : "the send that met the empty receive queue was lost and a second send, after the receive "
                            "was posted, was not delivered either: that direction is dead (ds4's reading)";
      if (auto r = e.send(json{{"verdict", verdict}}); !r) return fail(r.error());
    }
    if (auto r = e.send(json{{"detail", detail}}); !r) return fail(r.error());
  }
  if (e.rank == 1) {
    // (the server sent the detail as its last message; nothing more to exchange)
  }
  e.result("empty_rq", verdict, detail);
  return {};
}

Result<void> probe_channels(End& e) {
  std::string why;
  bool mine = false;
  std::string note;
  {
    auto cq_probe = e.ctx->create_cq(8, CqWait::channel); // destroyed before the pair's own CQ
    mine = cq_probe && cq_probe->has_channel();
    note = !cq_probe ? errtext(cq_probe.error())
           : cq_probe->channel_note() ? errtext(*cq_probe->channel_note())
                                      : std::string();
  }
  auto p = make_pair(e, base_recipe(e), why, CqWait::channel);
  if (!p) return fail(p.error());
  auto buf = make_buf(e, frame_bytes);
  auto ok = e.agree(p->qp.has_value() && static_cast<bool>(buf));
  if (!ok) return fail(ok.error());
  if (!*ok) {
    e.result("completion_channels", mine ? json("untested") : json(false),
             mine ? "no queue pair: " + why : "ibv_create_comp_channel refused: " + note);
    return {};
  }
  bool woken = false;
  std::string detail;
  if (e.rank == 0) {
    auto sge = buf->sge(0, 64);
    auto r = p->qp->recv(20, *sge);
    const bool has = p->cq->has_channel();
    bool armed = false;
    if (has) {
      auto a = p->cq->arm();
      armed = static_cast<bool>(a);
      if (!a) detail = "ibv_req_notify_cq failed: " + errtext(a.error());
    } else {
      detail = "ibv_create_comp_channel refused: " + (p->cq->channel_note() ? errtext(*p->cq->channel_note()) : note);
    }
    if (auto s = e.send(json(static_cast<bool>(r))); !s) return fail(s.error());
    if (armed) {
      pollfd fd{p->cq->channel_fd(), POLLIN, 0};
      const int ready = ::poll(&fd, 1, e.o->wait_ms);
      if (ready == 1 && (fd.revents & POLLIN) != 0) {
        auto ev = p->cq->consume_event();
        std::uint32_t len = 0;
        woken = ev && await(*p->cq, 20, Clock::now() + e.wait(), &len, nullptr) == 1;
        detail = woken ? "created, armed, and its fd became readable when the completion arrived"
                       : "the fd became readable but the event or the completion was missing";
      } else {
        detail = "created and armed, but the fd never became readable within " + std::to_string(e.o->wait_ms) + " ms";
        await(*p->cq, 20, Clock::now() + e.wait(), nullptr, nullptr);
      }
    } else {
      await(*p->cq, 20, Clock::now() + e.wait(), nullptr, nullptr);
    }
    if (auto s = e.send(json{{"woken", woken}, {"detail", detail}}); !s) return fail(s.error());
  } else {
    auto posted = e.recv();
    if (!posted) return fail(posted.error());
    auto sge = buf->sge(0, 64);
    if (posted->get<bool>()) {
      if (auto s = p->qp->send(21, *sge); s) await(*p->cq, 21, Clock::now() + e.wait(), nullptr, nullptr);
    }
    auto v = e.recv();
    if (!v) return fail(v.error());
    woken = v->value("woken", false);
    detail = v->value("detail", std::string());
  }
  e.result("completion_channels", woken, detail);
  return {};
}

Result<void> probe_frame_pairing(End& e) {
  std::string why;
  auto p = make_pair(e, base_recipe(e), why);
  if (!p) return fail(p.error());
  auto buf = make_buf(e, 2 * frame_bytes);
  auto ok = e.agree(p->qp.has_value() && static_cast<bool>(buf));
  if (!ok) return fail(ok.error());
  if (!*ok) {
    e.result("frame_pairing_enforced", "untested", "no queue pair: " + why);
    return {};
  }
  json verdict = "untested";
  std::string detail;
  if (e.rank == 0) {
    auto sge = buf->sge(0, 2 * frame_bytes);  // a receive of two frames ...
    auto r = p->qp->recv(30, *sge);
    if (auto s = e.send(json(static_cast<bool>(r))); !s) return fail(s.error());
    std::uint32_t len = 0;
    std::string werr;
    const int st = r ? await(*p->cq, 30, Clock::now() + e.wait(), &len, &werr) : 0;
    if (st == 1) {
      verdict = false;
      detail = "a one-frame send into a two-frame receive was delivered (" + std::to_string(len) + " bytes)";
    } else if (st < 0) {
      verdict = true;
      detail = "a one-frame send into a two-frame receive failed the receive: " + werr;
    } else {
      verdict = true;
      detail = "a one-frame send into a two-frame receive never completed the receive (silently unpaired)";
    }
    if (auto s = e.send(json{{"v", verdict}, {"detail", detail}}); !s) return fail(s.error());
  } else {
    auto posted = e.recv();
    if (!posted) return fail(posted.error());
    auto sge = buf->sge(0, 100);  // ... meets a send of one frame
    if (posted->get<bool>())
      if (auto s = p->qp->send(31, *sge); s) await(*p->cq, 31, Clock::now() + e.wait(), nullptr, nullptr);
    auto v = e.recv();
    if (!v) return fail(v.error());
    verdict = (*v)["v"];
    detail = v->value("detail", std::string());
  }
  e.result("frame_pairing_enforced", verdict, detail);
  return {};
}

Result<void> probe_max_message(End& e) {
  // The largest size both ends can register as one region and the ports allow.
  std::uint64_t cap = std::min<std::uint64_t>(e.port.max_msg_sz ? e.port.max_msg_sz : (1u << 30),
                                              e.report.value("max_mr_bytes", std::uint64_t{1} << 30));
  cap = std::min<std::uint64_t>(cap, e.o->max_mr_bytes);
  auto theirs = e.swap(json(cap));
  if (!theirs) return fail(theirs.error());
  cap = std::min(cap, theirs->get<std::uint64_t>());
  if (e.apple()) cap = cap / frame_bytes * frame_bytes;
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = frame_bytes; s <= cap; s *= 2) sizes.push_back(s);
  if (!sizes.empty() && sizes.back() < cap) sizes.push_back(cap);
  const std::uint64_t top = sizes.empty() ? frame_bytes : sizes.back();
  const std::uint32_t depth =
      std::min<std::uint32_t>(max_depth_frames, e.apple() ? frames_of(static_cast<std::size_t>(top)) + 1 : 16);
  std::string why;
  auto p = make_pair(e, base_recipe(e, depth), why);
  if (!p) return fail(p.error());
  auto buf = make_buf(e, static_cast<std::size_t>(top));
  auto ok = e.agree(p->qp.has_value() && static_cast<bool>(buf));
  if (!ok) return fail(ok.error());
  if (!*ok) {
    e.result("max_message_bytes", "untested", "no queue pair or buffer: " + why);
    return {};
  }
  std::uint64_t best = 0;
  std::string detail = "never delivered";
  std::uint64_t id = 100;
  for (std::uint64_t s : sizes) {
    ++id;
    const auto len = static_cast<std::size_t>(s);
    bool delivered = false;
    if (e.rank == 0) {
      std::memset(buf->data(), 0, len);
      auto sge = buf->sge(0, len);
      auto r = p->qp->recv(id, *sge);
      if (auto m = e.send(json(static_cast<bool>(r))); !m) return fail(m.error());
      std::uint32_t got = 0;
      std::string werr;
      const int st = r ? await(*p->cq, id, Clock::now() + e.wait(), &got, &werr) : 0;
      delivered = st == 1 && got == len && check(buf->data(), len, static_cast<std::uint32_t>(s));
      if (!delivered)
        detail = std::to_string(s) + " bytes " +
                 (st == 1 ? "arrived damaged" : st < 0 ? "failed: " + werr : "not delivered within " + std::to_string(e.o->wait_ms) + " ms");
      if (auto m = e.send(json{{"ok", delivered}, {"detail", detail}}); !m) return fail(m.error());
    } else {
      auto posted = e.recv();
      if (!posted) return fail(posted.error());
      fill(buf->data(), len, static_cast<std::uint32_t>(s));
      auto sge = buf->sge(0, len);
      if (posted->get<bool>())
        if (auto snd = p->qp->send(id, *sge); snd) await(*p->cq, id, Clock::now() + e.wait(), nullptr, nullptr);
      auto v = e.recv();
      if (!v) return fail(v.error());
      delivered = v->value("ok", false);
      if (!delivered) detail = v->value("detail", std::string());
    }
    if (!delivered) break;
    best = s;
  }
  if (best == top) detail = "every size up to " + std::to_string(top) + " delivered intact";
  e.result("max_message_bytes", best,
           "doubling from 4 KiB to " + std::to_string(top) + " (max_msg_sz " + std::to_string(e.port.max_msg_sz) +
               ", one registered region); " + detail);
  return {};
}

Result<void> probe_rdma_write(End& e) {
  // The server's target region needs REMOTE_WRITE; a driver that refuses that flag cannot take a write.
  std::optional<AlignedBuffer> target_mem;
  std::optional<MemoryRegion> target;
  std::string refused;
  if (e.rank == 0) {
    if (auto m = AlignedBuffer::allocate(frame_bytes); m) {
      target_mem.emplace(std::move(*m));
      auto mr = e.pd->reg_mr(target_mem->bytes(), Access::local_write | Access::remote_write);
      if (mr) target.emplace(std::move(*mr));
      else refused = errtext(mr.error());
    }
  }
  QpRecipe r = base_recipe(e);
  r.access(Access::remote_write).allow_rdma_write(true);
  std::string why;
  auto p = make_pair(e, r, why);
  if (!p) return fail(p.error());
  auto buf = make_buf(e, frame_bytes);
  json mine = e.rank == 0 && target ? json{{"addr", reinterpret_cast<std::uintptr_t>(target->data())}, {"rkey", target->rkey()}}
                                    : json(nullptr);
  auto theirs = e.swap(mine);
  if (!theirs) return fail(theirs.error());
  const bool have_target = e.rank == 0 ? target.has_value() : theirs->is_object();
  auto ok = e.agree(p->qp.has_value() && static_cast<bool>(buf) && have_target);
  if (!ok) return fail(ok.error());
  if (!*ok) {
    e.result("rdma_write_executed", "untested",
             !refused.empty() ? "a region with REMOTE_WRITE was refused: " + refused
                              : "no queue pair or region: " + why);
    return {};
  }
  json verdict = false;
  std::string detail;
  constexpr std::uint32_t tag = 0x57575757u;
  if (e.rank == 0) {
    auto sge = buf->sge(0, 64);
    auto rr = p->qp->recv(40, *sge);  // the fence: a SEND after the write
    if (auto m = e.send(json(static_cast<bool>(rr))); !m) return fail(m.error());
    const int st = rr ? await(*p->cq, 40, Clock::now() + e.wait(), nullptr, nullptr) : 0;
    const bool written = check(target->data(), 1024, tag);
    verdict = written;
    detail = std::string(written ? "an RDMA WRITE of 1 KiB landed in the peer's region"
                                 : "an RDMA WRITE of 1 KiB was accepted but the peer's region stayed unchanged") +
             (st == 1 ? " (checked after the SEND that followed it arrived)" : " (the SEND after it never arrived)");
    if (auto m = e.send(json{{"v", verdict}, {"detail", detail}}); !m) return fail(m.error());
  } else {
    auto posted = e.recv();
    if (!posted) return fail(posted.error());
    fill(buf->data(), 1024, tag);
    auto sge = buf->sge(0, 1024);
    auto w = p->qp->rdma_write(41, *sge, (*theirs)["addr"].get<std::uint64_t>(), (*theirs)["rkey"].get<std::uint32_t>());
    std::string werr = w ? std::string() : errtext(w.error());
    if (w) await(*p->cq, 41, Clock::now() + e.wait(), nullptr, &werr);
    auto fence = buf->sge(0, 64);
    if (posted->get<bool>())
      if (auto s = p->qp->send(42, *fence); s) await(*p->cq, 42, Clock::now() + e.wait(), nullptr, nullptr);
    auto v = e.recv();
    if (!v) return fail(v.error());
    verdict = (*v)["v"];
    detail = v->value("detail", std::string()) + (werr.empty() ? "" : "; the write: " + werr);
  }
  e.result("rdma_write_executed", verdict, detail);
  return {};
}

Result<void> probe_sgid_index(End& e) {
  std::vector<int> mapped;
  for (std::size_t i = 0; i < e.table->size(); ++i)
    if (e.table->at(static_cast<int>(i)).is_ipv4_mapped() && e.table->at(static_cast<int>(i)).ipv4() != 0)
      mapped.push_back(static_cast<int>(i));
  auto theirs = e.swap(json(mapped.size()));
  if (!theirs) return fail(theirs.error());
  const bool both = mapped.size() >= 2 && theirs->get<std::size_t>() >= 2;
  if (!both) {
    const std::string dev = std::string(e.ctx->name());
    const std::string iface = dev.rfind("rdma_", 0) == 0 ? dev.substr(5) : "enN";
    const std::uint32_t a = e.gid->gid().ipv4();
    e.result("sgid_index_honoured", "untested",
             "needs two IPv4-mapped GIDs on both ends (this end has " + std::to_string(mapped.size()) + ", the other " +
                 std::to_string(theirs->get<std::size_t>()) + "); add a second address on each end of the cable, e.g. `sudo ifconfig " +
                 iface + " inet " + ipv4_to_string(a + 4) + " netmask 255.255.255.252 alias` here and the matching " +
                 "address of that /30 on the other Mac, then run the probe again");
    return {};
  }
  auto sel = e.table->at_index(mapped[1]);
  if (!sel) {
    e.result("sgid_index_honoured", "untested", errtext(sel.error()));
    return {};
  }
  QpRecipe r = QpRecipe::for_platform(e.ctx->platform(), *sel);
  r.capacities({64, 64, 1, 1, 0});
  std::string why;
  auto p = make_pair(e, r, why);
  if (!p) return fail(p.error());
  auto buf = make_buf(e, frame_bytes);
  auto ok = e.agree(p->qp.has_value() && static_cast<bool>(buf));
  if (!ok) return fail(ok.error());
  if (!*ok) {
    e.result("sgid_index_honoured", false, "RTR from GID[" + std::to_string(mapped[1]) + "] failed: " + why);
    return {};
  }
  bool delivered = false;
  if (e.rank == 0) {
    auto sge = buf->sge(0, 64);
    auto rr = p->qp->recv(50, *sge);
    if (auto m = e.send(json(static_cast<bool>(rr))); !m) return fail(m.error());
    delivered = rr && await(*p->cq, 50, Clock::now() + e.wait(), nullptr, nullptr) == 1;
    if (auto m = e.send(json(delivered)); !m) return fail(m.error());
  } else {
    auto posted = e.recv();
    if (!posted) return fail(posted.error());
    auto sge = buf->sge(0, 64);
    if (posted->get<bool>())
      if (auto s = p->qp->send(51, *sge); s) await(*p->cq, 51, Clock::now() + e.wait(), nullptr, nullptr);
    auto v = e.recv();
    if (!v) return fail(v.error());
    delivered = v->get<bool>();
  }
  e.result("sgid_index_honoured", delivered,
           "a queue pair from the second IPv4-mapped entry GID[" + std::to_string(mapped[1]) + "] " +
               (delivered ? "delivered" : "did not deliver"));
  return {};
}

Result<void> probe_latency(End& e) {
  const int iters = std::max(1, e.o->iters);
  std::string why;
  auto p = make_pair(e, base_recipe(e, 64), why);
  if (!p) return fail(p.error());
  auto buf = make_buf(e, 2 * frame_bytes);
  auto ok = e.agree(p->qp.has_value() && static_cast<bool>(buf));
  if (!ok) return fail(ok.error());
  if (!*ok) {
    e.result("latency_4k_us", "untested", "no queue pair: " + why);
    return {};
  }
  auto rsge = buf->sge(0, frame_bytes), ssge = buf->sge(frame_bytes, frame_bytes);
  auto posted = p->qp->recv(1, *rsge);
  auto both = e.agree(static_cast<bool>(posted));  // receives posted on both ends before any send
  if (!both) return fail(both.error());
  std::vector<double> us;
  std::string err;
  // Every receive is re-posted as soon as it completes, and the server replies to each message
  // at once; the client times each round trip. Counts, not flags: a completion of the next round
  // may arrive while this round's send completion is awaited.
  int recvd = 0, send_done = 0, sends = 0;
  auto pump = [&](Clock::time_point deadline) -> bool {
    WorkCompletion wc[8];
    auto n = p->cq->wait(wc, deadline);
    if (!n) {
      err = n.error().is(ErrorKind::timeout) ? "round trip " + std::to_string(recvd + 1) + " timed out" : errtext(n.error());
      return false;
    }
    for (std::size_t k = 0; k < *n && err.empty(); ++k) {
      if (!wc[k].is_recv()) {
        ++send_done;
        continue;
      }
      ++recvd;
      if (auto r = p->qp->recv(1, *rsge); !r) err = errtext(r.error());
      if (e.rank == 0 && err.empty()) {
        if (auto s = p->qp->send(2, *ssge); !s) err = errtext(s.error());
        ++sends;
      }
    }
    return err.empty();
  };
  if (*both) {
    if (e.rank == 1) {
      for (int i = 0; i < iters && err.empty(); ++i) {
        const auto t0 = Clock::now();
        if (auto s = p->qp->send(2, *ssge); !s) err = errtext(s.error());
        ++sends;
        while (err.empty() && recvd <= i && pump(t0 + e.wait())) {}
        if (err.empty()) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    } else {
      const auto deadline = Clock::now() + e.wait() * 4 + std::chrono::milliseconds(iters);
      while (err.empty() && recvd < iters && pump(deadline)) {}
    }
    const auto drain = Clock::now() + e.wait();
    while (err.empty() && send_done < sends && pump(drain)) {}
  }
  if (!err.empty() && std::getenv("PROBE_DEBUG")) std::fprintf(stderr, "rank %d latency: %s\n", e.rank, err.c_str());
  auto agreed = e.agree(err.empty() && *both);
  if (!agreed) return fail(agreed.error());
  if (!*agreed) {
    e.result("latency_4k_us", "untested", err.empty() ? "the other end failed" : err);
    return {};
  }
  // The client timed the round trips; both ends report its numbers.
  json mine = nullptr;
  if (!us.empty()) {
    std::sort(us.begin(), us.end());
    mine = {{"median", std::round(us[us.size() / 2] * 100) / 100}, {"min", us.front()}, {"max", us.back()},
            {"n", us.size()}};
  }
  auto theirs = e.swap(mine);
  if (!theirs) return fail(theirs.error());
  const json& t = e.rank == 1 ? mine : *theirs;
  if (!t.is_object()) {
    e.result("latency_4k_us", "untested", "no round trip was timed");
    return {};
  }
  char buf2[160];
  std::snprintf(buf2, sizeof buf2, "median 4 KiB send round trip over %zu iterations (min %.1f us, max %.1f us)",
                t["n"].get<std::size_t>(), t["min"].get<double>(), t["max"].get<double>());
  e.result("latency_4k_us", t["median"], buf2);
  return {};
}

Result<void> probe_bandwidth(End& e) {
  const std::uint64_t largest =
      e.report["max_message_bytes"].is_number() ? e.report["max_message_bytes"].get<std::uint64_t>() : frame_bytes;
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s : {std::uint64_t{4096}, std::uint64_t{65536}, std::uint64_t{1} << 20, largest})
    if (s <= largest && (sizes.empty() || s > sizes.back())) sizes.push_back(s);
  const std::uint64_t total_want = cli::parse_size(e.o->bw_bytes).value_or(64u << 20); // checked in main()
  json rows = json::array();
  for (std::uint64_t s : sizes) {
    // Receives that fit the queue (4 KiB frames on Thunderbolt, at most 4095), up to 32; credits
    // of half of them are granted over the side channel as receives are re-posted.
    const std::uint32_t f = e.apple() ? frames_of(static_cast<std::size_t>(s)) : 1;
    const std::uint32_t slots = std::max<std::uint32_t>(1, std::min<std::uint32_t>(32, (max_depth_frames - 1) / f));
    const std::uint32_t R = std::max<std::uint32_t>(1, slots / 2);
    const std::uint32_t depth = std::min<std::uint32_t>(max_depth_frames, slots * f + 1);
    const std::uint64_t count = std::max<std::uint64_t>(slots, total_want / s);
    std::string why;
    auto p = make_pair(e, base_recipe(e, depth), why, CqWait::poll, static_cast<int>(2 * slots + 16));
    if (!p) return fail(p.error());
    auto buf = make_buf(e, static_cast<std::size_t>(s));
    auto ok = e.agree(p->qp.has_value() && static_cast<bool>(buf));
    if (!ok) return fail(ok.error());
    if (!*ok) break;
    auto sge = buf->sge(0, static_cast<std::size_t>(s));
    std::string err;
    double seconds = 0;
    auto raw_send = [&](const std::string& m) {
      return e.sc->send_to(e.peer, std::as_bytes(std::span(m.data(), m.size())), e.dl());
    };
    if (e.rank == 0) {
      std::uint64_t posted = 0, got = 0;
      auto post = [&](std::uint64_t n) {
        std::uint64_t k = 0;
        for (; k < n && posted < count && err.empty(); ++k, ++posted)
          if (auto r = p->qp->recv(posted, *sge); !r) err = errtext(r.error());
        return k;
      };
      post(slots);
      if (auto m = e.send(json(err.empty() ? posted : 0)); !m) return fail(m.error());
      while (got < count && err.empty()) {
        WorkCompletion wc[32];
        auto n = p->cq->wait(wc, Clock::now() + e.wait() * 4);
        if (!n) {
          err = errtext(n.error());
          break;
        }
        for (std::size_t i = 0; i < *n; ++i)
          if (wc[i].is_recv()) ++got;
        if (posted < count && posted - got <= slots - R) {
          const std::uint64_t k = post(R);
          if (k > 0)
            if (auto m = raw_send("credit " + std::to_string(k)); !m) return fail(m.error());
        }
      }
      if (auto m = e.send(json{{"done", err.empty()}, {"err", err}}); !m) return fail(m.error());
    } else {
      auto first = e.recv();
      if (!first) return fail(first.error());
      if (!first->is_number_unsigned())
        return fail(Error::make(Step::side_channel, ErrorKind::bad_frame, "the receiver's first credit is not a count"));
      std::uint64_t credits = first->get<std::uint64_t>(), sent = 0, done = 0;
      bool verdict_seen = credits == 0;
      if (credits == 0) {
        auto v = e.recv();  // the receiver's verdict: it could not post
        if (!v) return fail(v.error());
        err = "receiver: " + v->value("err", std::string());
      }
      auto next_message = [&]() -> Result<void> {
        auto c = e.sc->recv_from(e.peer, e.dl());
        if (!c) return fail(c.error());
        const std::string m(reinterpret_cast<const char*>(c->data()), c->size());
        if (m.rfind("credit ", 0) == 0) {
          std::uint64_t more = 0;
          const auto [end, ec] = std::from_chars(m.data() + 7, m.data() + m.size(), more);
          if (ec != std::errc() || end != m.data() + m.size() || more > count)
            return fail(Error::make(Step::side_channel, ErrorKind::bad_frame, "the receiver's credit message \"" +
                                                                                  m.substr(0, 40) + "\" is not a count"));
          credits += more;
          return {};
        }
        verdict_seen = true;
        ++e.received;
        try {
          auto j = json::parse(m.substr(m.find(' ') + 1));
          if (!j.value("done", false) && err.empty()) err = "receiver: " + j.value("err", std::string());
        } catch (...) {
          err = "malformed verdict";
        }
        return {};
      };
      const auto t0 = Clock::now();
      while (sent < count && err.empty()) {
        while (credits == 0 && err.empty() && !verdict_seen)
          if (auto r = next_message(); !r) return fail(r.error());
        if (!err.empty() || credits == 0) break;
        while (sent - done >= slots && err.empty()) {
          WorkCompletion wc[32];
          auto n = p->cq->wait(wc, Clock::now() + e.wait() * 4);
          if (!n) err = errtext(n.error());
          else done += *n;
        }
        if (!err.empty()) break;
        if (auto snd = p->qp->send(sent, *sge); !snd) err = errtext(snd.error());
        ++sent;
        --credits;
      }
      while (done < sent && err.empty()) {
        WorkCompletion wc[32];
        auto n = p->cq->wait(wc, Clock::now() + e.wait() * 4);
        if (!n) err = errtext(n.error());
        else done += *n;
      }
      while (!verdict_seen)
        if (auto r = next_message(); !r) return fail(r.error());
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    auto res = e.swap(json{{"seconds", seconds}, {"err", err}});
    if (!res) return fail(res.error());
    if (e.rank == 0) {
      seconds = res->value("seconds", 0.0);
      if (err.empty()) err = res->value("err", std::string());
    }
    if (!err.empty()) {
      rows.push_back({{"bytes", s}, {"error", err}});
      break;
    }
    const double gbps = seconds > 0 ? static_cast<double>(count * s) / seconds / 1e9 : 0;
    rows.push_back({{"bytes", s}, {"messages", count}, {"gb_per_s", std::round(gbps * 1000) / 1000}});
  }
  e.result("bandwidth", rows, "one direction, up to 32 receives posted ahead (within 4095 frames), credits over the side channel");
  return {};
}

// ---------------------------------------------------------------------------------------------

json describe_host(const End& e, const Library& lib) {
  utsname u{};
  ::uname(&u);
  json h;
  h["role"] = e.rank == 0 ? "server" : "client";
  h["system"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  h["hostname"] = u.nodename;
  const std::string v = sysctl_string("kern.osproductversion"), b = sysctl_string("kern.osversion");
  h["macos"] = v.empty() ? json(nullptr) : json(v);
  h["macos_build"] = b.empty() ? json(nullptr) : json(b);
  h["library"] = std::string(lib.path());
  json devs = json::array();
  if (auto list = DeviceList::get(lib)) {
    for (const Device& d : *list) {
      json dj = {{"name", std::string(d.name())}};
      if (auto ctx = Context::open(lib, d)) {
        if (auto a = ctx->query_device())
          dj["caps"] = {{"max_qp", a->max_qp}, {"max_cq", a->max_cq}, {"max_mr", a->max_mr}, {"max_mr_size", a->max_mr_size},
                        {"max_qp_wr", a->max_qp_wr}, {"max_sge", a->max_sge}, {"max_cqe", a->max_cqe},
                        {"phys_port_cnt", a->phys_port_cnt}};
        json ports = json::array();
        if (auto pa = ctx->query_port(1)) {
          json pj = {{"port", 1}, {"state", std::string(port_state_name(pa->state))},
                     {"link_layer", static_cast<int>(pa->link_layer)}, {"active_mtu", mtu_bytes(pa->active_mtu)},
                     {"max_mtu", mtu_bytes(pa->max_mtu)}, {"max_msg_sz", pa->max_msg_sz}, {"lid", pa->lid}};
          json gids = json::array();
          if (auto t = ctx->gid_table(1))
            for (std::size_t i = 0; i < t->size(); ++i)
              if (!t->at(static_cast<int>(i)).is_zero())
                gids.push_back({{"index", i}, {"gid", t->at(static_cast<int>(i)).to_string()}});
          pj["gids"] = gids;
          ports.push_back(pj);
        }
        dj["ports"] = ports;
      }
      devs.push_back(dj);
    }
  }
  h["devices"] = devs;
  return h;
}

// Opens the device this end uses: --device, else the one discovery says faces the other end.
Result<void> open_device(End& e, const Topology* topo) {
  std::string name = e.o->device;
  if (name.empty() && topo != nullptr) {
    const auto cables = topo->between(0, 1);
    if (!cables.empty()) name = topo->end(cables.front(), e.rank).device;
  }
  auto ctx = Context::open(*e.lib, name);
  if (!ctx) return fail(ctx.error());
  e.ctx.emplace(std::move(*ctx));
  auto port = e.ctx->require_active_port(1);
  if (!port) return fail(port.error());
  e.port = *port;
  auto dev = e.ctx->query_device();
  if (!dev) return fail(dev.error());
  e.dev = *dev;
  auto table = e.ctx->gid_table(1);
  if (!table) return fail(table.error());
  e.table.emplace(std::move(*table));
  auto sel = e.table->select();
  if (!sel) return fail(sel.error());
  e.gid.emplace(*sel);
  auto pd = e.ctx->alloc_pd();
  if (!pd) return fail(pd.error());
  e.pd.emplace(std::move(*pd));
  return {};
}

void print_table(const End& e, const json& out) {
  std::printf("tbverbs-probe report (%s, %s)\n", out["link"].value("summary", std::string()).c_str(),
              out["hosts"][0].value("system", std::string()).c_str());
  for (const auto& h : out["hosts"])
    std::printf("  %s: %s%s%s\n", h.value("role", std::string()).c_str(), h.value("system", std::string()).c_str(),
                h["macos"].is_string() ? (", macOS " + h["macos"].get<std::string>()).c_str() : "",
                h["macos_build"].is_string() ? (" (" + h["macos_build"].get<std::string>() + ")").c_str() : "");
  std::printf("  %-24s %-18s %s\n", "item", "value", "how it was measured");
  for (const char* k : {"empty_rq", "completion_channels", "max_message_bytes", "mr_access", "max_mr_bytes", "max_mrs",
                        "max_qps", "sgid_index_honoured", "rdma_write_executed", "path_mtu_4096_accepted",
                        "frame_pairing_enforced", "latency_4k_us"}) {
    if (!out.contains(k)) continue;
    const json& v = out[k];
    const std::string val = v.is_string() ? v.get<std::string>() : v.dump();
    std::printf("  %-24s %-18s %s\n", k, val.c_str(), e.details.value(k, std::string()).c_str());
  }
  if (out.contains("bandwidth")) {
    for (const auto& r : out["bandwidth"]) {
      if (r.contains("gb_per_s"))
        std::printf("  %-24s %-18s %s\n", ("bandwidth " + std::to_string(r["bytes"].get<std::uint64_t>())).c_str(),
                    (std::to_string(r["gb_per_s"].get<double>()).substr(0, 6) + " GB/s").c_str(),
                    (std::to_string(r["messages"].get<std::uint64_t>()) + " messages, one direction").c_str());
      else
        std::printf("  %-24s %-18s %s\n", ("bandwidth " + std::to_string(r["bytes"].get<std::uint64_t>())).c_str(),
                    "failed", r.value("error", std::string()).c_str());
    }
  }
  for (const auto& p : out["topology_problems"]) std::printf("  topology: %s\n", p.get<std::string>().c_str());
  for (const auto& x : out["errors"]) std::printf("  error: %s\n", x.get<std::string>().c_str());
  std::printf("  resources left: %d QPs, %d MRs\n", out["resources_left"].value("qps", -1),
              out["resources_left"].value("mrs", -1));
}

// One end, start to finish. Returns the exit status.
int run_end_unguarded(const Options& o, int rank, const std::string& coordinator, bool print) {
  set_notice_handler(nullptr);  // channel fallbacks are findings here, not notices
  End e;
  e.o = &o;
  e.rank = rank;
  e.peer = 1 - rank;
  auto die = [&](const std::string& what, const Error& err) {
    std::fprintf(stderr, "tbverbs-probe (%s): FAILED during %s: %s\n", rank == 0 ? "server" : "client", what.c_str(),
                 err.message().c_str());
    return 1;
  };
  SideChannelOptions sco;
  sco.rank = rank;
  sco.size = 2;
  sco.coordinator = coordinator;
  // Without a token anyone who reaches the port can join as the other end and read this host's
  // description (docs/thunderbolt.md, "What the probe exposes"); with one, only an end given the
  // same secret gets past the rendezvous.
  sco.job_token = probe_job_token(o.token);
  sco.timeout = std::chrono::milliseconds(o.timeout_ms * 4);
  if (rank == 0 && !o.local)
    sco.on_listening = [](std::uint16_t port) {
      std::fprintf(stderr, "tbverbs-probe: waiting on port %u for `tbverbs-probe --connect <this host>:%u`\n", port, port);
    };
  auto sc = SideChannel::connect(sco);
  if (!sc) return die("the side-channel rendezvous with " + coordinator, sc.error());
  e.sc = &*sc;
  auto lib = Library::load(o.library);
  if (!lib) {
    sc->abort(lib.error());
    return die("loading the verbs library", lib.error());
  }
  e.lib = &*lib;

  // Which device faces the other end: discovered from the ports' subnets (topology.hpp).
  json out = json::object();
  auto topo = discover_topology(*lib, *sc);
  std::vector<std::string> problems;
  if (topo) problems = topo->problems();
  if (auto s = open_device(e, topo ? &*topo : nullptr); !s) {
    sc->abort(s.error());
    return die("opening the device", s.error());
  }
  auto hosts = sc->all_gather(
      [&] {
        const std::string s = describe_host(e, *lib).dump();
        return std::vector<std::byte>(reinterpret_cast<const std::byte*>(s.data()),
                                      reinterpret_cast<const std::byte*>(s.data()) + s.size());
      }());
  if (!hosts) return die("exchanging the host descriptions", hosts.error());
  json hj = json::array();
  for (const auto& h : *hosts) {
    json one = json::parse(std::string(reinterpret_cast<const char*>(h.data()), h.size()), nullptr, false);
    if (!one.is_object()) {
      const Error bad = Error::make(Step::side_channel, ErrorKind::bad_frame, "a host description is not a JSON object");
      sc->abort(bad);
      return die("exchanging the host descriptions", bad);
    }
    hj.push_back(std::move(one));
  }
  auto peer_dev = e.swap(json{{"device", std::string(e.ctx->name())}, {"gid", e.gid->gid().to_string()}});
  if (!peer_dev) return die("exchanging the devices", peer_dev.error());
  if (!peer_dev->is_object() || !(*peer_dev)["device"].is_string() || !(*peer_dev)["gid"].is_string()) {
    const Error bad = Error::make(Step::side_channel, ErrorKind::bad_frame,
                                  "the other end's device message is not {\"device\": string, \"gid\": string}");
    sc->abort(bad);
    return die("exchanging the devices", bad);
  }
  out["link"] = {{"device", std::string(e.ctx->name())}, {"gid", e.gid->gid().to_string()},
                 {"gid_index", e.gid->index()}, {"peer_device", (*peer_dev)["device"]}, {"peer_gid", (*peer_dev)["gid"]},
                 {"summary", std::string(e.ctx->name()) + " " + e.gid->gid().to_string() + " <-> " +
                                 (*peer_dev)["device"].get<std::string>() + " " + (*peer_dev)["gid"].get<std::string>()}};
  if (!hj[0]["macos"].is_null() && hj[0]["macos_build"] != hj[1]["macos_build"])
    problems.push_back("the two Macs run different macOS builds (" + hj[0].value("macos_build", std::string("?")) +
                       " and " + hj[1].value("macos_build", std::string("?")) + "): use the same build on every Mac");

  // Local limits first (nothing else is held yet), then the two-ended measurements.
  probe_mr_access(e);
  probe_max_mr_bytes(e);
  probe_max_mrs(e);
  probe_max_qps(e);
  using Probe = Result<void> (*)(End&);
  const std::pair<const char*, Probe> steps[] = {
      {"path_mtu_4096_accepted", probe_mtu4096}, {"empty_rq", probe_empty_rq},
      {"completion_channels", probe_channels},   {"frame_pairing_enforced", probe_frame_pairing},
      {"max_message_bytes", probe_max_message},  {"rdma_write_executed", probe_rdma_write},
      {"sgid_index_honoured", probe_sgid_index}, {"latency_4k_us", probe_latency},
      {"bandwidth", probe_bandwidth}};
  for (const auto& [name, fn] : steps) {
    if (auto r = fn(e); !r) {
      sc->abort(r.error());
      return die(std::string("measuring ") + name, r.error());
    }
  }
  for (const auto& [k, v] : e.report.items()) out[k] = v;
  out["tool"] = "tbverbs-probe";
  out["tbverbs_version"] = std::to_string(TBVERBS_VERSION_MAJOR) + "." + std::to_string(TBVERBS_VERSION_MINOR) + "." +
                           std::to_string(TBVERBS_VERSION_PATCH);
  out["hosts"] = hj;
  out["details"] = e.details;
  out["topology_problems"] = problems;
  out["errors"] = e.errors;
  // Every handle of a measurement is gone by now: the counts must be zero (RAII), and the report
  // says so, because a probe that leaves QPs behind on a Mac holds them until it exits.
  out["resources_left"] = {{"qps", e.ctx->info()->queue_pairs.load()}, {"mrs", e.ctx->info()->memory_regions.load()}};

  if (!o.profile_out.empty()) {
    MeasuredProfile p;
    p.device = std::string(e.ctx->name());
    if (hj[static_cast<std::size_t>(rank)]["macos"].is_string())
      p.macos = hj[static_cast<std::size_t>(rank)]["macos"].get<std::string>() + " (" +
                hj[static_cast<std::size_t>(rank)].value("macos_build", std::string()) + ")";
    if (out["max_message_bytes"].is_number()) p.max_message_bytes = out["max_message_bytes"].get<std::size_t>();
    const std::string erq = out.value("empty_rq", std::string("unknown"));
    p.empty_rq = erq == "wait" ? EmptyRqBehaviour::wait : erq == "drop" ? EmptyRqBehaviour::drop
               : erq == "kill" ? EmptyRqBehaviour::kill : EmptyRqBehaviour::unknown;
    if (out["completion_channels"].is_boolean()) p.completion_channels = out["completion_channels"].get<bool>();
    if (out["max_mr_bytes"].is_number()) p.max_mr_bytes = out["max_mr_bytes"].get<std::uint64_t>();
    if (out["max_mrs"].is_number()) p.max_mrs = out["max_mrs"].get<int>();
    if (out["max_qps"].is_number()) p.max_qps = out["max_qps"].get<int>();
    for (const char* k : {"mr_access", "sgid_index_honoured", "rdma_write_executed", "path_mtu_4096_accepted",
                          "frame_pairing_enforced", "latency_4k_us"})
      if (out.contains(k)) p.entries.emplace_back(k, out[k].is_string() ? out[k].get<std::string>() : out[k].dump());
    std::ofstream f(o.profile_out);
    f << p.format("tbverbs-probe " + out["tbverbs_version"].get<std::string>() + ", " + out["link"]["summary"].get<std::string>());
    if (!f) {
      std::fprintf(stderr, "tbverbs-probe: cannot write %s\n", o.profile_out.c_str());
      return 1;
    }
  }
  if (print) {
    if (o.as_json) std::puts(out.dump(2).c_str());
    else print_table(e, out);
    if (!o.profile_out.empty())
      std::printf("%swrote the measured profile to %s (use it with TBVERBS_PROFILE=%s)\n", o.as_json ? "" : "  ",
                  o.profile_out.c_str(), o.profile_out.c_str());
    std::fflush(stdout);
  }
  if (auto b = sc->barrier(); !b) return die("the final barrier", b.error());
  return e.errors.empty() ? 0 : 1;
}


// One end, with every byte from the other end untrusted: a message the checks above did not expect
// (a JSON value of another type, a field missing) is a clear error naming the other end, never a
// terminate (issue 19 item 1).
int run_end(const Options& o, int rank, const std::string& coordinator, bool print) {
  try {
    return run_end_unguarded(o, rank, coordinator, print);
  } catch (const std::exception& ex) {
    std::fprintf(stderr,
                 "tbverbs-probe (%s): FAILED: the other end sent a message this probe cannot use (%s); is it "
                 "tbverbs-probe of the same version, started with the same --token?\n",
                 rank == 0 ? "server" : "client", ex.what());
    return 1;
  }
}

// --local: two emulated hosts whose cable does not follow the device naming (host0's rdma_en2 to
// host1's rdma_en1, and a spare rdma_en1 on host0 with no cable), so discovery is part of the run.
int run_local(const Options& o) {
  namespace fs = std::filesystem;
  if (o.emu_library.empty()) {
    std::fprintf(stderr, "--local needs the emulated verbs library: pass --emu-library PATH\n");
    return 2;
  }
  const auto scratch = cli::LocalScratch::make("probe");
  if (!scratch) return 2;
  const fs::path& dir = scratch->dir;
  const std::string& state = scratch->state;
  json quirks = json::object();
  for (const auto& q : o.quirks) {
    const auto eq = q.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "--quirk takes NAME=VALUE, got %s\n", q.c_str());
      return 2;
    }
    quirks[q.substr(0, eq)] = q.substr(eq + 1);
  }
  json fabric = {
      {"profile", "thunderbolt"},
      {"hosts",
       {{{"name", "host0"},
         {"devices",
          {{{"name", "rdma_en1"}, {"ports", {{{"port", 1}}}}},
           {{"name", "rdma_en2"}, {"ports", {{{"port", 1}, {"ipv4", "10.99.0.1/30"}}}}}}}},
        {{"name", "host1"}, {"devices", {{{"name", "rdma_en1"}, {"ports", {{{"port", 1}, {"ipv4", "10.99.0.2/30"}}}}}}}}}},
      {"cables", json::array({json::array({"host0:rdma_en2:1", "host1:rdma_en1:1"})})}};
  if (!quirks.empty()) fabric["quirks"] = quirks;
  const std::string fabric_path = (dir / "fabric.json").string();
  std::ofstream(fabric_path) << fabric.dump(2) << "\n";
  const std::string coordinator = "127.0.0.1:" + std::to_string(tbverbs::detail::sc::free_loopback_port());
  pid_t pids[2] = {-1, -1};
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
#if defined(__linux__)
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned end holding QPs if the launcher dies
#endif
      ::setenv("TBVERBS_EMU_FABRIC", fabric_path.c_str(), 1);
      ::setenv("TBVERBS_EMU_HOST", r == 0 ? "host0" : "host1", 1);
      ::setenv("TBVERBS_EMU_STATE_DIR", state.c_str(), 1);
      ::unsetenv("TBVERBS_EMU_QUIRKS");
      Options mine = o;
      mine.library = o.emu_library;
      if (r == 1) mine.profile_out.clear();
      std::fflush(stdout);
      ::_exit(run_end(mine, r, coordinator, r == 0));
    }
    pids[r] = pid;
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int st = 0;
    if (::waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  if (!o.keep) scratch->remove();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tbverbs-probe: measures the verbs driver's contested behaviours between two hosts and reports them"};
  Options o;
  app.add_flag("--server", o.server, "this end waits for the other (run it first)");
  app.add_option("--connect", o.connect, "HOST[:PORT] of the end started with --server");
  app.add_flag("--local", o.local, "both ends on the emulated fabric on this machine");
  app.add_option("--port", o.port, "TCP port of the side channel")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--device", o.device, "device to measure (default: the one whose subnet faces the other end)");
  app.add_option("--library", o.library, "verbs library (default: TBVERBS_LIBRARY, then the platform's)");
  app.add_option("--emu-library", o.emu_library, "--local: the emulated verbs library")->capture_default_str();
  app.add_option("--quirk", o.quirks, "--local: a reading of Apple's driver the emulator plays, NAME=VALUE (repeatable)");
  app.add_flag("--json", o.as_json, "print the report as one JSON object (for a bug report)");
  app.add_option("--profile-out", o.profile_out, "write what was measured for the library (TBVERBS_PROFILE=FILE)");
  app.add_option("--timeout", o.timeout_ms, "ms: bound of every step over the side channel")
      ->check(CLI::Range(1, 86400000))->capture_default_str();
  app.add_option("--wait", o.wait_ms, "ms a message may take before it counts as not delivered")
      ->check(CLI::Range(1, 3600000))->capture_default_str();
  app.add_option("--iters", o.iters, "4 KiB round trips for the latency")->check(CLI::Range(1, 100000000))->capture_default_str();
  app.add_option("--bw-bytes", o.bw_bytes, "bytes sent per bandwidth size (e.g. 64M)")->capture_default_str();
  app.add_option("--max-qps", o.max_qps, "stop counting queue pairs here")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--max-mrs", o.max_mrs, "stop counting memory regions here")->check(CLI::Range(1, 1048576))->capture_default_str();
  app.add_option("--max-mr-bytes", o.max_mr_bytes, "largest region tried (bytes)")
      ->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 40))->capture_default_str();
  app.add_flag("--quick", o.quick, "fewer round trips and bytes (tests)");
  bool explain_flag = false;
  app.add_flag("--explain", explain_flag, "print every QP attribute the probe sets, with why (TBVERBS_EXPLAIN=1)");
  app.add_flag("--keep", o.keep, "--local: keep the temporary directory");
  std::string token_file;
  app.add_option("--token", o.token, "shared secret both ends must give (also TBVERBS_PROBE_TOKEN)");
  app.add_option("--token-file", token_file, "read the shared secret from this file (first line)")
      ->check(CLI::ExistingFile);
  if (const int rc = cli::parse_args(app, argc, argv); rc >= 0) return rc; // a usage error exits 2
  if (explain_flag) set_explain(true);
  ::signal(SIGPIPE, SIG_IGN);
  int modes = (o.server ? 1 : 0) + (o.connect.empty() ? 0 : 1) + (o.local ? 1 : 0);
  // Started by a launcher (torchrun, mpirun, srun, mlx.launch; tools/common/launcher_env.hpp) with
  // none of the three: rank 0 is the server, rank 1 the client, at the launcher's coordinator.
  std::string launcher_problem;
  const auto job = cli::launcher_job(launcher_problem);
  bool launched = false;
  if (modes == 0 && !job) {
    std::fprintf(stderr, "tbverbs-probe: %s\n", launcher_problem.c_str());
    return 2;
  }
  if (modes == 0 && job->rank) {
    if (job->size && *job->size != 2) {
      std::fprintf(stderr, "tbverbs-probe: %s=%d (%s): the probe measures between exactly 2 ranks\n",
                   job->size_variable.c_str(), *job->size, job->launcher.c_str());
      return 2;
    }
    if (*job->rank > 1) {
      std::fprintf(stderr, "tbverbs-probe: %s=%d (%s): the probe has ranks 0 (server) and 1 (client) only\n",
                   job->rank_variable.c_str(), *job->rank, job->launcher.c_str());
      return 2;
    }
    if (job->coordinator.empty()) {
      std::fprintf(stderr, "tbverbs-probe: %s gave rank %d but no coordinator: set %s\n", job->launcher.c_str(),
                   *job->rank, cli::kCoordinatorVariables);
      return 2;
    }
    launched = true;
    modes = 1;
  }
  if (modes != 1) {
    std::fprintf(stderr, "tbverbs-probe: give exactly one of --server, --connect HOST[:PORT] or --local (or start it "
                         "with a launcher: %s, with a coordinator)\n", cli::kRankVariables);
    return 2;
  }
  if (!o.quirks.empty() && !o.local) {
    std::fprintf(stderr, "tbverbs-probe: --quirk only applies to --local (the emulator)\n");
    return 2;
  }
  if (!token_file.empty()) {
    std::ifstream f(token_file);
    std::getline(f, o.token);
    if (o.token.empty()) {
      std::fprintf(stderr, "tbverbs-probe: --token-file %s: no secret on its first line\n", token_file.c_str());
      return 2;
    }
  } else if (const char* t = std::getenv("TBVERBS_PROBE_TOKEN"); o.token.empty() && t != nullptr) {
    o.token = t;
  }
  // The size as given is checked before --quick picks a smaller default (it used to hide a bad one).
  if (const auto bw = cli::parse_size(o.bw_bytes); !bw || *bw == 0) {
    std::fprintf(stderr, "tbverbs-probe: --bw-bytes %s: not %s above 0\n", o.bw_bytes.c_str(), cli::kSizeSyntax);
    return 2;
  }
  if (o.quick) {
    o.iters = std::min(o.iters, 100);
    if (app.count("--bw-bytes") == 0) o.bw_bytes = "4M";
    o.wait_ms = std::min(o.wait_ms, 500);
  }
  if (o.local) return run_local(o);
  if (launched) return run_end(o, *job->rank, job->coordinator, true);
  if (o.server) return run_end(o, 0, "0.0.0.0:" + std::to_string(o.port), true);
  std::string c = o.connect;
  if (c.find(':') == std::string::npos) c += ":" + std::to_string(o.port);
  return run_end(o, 1, c, true);
}
