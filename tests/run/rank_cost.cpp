// What one rank of a communicator costs (docs/collectives.md, "What a rank costs"), measured on the
// emulated fabric under `tbverbs-emu run`: the verbs objects on each of this rank's devices (the
// emulator's own counts, tbemu_describe) after connect and after one all_reduce, and the process'
// resident memory. tests/run/cost_test.sh compares every count with the docs' table.
//
//   tbverbs-emu run -n 4 -- rank_cost [--bytes 64M] [--in-place] [--register]
//
// TBVERBS_MEMORY picks the memory mode. Prints, per device of this rank's host:
//   cost: <when> <device> qps=Q pds=P cqs=C mrs=M
// (<when>: connected, after_call) and "cost: rss_mb connected=A peak=B".
#include <tbverbs/collective.hpp>
#include <tbverbs/sizes.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The emulator's description of the fabric (tbemu_describe), from the library this process loaded.
std::string describe() {
  const char* lib = std::getenv("TBVERBS_LIBRARY");
  void* h = lib != nullptr ? ::dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto* fn = h != nullptr ? reinterpret_cast<const char* (*)(const char*)>(::dlsym(h, "tbemu_describe")) : nullptr;
  const char* text = fn != nullptr ? fn(nullptr) : nullptr;
  return text != nullptr ? text : "";
}

// Prints this host's device lines of describe(): "  device NAME profile=... qps=.. pds=.. cqs=.. mrs=.. ...".
void print_devices(const char* when) {
  const std::string host = std::getenv("TBVERBS_EMU_HOST") != nullptr ? std::getenv("TBVERBS_EMU_HOST") : "";
  std::istringstream in(describe());
  bool mine = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("host ", 0) == 0) mine = line == "host " + host;
    if (!mine || line.rfind("  device ", 0) != 0) continue;
    std::istringstream words(line.substr(9));
    std::string name, w, out;
    words >> name;
    while (words >> w)
      if (w.rfind("qps=", 0) == 0 || w.rfind("pds=", 0) == 0 || w.rfind("cqs=", 0) == 0 || w.rfind("mrs=", 0) == 0) out += " " + w;
    std::printf("cost: %s %s%s\n", when, name.c_str(), out.c_str());
  }
}

// A field of /proc/self/status in MB ("VmRSS", "VmHWM").
double status_mb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::strtod(line.c_str() + field.size() + 1, nullptr) / 1000.0;
  return -1;
}

} // namespace

int main(int argc, char** argv) {
  std::size_t bytes = 64u << 20;
  bool in_place = false, reg = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bytes" && i + 1 < argc) bytes = static_cast<std::size_t>(tbverbs::parse_size(argv[++i], std::uint64_t{1} << 32).value_or(0));
    else if (a == "--in-place") in_place = true;
    else if (a == "--register") reg = true;
    else bytes = 0;
  }
  if (bytes < sizeof(float)) {
    std::fprintf(stderr, "usage: rank_cost [--bytes SIZE] [--in-place] [--register]\n");
    return 2;
  }
  auto opts = tbverbs::CommunicatorOptions::from_env();
  if (!opts) { std::fprintf(stderr, "%s\n", opts.error().message().c_str()); return 1; }
  auto comm = tbverbs::Communicator::connect(*opts);
  if (!comm) { std::fprintf(stderr, "%s\n", comm.error().message().c_str()); return 1; }
  const double rss_connected = status_mb("VmRSS");
  print_devices("connected");
  std::vector<float> in(bytes / sizeof(float), 1.0f), out(in_place ? 0 : in.size());
  std::span<float> dst = in_place ? std::span<float>(in) : std::span<float>(out);
  std::vector<tbverbs::MemoryRegistration> held;
  if (reg) {
    for (std::span<float> s : {std::span<float>(in), dst}) {
      if (in_place && !held.empty()) break;
      auto r = comm->register_memory(std::span<const float>(s));
      if (!r) { std::fprintf(stderr, "%s\n", r.error().message().c_str()); return 1; }
      held.push_back(std::move(*r));
    }
  }
  if (auto r = comm->all_reduce(std::span<const float>(in), dst, tbverbs::ReduceOp::sum); !r) {
    std::fprintf(stderr, "%s\n", r.error().message().c_str());
    return 1;
  }
  const float want = static_cast<float>(comm->size());
  for (const float v : dst)
    if (v != want) { std::printf("cost: WRONG %g, not %g\n", v, want); return 1; }
  print_devices("after_call");
  std::printf("cost: rss_mb connected=%.0f peak=%.0f\n", rss_connected, status_mb("VmHWM"));
  return 0;
}
