// Point-to-point benchmark over the emulated verbs fabric.
//
// Two processes (fork): the sender on hostA, the receiver on hostB, one UC QP
// each, raw verbs calls. Reports, as CSV on stdout:
//   bw,<bytes>,<messages>,<seconds>,<emu GB/s>,<memcpy GB/s>,<ratio>,<model GB/s>,<ratio to model>
//   lat,<bytes>,<round trips>,<seconds>,<round-trip us>,<one-way us>,,<model one-way us>,<ratio to model>
// where memcpy GB/s is single-thread memcpy of the same message size measured in
// the same run, so the ratio is machine independent. The bandwidth is the receiver's:
// (messages - 1) x bytes over the time from its first to its last receive completion,
// so neither the start-up nor the latency of the last message counts. With a paced link
// (--link-gbps, --link-latency-us: docs/emulator.md, "Link pacing") the model columns hold the
// link's bandwidth and the model's one-way time (bytes / B + L), and a `link` row the latency
// measured (the typical, i.e. median, one-way time minus bytes / B) against L; unpaced they are
// empty.
#include <infiniband/verbs.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "device_file.hpp"  // examples/ring_all_sum: ring::parse_size, the ring's size syntax
#include "tbverbs_emu/control.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "p2p_bench: %s failed: %s\n", what, std::strerror(errno));
  std::exit(1);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Endpoint {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* data_mr = nullptr;
  ibv_mr* tok_mr = nullptr;
  char* data = nullptr;
  size_t data_len = 0;
  char tok[4096] = {};  // token receives are full-size so a 4 KiB echo may land in any of them
};

void open_endpoint(Endpoint& e, const char* host, size_t max_msg, uint32_t depth, bool thunderbolt) {
  setenv("TBVERBS_EMU_HOST", host, 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) die("ibv_get_device_list");
  e.ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!e.ctx) die("ibv_open_device");
  if (!(e.pd = ibv_alloc_pd(e.ctx))) die("ibv_alloc_pd");
  if (!(e.cq = ibv_create_cq(e.ctx, 4 * static_cast<int>(depth) + 16, nullptr, nullptr, 0))) die("ibv_create_cq");
  max_msg = std::max<size_t>(max_msg, 4096);  // the latency test uses 4 KiB
  e.data_len = max_msg;
  e.data = static_cast<char*>(aligned_alloc(4096, max_msg));
  if (!e.data) die("aligned_alloc");
  std::memset(e.data, 1, max_msg);  // fault the pages in before timing
  if (!(e.data_mr = ibv_reg_mr(e.pd, e.data, max_msg, static_cast<int>(IBV_ACCESS_LOCAL_WRITE)))) die("ibv_reg_mr");
  if (!(e.tok_mr = ibv_reg_mr(e.pd, e.tok, sizeof e.tok, static_cast<int>(IBV_ACCESS_LOCAL_WRITE)))) die("ibv_reg_mr");
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = e.cq;
  a.cap.max_send_wr = a.cap.max_recv_wr = depth + 8;
  // Thunderbolt counts depth in 4 KiB frames: ask for the most (4095).
  if (thunderbolt) a.cap.max_send_wr = a.cap.max_recv_wr = 4095;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.qp_type = IBV_QPT_UC;
  if (!(e.qp = ibv_create_qp(e.pd, &a))) die("ibv_create_qp");
}

void connect_endpoint(Endpoint& e, uint32_t remote_qpn, const ibv_gid& remote_gid) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = remote_qpn;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = remote_gid;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
    die("RTR");
  a = {};
  a.qp_state = IBV_QPS_RTS;
  if (ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) die("RTS");
}

void post_recv(Endpoint& e, char* addr, uint32_t len, uint32_t lkey, uint64_t id) {
  ibv_sge s{reinterpret_cast<uint64_t>(addr), len, lkey};
  ibv_recv_wr w{};
  w.wr_id = id;
  w.sg_list = &s;
  w.num_sge = 1;
  ibv_recv_wr* bad;
  if (ibv_post_recv(e.qp, &w, &bad)) die("ibv_post_recv");
}

