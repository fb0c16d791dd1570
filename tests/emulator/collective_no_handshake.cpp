// A two-rank exchange written the way a real third-party collective (JACCL) does
// it on Thunderbolt: UC, queue depth 32, each rank posts two 512 KiB receives and
// immediately its two 512 KiB sends, with no "receives are posted" handshake, then
// polls with a deadline. The addresses are exchanged beforehand (over pipes here).
//
// Under empty_rq=wait (Apple's credit-based flow control) it must complete with the
// data verified on both sides every time; under drop and kill it must report the
// missing completions before its deadline, never hang. --late-rank1 1 makes rank 1
// post its first receives only after rank 0 has posted its sends (plus --skew-ms),
// so rank 0's sends meet an empty receive queue every time: the race that real
// jitter makes happen sometimes, made deterministic (the test harness's doing, not
// a handshake of the collective).
//
// usage: tbverbs_emu_collective [--rounds N] [--skew-ms MS] [--deadline-ms MS] [--late-rank1 0|1]
// The fabric is private (a temporary file); quirks come from TBVERBS_EMU_QUIRKS.
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "emu_test_util.hpp"

using namespace emutest;

namespace {

constexpr uint32_t kMsg = 512 << 10;
constexpr int kMsgs = 2;

struct Opts {
  int rounds = 3;
  int skew_ms = 300;
  int deadline_ms = 30000;
  bool late_rank1 = true;
  int sent_w = -1, sent_r = -1;  // rank 0 → rank 1: "my round-0 sends are posted"
};

char pattern(int rank, int round, int msg, uint32_t i) { return static_cast<char>(rank * 67 + round * 13 + msg * 5 + i * 7); }

// One rank. Returns 0 on success; prints what is missing otherwise.
int run_rank(int rank, const Opts& o, int wfd, int rfd) {
  const char* host = rank == 0 ? "hostA" : "hostB";
  Side s;
  // Buffer: [receive 0][receive 1][send 0][send 1]
  if (!s.open(host, "rdma_en1", IBV_QPT_UC, 4 * kMsg, 32,
              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) {
    std::fprintf(stderr, "rank %d: set-up failed: %s\n", rank, std::strerror(errno));
    return 1;
  }
  struct Addr {
    uint32_t qpn;
    ibv_gid gid;
  } mine{s.qp->qp_num, gid_of(s.ctx, 1)}, peer{};
  if (write(wfd, &mine, sizeof mine) != sizeof mine || read(rfd, &peer, sizeof peer) != sizeof peer) {
    std::fprintf(stderr, "rank %d: address exchange failed\n", rank);
    return 1;
  }
  if (int e = to_init(s.qp); e || (e = to_rtr(s.qp, peer.qpn, peer.gid, 1)) || (e = to_rts(s.qp))) {
    std::fprintf(stderr, "rank %d: connect failed: %s\n", rank, std::strerror(e));
    return 1;
  }
  for (int round = 0; round < o.rounds; ++round) {
    if (rank == 1 && round == 0) {
      if (o.late_rank1) {
        pollfd p{o.sent_r, POLLIN, 0};
        char c;
        if (poll(&p, 1, 10000) != 1 || read(o.sent_r, &c, 1) != 1)
          std::fprintf(stderr, "rank 1: rank 0 did not post its sends within 10 s; going on\n");
      }
      if (o.skew_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.skew_ms));
    }
    for (int m = 0; m < kMsgs; ++m) {
      for (uint32_t i = 0; i < kMsg; ++i) s.buf[(2 + m) * size_t(kMsg) + i] = pattern(rank, round, m, i);
      std::memset(s.buf.data() + m * size_t(kMsg), 0, kMsg);
    }
    for (int m = 0; m < kMsgs; ++m)
      if (int e = post_recv(s, 100 + m, m * uint64_t(kMsg), kMsg)) {
        std::fprintf(stderr, "rank %d: round %d: post_recv[%d] failed: %s\n", rank, round, m, std::strerror(e));
        return 1;
      }
    // No handshake: the sends go right after our own receives.
    for (int m = 0; m < kMsgs; ++m)
      if (int e = post_send(s, 200 + m, (2 + m) * uint64_t(kMsg), kMsg)) {
        std::fprintf(stderr, "rank %d: round %d: post_send[%d] failed: %s\n", rank, round, m, std::strerror(e));
        return 1;
      }
    if (rank == 0 && round == 0 && o.late_rank1 && write(o.sent_w, "s", 1) != 1) return 1;
    bool recv_done[kMsgs] = {}, send_done[kMsgs] = {};
    int nrecv = 0, nsend = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.deadline_ms);
    while ((nrecv < kMsgs || nsend < kMsgs) && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc[4];
      int n = ibv_poll_cq(s.cq, 4, wc);
      if (n < 0) {
        std::fprintf(stderr, "rank %d: poll_cq failed\n", rank);
        return 1;
      }
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "rank %d: round %d: wr %llu completed with %s\n", rank, round,
                       static_cast<unsigned long long>(wc[i].wr_id), ibv_wc_status_str(wc[i].status));
          return 1;
        }
        bool* done = wc[i].opcode == IBV_WC_RECV ? recv_done : send_done;
        int idx = static_cast<int>(wc[i].wr_id % 100);
        if (idx < kMsgs && !done[idx]) {
          done[idx] = true;
          ++(wc[i].opcode == IBV_WC_RECV ? nrecv : nsend);
        }
      }
    }
    if (nrecv < kMsgs || nsend < kMsgs) {
      std::string which;
      for (int m = 0; m < kMsgs; ++m)
        if (!recv_done[m]) which += " recv" + std::to_string(m);
      for (int m = 0; m < kMsgs; ++m)
        if (!send_done[m]) which += " send" + std::to_string(m);
      std::fprintf(stderr, "rank %d: round %d: missing %d of %d receive completions and %d of %d send completions (%s) after %d ms\n",
                   rank, round, kMsgs - nrecv, kMsgs, kMsgs - nsend, kMsgs, which.c_str() + 1, o.deadline_ms);
      return 1;
    }
    for (int m = 0; m < kMsgs; ++m)
      for (uint32_t i = 0; i < kMsg; ++i)
        if (s.buf[m * size_t(kMsg) + i] != pattern(1 - rank, round, m, i)) {
          std::fprintf(stderr, "rank %d: round %d: message %d corrupt at byte %u\n", rank, round, m, i);
          return 1;
        }
  }
  std::printf("rank %d: %d rounds of %d x %u bytes each way verified\n", rank, o.rounds, kMsgs, kMsg);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--rounds") o.rounds = v;
    else if (a == "--skew-ms") o.skew_ms = v;
    else if (a == "--deadline-ms") o.deadline_ms = v;
    else if (a == "--late-rank1") o.late_rank1 = v != 0;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  TempFabric f(three_hosts("thunderbolt"));
  if (!tbemu_quirks(f.p())) {
    std::fprintf(stderr, "bad fabric: %s\n", tbemu_last_error());
    return 2;
  }
  std::printf("quirks: %s\n", tbemu_quirks(f.p()));
  std::fflush(stdout);
  int p01[2], p10[2], psent[2];
  if (pipe(p01) != 0 || pipe(p10) != 0 || pipe(psent) != 0) return 2;
  o.sent_w = psent[1];
  o.sent_r = psent[0];
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      int rc = rank == 0 ? run_rank(0, o, p01[1], p10[0]) : run_rank(1, o, p10[1], p01[0]);
      std::fflush(nullptr);
      _exit(rc);
    }
  }
  // Each rank has its own deadline; this one only guards against a hang in set-up.
  int failed = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.rounds * (o.deadline_ms + 5000) + o.skew_ms);
  for (int rank = 0; rank < 2; ++rank) {
    int st = 0;
    while (waitpid(pids[rank], &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        std::fprintf(stderr, "rank %d: hung; killed\n", rank);
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
  }
  if (failed) std::fprintf(stderr, "collective: FAILED (%d rank(s))\n", failed);
  else std::printf("collective: OK\n");
  return failed ? 1 : 0;
}
