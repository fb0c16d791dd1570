// Trace mode (issue 20): TBVERBS_EMU_TRACE=1 (or "stderr") writes one line per data-path event to
// stderr, TBVERBS_EMU_TRACE=FILE appends them to FILE (every process of a job may share one file:
// each line is one write() on an O_APPEND descriptor). docs/emulator.md, "Trace mode", lists the
// events; `tbverbs-emu trace FILE` prints them as a per-QP timeline.
//
// Off (the variable unset, empty or "0"), the cost is one load of g_trace_on and a branch the
// compiler marks unlikely at each site.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "local.hpp"

namespace emu {

bool g_trace_on = false;

namespace {

int g_trace_fd = -1;

// Reads TBVERBS_EMU_TRACE once, when the library is loaded (before any verb can run).
__attribute__((constructor)) void trace_init() {
  const char* v = std::getenv("TBVERBS_EMU_TRACE");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0) return;
  if (std::strcmp(v, "1") == 0 || std::strcmp(v, "stderr") == 0) {
    g_trace_fd = STDERR_FILENO;
  } else {
    g_trace_fd = ::open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_trace_fd < 0) {
      std::fprintf(stderr, "tbverbs-emu: TBVERBS_EMU_TRACE=%s: cannot open it (%s); tracing is off\n", v,
                   std::strerror(errno));
      return;
    }
  }
  g_trace_on = true;
}

} // namespace

void trace_event(const Fabric& f, int host, int dev, uint32_t qpn, const char* event, const char* fmt, ...) {
  if (g_trace_fd < 0) return;
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const long long us = static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  char line[512];
  int n = std::snprintf(line, sizeof line, "emu-trace %lld %s %s qp=0x%06x %s", us,
                        host >= 0 && host < static_cast<int>(f.hosts.size()) ? f.hosts[host].name.c_str() : "?",
                        dev >= 0 && dev < static_cast<int>(f.devices.size()) ? f.devices[dev].name.c_str() : "?",
                        qpn, event);
  if (n < 0) return;
  if (fmt != nullptr && *fmt != '\0' && n < static_cast<int>(sizeof line) - 2) {
    line[n++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    const int m = std::vsnprintf(line + n, sizeof line - static_cast<size_t>(n), fmt, ap);
    va_end(ap);
    if (m > 0) n += m;
  }
  if (n > static_cast<int>(sizeof line) - 2) n = static_cast<int>(sizeof line) - 2;  // truncated, still one line
  line[n++] = '\n';
  // One write per line: lines of several processes on one file never interleave mid-line.
  ssize_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(g_trace_fd, line + done, static_cast<size_t>(n - done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // a full disk or a closed stderr: the trace loses the line, the verbs go on
    done += w;
  }
}

const char* opcode_name(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND: return "SEND";
    case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
    case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
    case IBV_WR_RDMA_READ: return "RDMA_READ";
    case IBV_WR_ATOMIC_CMP_AND_SWP: return "ATOMIC_CMP_AND_SWP";
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return "ATOMIC_FETCH_AND_ADD";
    default: return "OTHER";
  }
}

const char* wc_status_name(ibv_wc_status st) {
  // The enum's own names (tbverbs' errors print these too, so a trace and an error grep together).
  static const char* const names[] = {
      "IBV_WC_SUCCESS",        "IBV_WC_LOC_LEN_ERR",         "IBV_WC_LOC_QP_OP_ERR",    "IBV_WC_LOC_EEC_OP_ERR",
      "IBV_WC_LOC_PROT_ERR",   "IBV_WC_WR_FLUSH_ERR",        "IBV_WC_MW_BIND_ERR",      "IBV_WC_BAD_RESP_ERR",
      "IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR",     "IBV_WC_REM_ACCESS_ERR",   "IBV_WC_REM_OP_ERR",
      "IBV_WC_RETRY_EXC_ERR",  "IBV_WC_RNR_RETRY_EXC_ERR",   "IBV_WC_LOC_RDD_VIOL_ERR", "IBV_WC_REM_INV_RD_REQ_ERR",
      "IBV_WC_REM_ABORT_ERR",  "IBV_WC_INV_EECN_ERR",        "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",
      "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR",       "IBV_WC_TM_ERR",           "IBV_WC_TM_RNDV_INCOMPLETE"};
  const auto i = static_cast<unsigned>(st);
  return i < sizeof names / sizeof names[0] ? names[i] : "IBV_WC_(unknown)";
}

const char* wc_opcode_name(ibv_wc_opcode op) {
  switch (op) {
    case IBV_WC_SEND: return "SEND";
    case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "RDMA_READ";
    case IBV_WC_COMP_SWAP: return "COMP_SWAP";
    case IBV_WC_FETCH_ADD: return "FETCH_ADD";
    case IBV_WC_RECV: return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "OTHER";
  }
}

} // namespace emu