void post_send(Endpoint& e, char* addr, uint32_t len, uint32_t lkey, uint64_t id, bool signaled) {
  ibv_sge s{reinterpret_cast<uint64_t>(addr), len, lkey};
  ibv_send_wr w{};
  w.wr_id = id;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_SEND;
  w.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  ibv_send_wr* bad;
  if (ibv_post_send(e.qp, &w, &bad)) die("ibv_post_send");
}

// Completions seen but not yet waited for, by kind (0 = send, 1 = receive): a
// wait for one kind must not throw away completions of the other.
long g_seen[2] = {0, 0};
// Bound of every completion wait (--timeout).
std::chrono::milliseconds g_timeout{30000};
// When this process last saw a receive completion (the receiver's bandwidth clock).
Clock::time_point g_last_recv;

// Waits (bounded) for `want` completions of one kind (receives carry bit 63 in wr_id).
void wait_cq(Endpoint& e, int want, bool recv_tag) {
  ibv_wc wc[32];
  auto deadline = Clock::now() + g_timeout;
  while (g_seen[recv_tag] < want) {
    int n = ibv_poll_cq(e.cq, 32, wc);
    if (n < 0) die("ibv_poll_cq");
    bool recv = false;
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "p2p_bench: completion error %s\n", ibv_wc_status_str(wc[i].status));
        std::exit(1);
      }
      recv = recv || (wc[i].wr_id >> 63) != 0;
      ++g_seen[(wc[i].wr_id >> 63) != 0];
    }
    if (recv) g_last_recv = Clock::now();
    if (n == 0 && Clock::now() > deadline) {
      std::fprintf(stderr, "p2p_bench: no completion for %lld ms (--timeout)\n",
                   static_cast<long long>(g_timeout.count()));
      std::exit(1);
    }
  }
  g_seen[recv_tag] -= want;
}

constexpr uint64_t kRecv = 1ull << 63;

struct SizePlan {
  size_t size;
  int messages;
  int window;  // messages per credit
  int depth;   // windows of receives posted ahead (the link does not wait for a credit)
};

// `budget_bytes` per size; `queue_frames`: the Thunderbolt receive queue in 4 KiB frames (0: RC).
std::vector<SizePlan> plan(size_t min_size, size_t max_size, double budget_bytes, uint32_t queue_frames) {
  std::vector<SizePlan> v;
  for (size_t s = min_size; s <= max_size; s *= 2) {
    int msgs = static_cast<int>(std::clamp(budget_bytes / double(s), 16.0, 20000.0));
    int window = static_cast<int>(std::clamp<size_t>((4u << 20) / s, 1, 64));
    msgs = (msgs + window - 1) / window * window;
    // Up to 4 windows ahead: a window of one large message on a paced link must not wait for the
    // credit's round trip (2 L) behind it. Thunderbolt counts its queue in frames.
    const size_t frames = (s + 4095) / 4096;
    int depth = 4;
    while (depth > 1 && queue_frames != 0 && depth * window * frames + 16 > queue_frames) depth /= 2;
    v.push_back({s, msgs, window, depth});
  }
  return v;
}

// Receiver: per size, `depth` windows of receives posted ahead, each announced with a credit
// token; a window taken, the next one posted. Then an "all received" token carrying the time from
// the first to the last receive completion (ns), and the latency echo.
void run_receiver(Endpoint& e, const std::vector<SizePlan>& sizes, size_t lat_size, int lat_iters) {
  for (const auto& p : sizes) {
    const int batches = p.messages / p.window;
    auto credit = [&] {
      for (int i = 0; i < p.window; ++i) post_recv(e, e.data, static_cast<uint32_t>(p.size), e.data_mr->lkey, kRecv | i);
      post_send(e, e.tok, 0, e.tok_mr->lkey, 1, false);  // unsignaled: nothing to reap
    };
    for (int b = 0; b < std::min(p.depth, batches); ++b) credit();
    Clock::time_point first{};
    for (int b = 0; b < batches; ++b) {
      for (int i = 0; i < p.window; ++i) {
        wait_cq(e, 1, true);
        if (b == 0 && i == 0) first = g_last_recv;
      }
      if (b + p.depth < batches) credit();
    }
    const int64_t span_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(g_last_recv - first).count();
    std::memcpy(e.tok, &span_ns, sizeof span_ns);
    post_send(e, e.tok, sizeof span_ns, e.tok_mr->lkey, 2, true);  // "all received"
    wait_cq(e, 1, false);
  }
  // Latency: echo every message back.
  post_recv(e, e.data, static_cast<uint32_t>(lat_size), e.data_mr->lkey, kRecv);
  post_send(e, e.tok, 0, e.tok_mr->lkey, 3, true);  // ready
  wait_cq(e, 1, false);
  for (int i = 0; i < lat_iters; ++i) {
    wait_cq(e, 1, true);
    post_recv(e, e.data, static_cast<uint32_t>(lat_size), e.data_mr->lkey, kRecv);
    post_send(e, e.data, static_cast<uint32_t>(lat_size), e.data_mr->lkey, 4, false);
  }
}

