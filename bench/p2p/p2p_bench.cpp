// Point-to-point benchmark over the emulated verbs fabric.
//
// Two processes (fork): the sender on hostA, the receiver on hostB, one UC QP
// each, raw verbs calls. Reports, as CSV on stdout:
//   bw,<bytes>,<messages>,<seconds>,<emu GB/s>,<memcpy GB/s>,<ratio>
//   lat,4096,<round trips>,<seconds>,<round-trip us>,<one-way us>,
// where memcpy GB/s is single-thread memcpy of the same message size measured in
// the same run, so the ratio is machine independent.
#include <infiniband/verbs.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// Waits (bounded) for `want` completions of one kind (receives carry bit 63 in wr_id).
void wait_cq(Endpoint& e, int want, bool recv_tag) {
  ibv_wc wc[32];
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (g_seen[recv_tag] < want) {
    int n = ibv_poll_cq(e.cq, 32, wc);
    if (n < 0) die("ibv_poll_cq");
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "p2p_bench: completion error %s\n", ibv_wc_status_str(wc[i].status));
        std::exit(1);
      }
      ++g_seen[(wc[i].wr_id >> 63) != 0];
    }
    if (n == 0 && Clock::now() > deadline) {
      std::fprintf(stderr, "p2p_bench: timed out waiting for completions\n");
      std::exit(1);
    }
  }
  g_seen[recv_tag] -= want;
}

constexpr uint64_t kRecv = 1ull << 63;

struct SizePlan {
  size_t size;
  int messages;
  int window;
};

std::vector<SizePlan> plan(size_t min_size, size_t max_size, double budget_bytes) {
  std::vector<SizePlan> v;
  for (size_t s = min_size; s <= max_size; s *= 2) {
    int msgs = static_cast<int>(std::clamp(budget_bytes / double(s), 16.0, 20000.0));
    int window = static_cast<int>(std::clamp<size_t>((8u << 20) / s, 1, 64));
    msgs = (msgs + window - 1) / window * window;
    v.push_back({s, msgs, window});
  }
  return v;
}

