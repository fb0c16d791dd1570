// Core library: loading verbs libraries (the emulator by path, the real rdma-core, broken and
// missing ones, several side by side) and finding devices by name.
#include "emu_fixture.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <dlfcn.h>
#include <link.h>

#include <cerrno>
#include <string>

using namespace emu_test;
using Catch::Matchers::ContainsSubstring;

namespace {

// The file the dynamic linker would load for `name` in a fresh process, found in a new link-map
// namespace so that nothing already loaded here (the emulator has the SONAME libibverbs.so.1 too,
// and glibc hands an already-loaded object out by SONAME) can answer instead.
std::string system_file_of(const char* name) {
  void* h = ::dlmopen(LM_ID_NEWLM, name, RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return {};
  link_map* lm = nullptr;
  std::string file;
  if (::dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr) file = lm->l_name;
  return file; // the namespace stays: tests load nothing from it
}

// The real rdma-core library, by the absolute path of the system's libibverbs.so.1 (a bare
// "libibverbs.so.1" would resolve to the emulator once it is loaded: same SONAME), or a SKIP
// when rdma-core is not installed.
tbverbs::Library real_rdma_core() {
  const std::string file = system_file_of("libibverbs.so.1");
  if (file.empty()) SKIP("rdma-core's libibverbs.so.1 is not installed");
  if (file.find(TBVERBS_EMU_LIBDIR) == 0) SKIP("libibverbs.so.1 resolves to the emulator (LD_LIBRARY_PATH?)");
  tbverbs::Library lib = ok(tbverbs::Library::load(file));
  REQUIRE(::dlsym(::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL), "tbemu_describe") == nullptr); // not the emulator
  return lib;
}

PortSpec host_a() { return {"hostA", "rdma_en1", "10.99.0.1/30"}; }
PortSpec host_b() { return {"hostB", "rdma_en1", "10.99.0.2/30"}; }

} // namespace

TEST_CASE("core/loader: the emulator loads by absolute path, every required symbol resolves", "[core][loader]") {
  const tbverbs::Library lib = ok(tbverbs::Library::load(TBVERBS_EMU_LIBRARY));
  CHECK(lib.path() == TBVERBS_EMU_LIBRARY);
  CHECK(lib.api().get_device_list != nullptr);
  CHECK(lib.api().modify_qp != nullptr);
  CHECK(lib.api().create_comp_channel != nullptr); // optional, present in the emulator
  // Loading the same path again gives the same table.
  CHECK(&ok(tbverbs::Library::load(TBVERBS_EMU_LIBRARY)).api() == &lib.api());
}

TEST_CASE("core/loader: the real rdma-core library: all required symbols resolve, no device is no_device with a "
          "diagnosis",
          "[core][loader][rdma-core]") {
  // By its plain name, as the platform default does. When this process already loaded the
  // emulator (running every test case in one process), the plain name would resolve to it by
  // SONAME, so the system file is then named by path instead.
  const tbverbs::Library by_path = real_rdma_core();
  tbverbs::Library lib = by_path;
  if (auto by_name = tbverbs::Library::load("libibverbs.so.1")) {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(by_name->api().get_device_list), &info) != 0 && info.dli_fname != nullptr &&
        std::string(info.dli_fname) == by_path.path())
      lib = *by_name;
    else
      WARN("libibverbs.so.1 resolves to " << (info.dli_fname ? info.dli_fname : "?") << " here; using " << by_path.path());
  } else {
    FAIL(by_name.error().message());
  }
  const auto& api = lib.api();
  CHECK(api.get_device_list != nullptr);
  CHECK(api.open_device != nullptr);
  CHECK(api.query_gid != nullptr);
  CHECK(api.create_qp != nullptr);
  CHECK(api.modify_qp != nullptr);
  CHECK(api.query_qp != nullptr);
  CHECK(lib.platform() == tbverbs::Platform::rdma_core);

  auto list = tbverbs::DeviceList::get(lib);
  if (list) SKIP("this machine has RDMA devices (" << list->names() << "): the no-device path cannot be tested");
  const tbverbs::Error e = list.error();
  CHECK(e.kind == tbverbs::ErrorKind::no_device);
  CHECK(e.step == tbverbs::Step::get_device_list);
  CHECK((e.sys_errno == ENOSYS || e.sys_errno == 0));
  REQUIRE(e.diagnosis() != nullptr);
  const std::string m = e.message();
  CHECK_THAT(m, ContainsSubstring("no RDMA device"));
  CHECK_THAT(m, ContainsSubstring("libibverbs.so.1")); // the library is named
  CHECK_THAT(m, ContainsSubstring("remedy: "));
  CHECK_THAT(m, ContainsSubstring("ibv_devices"));

  // Context::open goes through the same list and fails the same way.
  CHECK(err(tbverbs::Context::open(lib)).kind == tbverbs::ErrorKind::no_device);
}

