// libFuzzer harness: the emulator's fabric-file loader on any text (fabric files are written by
// hand and by scripts). A fabric it accepts is consistent: every port belongs to a device of a
// host, every cable joins two distinct ports, each port has at most one cable.
// fuzz-sources: emulator/src/fabric.cpp emulator/src/quirks.cpp emulator/src/shared_state.cpp emulator/src/pages.cpp emulator/src/trace.cpp
// fuzz-includes: emulator/src emulator/include
#include "emu.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 1 << 16) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<emu::Fabric> f;
  try {
    f = emu::parse_fabric_text(text, "fuzz");
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).empty()) std::abort();  // a refusal always says why
    return 0;
  }
  const int nports = static_cast<int>(f->ports.size());
  for (int i = 0; i < nports; ++i) {
    const emu::PortDef& p = f->ports[static_cast<std::size_t>(i)];
    if (p.device < 0 || p.device >= static_cast<int>(f->devices.size())) std::abort();
    if (p.host < 0 || p.host >= static_cast<int>(f->hosts.size())) std::abort();
    if (p.peer >= 0) {
      if (p.peer == i || p.peer >= nports) std::abort();
      if (f->ports[static_cast<std::size_t>(p.peer)].peer != i) std::abort();
    }
  }
  return 0;
}
