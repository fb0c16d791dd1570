// `tbverbs-emu trace FILE`: the emulator's trace lines (TBVERBS_EMU_TRACE, emulator/src/trace.cpp)
// as one timeline per QP, times from the file's first event. Lines that are not trace lines (a
// program's own output on a shared stderr) are skipped; a trace line that does not parse is
// counted and reported, never guessed at.
#include "trace_timeline.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace tbverbs_emu_cli {

namespace {

struct Event {
  long long us = 0;
  std::string what;  // the event and its fields, as written
};

struct Qp {
  std::string host, device, qp;
  std::vector<Event> events;
};

// "emu-trace <µs> <host> <device> qp=0x<hex> <event> [fields...]"
bool parse(const std::string& line, long long* us, std::string* host, std::string* device, std::string* qp,
           std::string* what) {
  std::istringstream in(line);
  std::string tag, t;
  if (!(in >> tag >> t >> *host >> *device >> *qp) || tag != "emu-trace") return false;
  if (qp->rfind("qp=0x", 0) != 0 || qp->size() <= 5) return false;
  try {
    std::size_t used = 0;
    *us = std::stoll(t, &used);
    if (used != t.size()) return false;
  } catch (...) {
    return false;
  }
  std::getline(in >> std::ws, *what);
  return !what->empty();
}

} // namespace

int print_trace_timeline(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "tbverbs-emu: trace: cannot open %s\n", path.c_str());
    return 1;
  }
  std::vector<Qp> qps;  // in order of first appearance
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> index;
  long long first = 0;
  std::size_t lines = 0, bad = 0;
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("emu-trace ");
    if (at == std::string::npos) continue;
    long long us = 0;
    std::string host, device, qp, what;
    if (!parse(line.substr(at), &us, &host, &device, &qp, &what)) {
      ++bad;
      continue;
    }
    first = lines++ == 0 ? us : std::min(first, us);  // processes' lines may land out of order
    const auto key = std::make_tuple(host, device, qp);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, qps.size()).first;
      qps.push_back(Qp{host, device, qp, {}});
    }
    qps[it->second].events.push_back(Event{us, what});
  }
  if (lines == 0) {
    std::fprintf(stderr, "tbverbs-emu: trace: no emu-trace lines in %s (was TBVERBS_EMU_TRACE set?)\n", path.c_str());
    return 1;
  }
  std::printf("%zu events on %zu QPs; times in ms from the first event\n", lines, qps.size());
  for (const Qp& q : qps) {
    std::printf("\n%s %s %s\n", q.host.c_str(), q.device.c_str(), q.qp.c_str());
    for (const Event& e : q.events)
      std::printf("  %10.3f  %s\n", static_cast<double>(e.us - first) / 1000.0, e.what.c_str());
  }
  if (bad > 0) {
    std::fprintf(stderr, "tbverbs-emu: trace: %zu emu-trace line(s) did not parse and were skipped\n", bad);
    return 1;
  }
  return 0;
}

} // namespace tbverbs_emu_cli