double memcpy_gbps(size_t size, double budget_bytes) {
  std::vector<char> a(size, 1), b(size, 2);
  int reps = static_cast<int>(std::clamp(budget_bytes / double(size), 16.0, 20000.0));
  std::memcpy(b.data(), a.data(), size);  // warm
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    a[static_cast<size_t>(i) % size] = static_cast<char>(i);  // keep the copy from being elided
    std::memcpy(b.data(), a.data(), size);
  }
  double s = seconds_since(t0);
  volatile char sink = b[size / 2];
  (void)sink;
  return double(size) * reps / s / 1e9;
}

// A size option in the ring's syntax (4K, 64M); exits with a message for anything else.
size_t size_arg(const std::string& text, const char* option) {
  auto v = ring::parse_size(text);
  if (!v || *v == 0 || *v > (1ull << 31)) {
    std::fprintf(stderr, "p2p_bench: %s %s: expected a size like 4K, 1M, 64M (1 byte to 2G)\n", option, text.c_str());
    std::exit(2);
  }
  return *v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tbverbs_p2p_bench: point-to-point bandwidth and latency over the emulated fabric (two processes, "
               "one UC QP each, raw verbs), as CSV"};
  bool quick = false;
  std::string min_text = "1K", max_text = "64M", lat_text = "4K";
  std::string profile = "rdma-core-rc";
  double link_gbps = 0, link_latency_us = -1;
  int lat_iters = 0;
  long long timeout_ms = 30000;
  app.add_flag("--quick", quick, "a short run (32 MiB per size, 2000 round trips; paced: about 0.1 s per size)");
  app.add_option("--min", min_text, "smallest message, e.g. 1K")->capture_default_str();
  app.add_option("--max", max_text, "largest message, e.g. 4M (Thunderbolt: at most 8M)")->capture_default_str();
  app.add_option("--lat-size", lat_text, "message of the latency ping-pong")->capture_default_str();
  app.add_option("--lat-iters", lat_iters, "round trips of the latency ping-pong (default: by mode)");
  app.add_option("--profile", profile, "emulated NICs")
      ->check(CLI::IsMember({"rdma-core-rc", "thunderbolt"}))
      ->capture_default_str();
  app.add_option("--link-gbps", link_gbps, "pace the cable: bandwidth of each direction, GB/s (docs/emulator.md)")
      ->check(CLI::Range(1e-6, 1e6));
  app.add_option("--link-latency-us", link_latency_us, "pace the cable: latency of each direction, us")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--timeout", timeout_ms, "ms: bound of every completion wait")
      ->check(CLI::Range(1LL, 3600000LL))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const size_t min_size = size_arg(min_text, "--min");
  size_t max_size = size_arg(max_text, "--max");
  const size_t lat_size = size_arg(lat_text, "--lat-size");
  g_timeout = std::chrono::milliseconds(timeout_ms);
  const bool tb = profile == "thunderbolt";
  if (tb) max_size = std::min<size_t>(max_size, 8u << 20);  // Thunderbolt's cap is 4095 frames
  if (min_size > max_size || (tb && lat_size > (8u << 20))) {
    std::fprintf(stderr, "p2p_bench: --min must not exceed --max (Thunderbolt: messages of at most 8M)\n");
    return 2;
  }
  const bool paced = link_gbps > 0 || link_latency_us >= 0;
  const double lat_us = std::max(0.0, link_latency_us);
  // Unpaced: 256 MiB per size (32 quick). Paced: what the link carries in 0.4 s (0.1 quick), so a
  // slow link does not take minutes, and every size is long against the latency.
  double budget = (quick ? 32.0 : 256.0) * (1 << 20);
  if (link_gbps > 0) budget = link_gbps * 1e9 * (quick ? 0.1 : 0.4);
  if (lat_iters <= 0) {
    lat_iters = quick ? 2000 : 20000;
    if (paced) {  // about 0.2 s (0.05 quick) of round trips, at least 20
      const double rtt_us = 2 * ((link_gbps > 0 ? double(lat_size) / link_gbps / 1e3 : 0) + lat_us);
      lat_iters = static_cast<int>(std::clamp((quick ? 5e4 : 2e5) / std::max(rtt_us, 1.0), 20.0, double(lat_iters)));
    }
  }
  // A private two-host fabric (default rdma-core-rc: no 16 MiB Thunderbolt message cap).
  char tmpl[] = "/tmp/tbverbs-p2p-XXXXXX";
  if (!mkdtemp(tmpl)) die("mkdtemp");
  std::string fabric = std::string(tmpl) + "/fabric.json";
  std::string link;
  if (paced) {
    link = R"("link": {)";
    if (link_gbps > 0) link += R"("gbytes_per_s": )" + std::to_string(link_gbps) + (link_latency_us >= 0 ? ", " : "");
    if (link_latency_us >= 0) link += R"("latency_us": )" + std::to_string(link_latency_us);
    link += "}, ";
  }
  std::ofstream(fabric) << R"({"profile": ")" << profile << R"(", )" << link << R"("hosts": [
      {"name": "hostA", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.1/30"}]}]},
      {"name": "hostB", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.2/30"}]}]}],
    "cables": [["hostA:rdma_en1:1", "hostB:rdma_en1:1"]]})";
  setenv("TBVERBS_EMU_FABRIC", fabric.c_str(), 1);
  auto sizes = plan(min_size, max_size, budget, tb ? 4095 : 0);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair");
  pid_t child = fork();
  if (child < 0) die("fork");
  const bool sender = child != 0;
  Endpoint e;
  open_endpoint(e, sender ? "hostA" : "hostB", std::max(max_size, lat_size), 4 * 64 + 8, tb);
  int fd = sender ? sv[0] : sv[1];
  uint32_t mine = e.qp->qp_num, theirs = 0;
  if (write(fd, &mine, 4) != 4 || read(fd, &theirs, 4) != 4) die("qpn exchange");
  ibv_gid peer{};
  peer.raw[10] = peer.raw[11] = 0xff;
  peer.raw[12] = 10;
  peer.raw[15] = sender ? 2 : 1;
  connect_endpoint(e, theirs, peer);
  // Pre-post token receives before telling the peer we are connected.
  if (sender)
    for (int i = 0; i < 8; ++i) post_recv(e, e.tok, sizeof e.tok, e.tok_mr->lkey, kRecv | 1000);
  char c = 'r';
  if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1) die("barrier");

  if (!sender) {
    run_receiver(e, sizes, lat_size, lat_iters);
    _exit(0);
  }

  auto model = [&](double v) { return paced && v > 0 ? std::to_string(v) : std::string(); };
  auto ratio = [&](double got, double want) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4f", got / want);
    return paced && want > 0 ? std::string(b) : std::string();
  };
  std::printf("kind,bytes,count,seconds,emu_GBps_or_rtt_us,memcpy_GBps_or_oneway_us,ratio,model,ratio_to_model\n");
  double ratio_4m = 0, last_gbps = 0;
  for (const auto& p : sizes) {
    const int batches = p.messages / p.window;
    auto t0 = Clock::now();
    for (int b = 0; b < batches; ++b) {
      wait_cq(e, 1, true);  // credit: window receives are posted
      post_recv(e, e.tok, sizeof e.tok, e.tok_mr->lkey, kRecv | 1000);
      for (int i = 0; i < p.window; ++i)
        post_send(e, e.data, static_cast<uint32_t>(p.size), e.data_mr->lkey, static_cast<uint64_t>(i),
                  i == p.window - 1);
      if (b + 1 >= p.depth) wait_cq(e, 1, false);  // at most `depth` windows of sends outstanding
    }
    wait_cq(e, batches - std::max(0, batches - p.depth + 1), false);  // the windows not yet waited for
    wait_cq(e, 1, true);  // all received: the receiver's first-to-last time
    int64_t span_ns = 0;
    std::memcpy(&span_ns, e.tok, sizeof span_ns);
    post_recv(e, e.tok, sizeof e.tok, e.tok_mr->lkey, kRecv | 1000);
    double s = seconds_since(t0);
    double gbps = span_ns > 0 ? double(p.size) * (p.messages - 1) / double(span_ns) : 0;
    double mc = memcpy_gbps(p.size, std::min(budget, 256.0 * (1 << 20)));
    std::printf("bw,%zu,%d,%.6f,%.3f,%.3f,%.3f,%s,%s\n", p.size, p.messages, s, gbps, mc, gbps / mc,
                model(link_gbps).c_str(), ratio(gbps, link_gbps).c_str());
    std::fflush(stdout);
    if (p.size == (4u << 20)) ratio_4m = gbps / mc;
    last_gbps = gbps;
  }
  // Latency: ping-pong.
  wait_cq(e, 1, true);  // receiver ready
  post_recv(e, e.data, static_cast<uint32_t>(lat_size), e.data_mr->lkey, kRecv);
  std::vector<double> rtts(static_cast<size_t>(lat_iters));
  auto t0 = Clock::now();
  for (int i = 0; i < lat_iters; ++i) {
    const auto t = Clock::now();
    post_send(e, e.data, static_cast<uint32_t>(lat_size), e.data_mr->lkey, 5, false);
    wait_cq(e, 1, true);
    rtts[static_cast<size_t>(i)] = seconds_since(t) * 1e6;
    post_recv(e, e.data, static_cast<uint32_t>(lat_size), e.data_mr->lkey, kRecv);
  }
  double s = seconds_since(t0);
  double rtt = s / lat_iters * 1e6;
  // The typical round trip (median, as perftest's t_typical): a round trip that lost the CPU to
  // another process for a scheduler slice does not move it.
  std::nth_element(rtts.begin(), rtts.begin() + lat_iters / 2, rtts.end());
  const double typical = rtts[static_cast<size_t>(lat_iters / 2)];
  const double wire_us = link_gbps > 0 ? double(lat_size) / link_gbps / 1e3 : 0;  // bytes / B
  std::printf("lat,%zu,%d,%.6f,%.3f,%.3f,,%s,%s\n", lat_size, lat_iters, s, rtt, rtt / 2,
              model(wire_us + lat_us).c_str(), ratio(rtt / 2, wire_us + lat_us).c_str());
  if (paced && lat_us > 0)
    std::printf("link,%zu,%d,%.6f,%.3f,,,%s,%s\n", lat_size, lat_iters, s, typical / 2 - wire_us, model(lat_us).c_str(),
                ratio(typical / 2 - wire_us, lat_us).c_str());
  int st = 0;
  waitpid(child, &st, 0);
  std::fprintf(stderr, "p2p_bench: 4 MiB bandwidth ratio to memcpy %.3f; %zu-byte round trip %.2f us\n", ratio_4m,
               lat_size, rtt);
  if (paced)
    std::fprintf(stderr,
                 "p2p_bench: link model %s GB/s, %.3f us: measured %.4f GB/s at %zu bytes, latency %.2f us (typical "
                 "one-way minus bytes / B)\n",
                 link_gbps > 0 ? std::to_string(link_gbps).c_str() : "unpaced", lat_us, last_gbps, sizes.back().size,
                 typical / 2 - wire_us);
  std::error_code ec;
  if (const char* sd = tbemu_state_dir(fabric.c_str())) std::filesystem::remove_all(sd, ec);
  std::filesystem::remove_all(tmpl, ec);
  return (WIFEXITED(st) && WEXITSTATUS(st) == 0) ? 0 : 1;
}