TEST_CASE("core/loader: a nonexistent library path is library_not_found naming the path", "[core][loader]") {
  const std::string path = "/nonexistent/tbverbs-test/libibverbs.so.1";
  const tbverbs::Error e = err(tbverbs::Library::load(path));
  CHECK(e.kind == tbverbs::ErrorKind::library_not_found);
  CHECK(e.step == tbverbs::Step::load_library);
  CHECK_THAT(e.message(), ContainsSubstring(path));
  REQUIRE(e.diagnosis() != nullptr);
  CHECK_THAT(e.message(), ContainsSubstring("rdma-core"));

  // The same through TBVERBS_LIBRARY.
  EnvGuard env("TBVERBS_LIBRARY", path);
  const tbverbs::Error e2 = err(tbverbs::Library::load());
  CHECK(e2.kind == tbverbs::ErrorKind::library_not_found);
  CHECK_THAT(e2.message(), ContainsSubstring(path));
}

TEST_CASE("core/loader: a library without the verbs symbols is symbol_missing naming the symbol", "[core][loader]") {
  // libm is on every glibc system and exports no ibv_* function.
  void* probe = ::dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
  if (probe == nullptr) SKIP("libm.so.6 is not loadable here");
  const tbverbs::Error e = err(tbverbs::Library::load("libm.so.6"));
  CHECK(e.kind == tbverbs::ErrorKind::symbol_missing);
  CHECK(e.step == tbverbs::Step::resolve_symbol);
  const std::string m = e.message();
  CHECK_THAT(m, ContainsSubstring("ibv_get_device_list"));
  CHECK_THAT(m, ContainsSubstring("libm.so.6"));
  REQUIRE(e.diagnosis() != nullptr);
  // A failed load is not cached as a usable library.
  CHECK_FALSE(tbverbs::Library::load("libm.so.6"));
}

TEST_CASE("core/loader: the emulator and rdma-core loaded side by side in one process both work",
          "[core][loader][rdma-core]") {
  const tbverbs::Library real = real_rdma_core();
  const tbverbs::Library emu = emulator();
  REQUIRE(&real.api() != &emu.api());
  CHECK(real.api().get_device_list != emu.api().get_device_list); // RTLD_LOCAL: no interposition

  Fabric fabric(host_a(), host_b());
  fabric.use("hostA");
  // The emulator lists its device and opens it ...
  auto list = ok(tbverbs::DeviceList::get(emu));
  CHECK(list.names() == "rdma_en1");
  auto ctx = ok(tbverbs::Context::open(emu, "rdma_en1"));
  CHECK(ok(ctx.gid_table(1)).at(1).to_string() == "::ffff:10.99.0.1");
  // ... while rdma-core, in the same process, still answers for itself ...
  CHECK(err(tbverbs::DeviceList::get(real)).kind == tbverbs::ErrorKind::no_device);
  // ... and the emulator's context keeps working after that call.
  ok(ctx.alloc_pd());
  CHECK(ok(ctx.query_port(1)).gid_table_length == 1024);
}

TEST_CASE("core/loader: a wrong device name is device_not_found listing the devices, and nothing is opened",
          "[core][loader]") {
  Fabric fabric(host_a(), host_b());
  fabric.use("hostA");
  const tbverbs::Library lib = emulator();
  // Any open_device or alloc_pd on this host from now on fails with EIO: if the failed lookup
  // touched either, the error would be EIO instead of device_not_found.
  fabric.fail_call("hostA", "ibv_open_device", EIO);
  fabric.fail_call("hostA", "ibv_alloc_pd", EIO);

  const tbverbs::Error e = err(tbverbs::Context::open(lib, "rdma_en7"));
  CHECK(e.kind == tbverbs::ErrorKind::device_not_found);
  CHECK(e.step == tbverbs::Step::open_device);
  CHECK(e.sys_errno == 0);
  CHECK(e.platform == tbverbs::Platform::apple);
  const std::string m = e.message();
  CHECK_THAT(m, ContainsSubstring("rdma_en7 not found; 1 available: rdma_en1"));
  REQUIRE(e.diagnosis() != nullptr);
  CHECK_THAT(m, ContainsSubstring("remedy: "));

  // TBVERBS_DEVICE is the same lookup.
  {
    EnvGuard env("TBVERBS_DEVICE", "rdma_en9");
    CHECK_THAT(err(tbverbs::Context::open(lib)).message(), ContainsSubstring("rdma_en9 not found"));
  }
  // The armed fault is real: opening the right name does reach ibv_open_device.
  const tbverbs::Error opened = err(tbverbs::Context::open(lib, "rdma_en1"));
  CHECK(opened.step == tbverbs::Step::open_device);
  CHECK(opened.is(EIO));
}
