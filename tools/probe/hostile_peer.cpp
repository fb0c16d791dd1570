// A hostile other end for `tbverbs-probe --server` (issue 19 item 1; test tools.probe.hostile_peer):
// it joins the rendezvous as rank 1 with the probe's public job token (or the one of --token),
// plays the topology discovery honestly, then sends what MODE says instead of what a probe sends.
//   hostile_peer PORT MODE [TOKEN]
//   MODE: not_json     the host description is not JSON
//         device_type  a valid host description, then a device message whose fields are numbers
// The verbs library is TBVERBS_LIBRARY (the emulator, as host1 of its fabric). Exits 0 once the
// probe has hung up or aborted, 3 when it could not even play its part.
#include "probe_token.hpp"

#include <tbverbs/side_channel.hpp>
#include <tbverbs/tbverbs.hpp>
#include <tbverbs/topology.hpp>

#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace tbverbs;
  if (argc < 3) {
    std::fprintf(stderr, "usage: hostile_peer PORT MODE [TOKEN]\n");
    return 2;
  }
  const std::string mode = argv[2];
  const std::string token = argc > 3 ? argv[3] : "";
  SideChannelOptions o;
  o.rank = 1;
  o.size = 2;
  o.coordinator = std::string("127.0.0.1:") + argv[1];
  o.job_token = probe_job_token(token);
  o.timeout = std::chrono::seconds(20);
  auto sc = SideChannel::connect(o);
  if (!sc) {
    std::fprintf(stderr, "hostile_peer: rendezvous: %s\n", sc.error().message().c_str());
    return 3;
  }
  auto lib = Library::load("");
  if (!lib) return 3;
  if (auto topo = discover_topology(*lib, *sc); !topo) {
    std::fprintf(stderr, "hostile_peer: topology: %s\n", topo.error().message().c_str());
    return 3;
  }
  const std::string description = mode == "not_json" ? "{{{ this is not JSON" : "{}";
  auto hosts = sc->all_gather(std::vector<std::byte>(reinterpret_cast<const std::byte*>(description.data()),
                                                     reinterpret_cast<const std::byte*>(description.data()) +
                                                         description.size()));
  if (!hosts) return 0; // the probe refused already
  if (mode == "device_type") {
    const std::string m = "1 {\"device\": 5, \"gid\": [1, 2]}"; // step 1 of the probe's messages
    if (!sc->send_to(0, std::as_bytes(std::span(m.data(), m.size())), std::chrono::steady_clock::now() +
                                                                          std::chrono::seconds(5)))
      return 0;
  }
  // Wait for the probe to hang up or abort; anything else it sends is ignored.
  for (int i = 0; i < 10; ++i)
    if (!sc->recv_from(0, std::chrono::steady_clock::now() + std::chrono::seconds(2))) return 0;
  std::fprintf(stderr, "hostile_peer: the probe neither hung up nor aborted\n");
  return 3;
}