// Receiver: per batch, post `window` receives, tell the sender (token), take them.
void run_receiver(Endpoint& e, const std::vector<SizePlan>& sizes, int lat_iters) {
  for (const auto& p : sizes) {
    for (int done = 0; done < p.messages; done += p.window) {
      for (int i = 0; i < p.window; ++i) post_recv(e, e.data, static_cast<uint32_t>(p.size), e.data_mr->lkey, kRecv | i);
      post_send(e, e.tok, 0, e.tok_mr->lkey, 1, true);  // credit token
      wait_cq(e, 1, false);
      wait_cq(e, p.window, true);
    }
    post_send(e, e.tok, 0, e.tok_mr->lkey, 2, true);  // "all received"
    wait_cq(e, 1, false);
  }
  // Latency: echo every 4 KiB message back.
  post_recv(e, e.data, 4096, e.data_mr->lkey, kRecv);
  post_send(e, e.tok, 0, e.tok_mr->lkey, 3, true);  // ready
  wait_cq(e, 1, false);
  for (int i = 0; i < lat_iters; ++i) {
    wait_cq(e, 1, true);
    post_recv(e, e.data, 4096, e.data_mr->lkey, kRecv);
    post_send(e, e.data, 4096, e.data_mr->lkey, 4, false);
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

}  // namespace

int main(int argc, char** argv) {
  size_t min_size = 1024, max_size = 64u << 20;
  double budget = 256.0 * (1 << 20);
  int lat_iters = 20000;
  std::string profile = "rdma-core-rc";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      budget = 32.0 * (1 << 20);
      lat_iters = 2000;
    } else if (a == "--max" && i + 1 < argc) {
      max_size = std::strtoull(argv[++i], nullptr, 0);
    } else if (a == "--profile" && i + 1 < argc) {
      profile = argv[++i];
    } else {
      std::fprintf(stderr, "usage: p2p_bench [--quick] [--max BYTES] [--profile rdma-core-rc|thunderbolt]\n");
      return 2;
    }
  }
  const bool tb = profile == "thunderbolt";
  if (!tb && profile != "rdma-core-rc") {
    std::fprintf(stderr, "p2p_bench: unknown profile %s\n", profile.c_str());
    return 2;
  }
  if (tb) max_size = std::min<size_t>(max_size, 8u << 20);  // Thunderbolt's cap is 4095 frames
  // A private two-host fabric (default rdma-core-rc: no 16 MiB Thunderbolt message cap).
  char tmpl[] = "/tmp/tbverbs-p2p-XXXXXX";
  if (!mkdtemp(tmpl)) die("mkdtemp");
  std::string fabric = std::string(tmpl) + "/fabric.json";
  std::ofstream(fabric) << R"({"profile": ")" << profile << R"(", "hosts": [
      {"name": "hostA", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.1/30"}]}]},
      {"name": "hostB", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.2/30"}]}]}],
    "cables": [["hostA:rdma_en1:1", "hostB:rdma_en1:1"]]})";
  setenv("TBVERBS_EMU_FABRIC", fabric.c_str(), 1);
  auto sizes = plan(min_size, max_size, budget);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair");
  pid_t child = fork();
  if (child < 0) die("fork");
  const bool sender = child != 0;
  Endpoint e;
  open_endpoint(e, sender ? "hostA" : "hostB", max_size, 64, tb);
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
    run_receiver(e, sizes, lat_iters);
    _exit(0);
  }

  std::printf("kind,bytes,count,seconds,emu_GBps_or_rtt_us,memcpy_GBps_or_oneway_us,ratio\n");
  double ratio_4m = 0;
  for (const auto& p : sizes) {
    auto t0 = Clock::now();
    for (int done = 0; done < p.messages; done += p.window) {
      wait_cq(e, 1, true);  // credit: window receives are posted
      post_recv(e, e.tok, sizeof e.tok, e.tok_mr->lkey, kRecv | 1000);
      for (int i = 0; i < p.window; ++i)
        post_send(e, e.data, static_cast<uint32_t>(p.size), e.data_mr->lkey, static_cast<uint64_t>(i),
                  i == p.window - 1);
      wait_cq(e, 1, false);
    }
    wait_cq(e, 1, true);  // all received
    post_recv(e, e.tok, sizeof e.tok, e.tok_mr->lkey, kRecv | 1000);
    double s = seconds_since(t0);
    double gbps = double(p.size) * p.messages / s / 1e9;
    double mc = memcpy_gbps(p.size, budget);
    std::printf("bw,%zu,%d,%.6f,%.3f,%.3f,%.3f\n", p.size, p.messages, s, gbps, mc, gbps / mc);
    std::fflush(stdout);
    if (p.size == (4u << 20)) ratio_4m = gbps / mc;
  }
  // Latency: 4 KiB ping-pong.
  wait_cq(e, 1, true);  // receiver ready
  post_recv(e, e.data, 4096, e.data_mr->lkey, kRecv);
  auto t0 = Clock::now();
  for (int i = 0; i < lat_iters; ++i) {
    post_send(e, e.data, 4096, e.data_mr->lkey, 5, false);
    wait_cq(e, 1, true);
    post_recv(e, e.data, 4096, e.data_mr->lkey, kRecv);
  }
  double s = seconds_since(t0);
  double rtt = s / lat_iters * 1e6;
  std::printf("lat,4096,%d,%.6f,%.3f,%.3f,\n", lat_iters, s, rtt, rtt / 2);
  int st = 0;
  waitpid(child, &st, 0);
  std::fprintf(stderr, "p2p_bench: 4 MiB bandwidth ratio to memcpy %.3f; 4 KiB round trip %.2f us\n", ratio_4m, rtt);
  std::error_code ec;
  if (const char* sd = tbemu_state_dir(fabric.c_str())) std::filesystem::remove_all(sd, ec);
  std::filesystem::remove_all(tmpl, ec);
  return (WIFEXITED(st) && WEXITSTATUS(st) == 0) ? 0 : 1;
}
