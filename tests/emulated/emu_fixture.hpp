// Helpers for the core tests over the emulated fabric (tests/emulated/test_core*.cpp).
//
// Every test makes its own fabric file in its own temporary directory, with its own emulator
// state directory (TBVERBS_EMU_STATE_DIR), so tests never share ports, addresses, QPs or faults.
// The emulator is loaded by absolute path (TBVERBS_EMU_LIBRARY, a compile definition). One process
// can open devices of several emulated hosts (the host is read at every ibv_get_device_list), so
// most tests run both ends of a connection in-process; the two-process test forks.
#pragma once

#include <tbverbs/tbverbs.hpp>

#include <catch2/catch_test_macros.hpp>

#include <dlfcn.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifndef TBVERBS_EMU_LIBRARY
#error "TBVERBS_EMU_LIBRARY (absolute path of libtbverbs_emu.so) must be defined by the build"
#endif

namespace emu_test {

/// Unwraps a Result inside a Catch2 test: fails the test with the error's whole message.
template <class T> T ok(tbverbs::Result<T> r) {
  if (!r) FAIL(r.error().message());
  return std::move(*r);
}
inline void ok(tbverbs::Result<void> r) {
  if (!r) FAIL(r.error().message());
}
/// The error of a Result that must have failed.
template <class T> tbverbs::Error err(const tbverbs::Result<T>& r) {
  if (r) FAIL("expected an error, got a value");
  return r.error();
}

/// Sets an environment variable for the lifetime of the guard, then restores it.
class EnvGuard {
public:
  EnvGuard(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  ~EnvGuard() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

private:
  const char* name_;
  std::optional<std::string> old_;
};

/// One port of a host in a two-host fabric.
struct PortSpec {
  std::string host;
  std::string device = "rdma_en1";
  std::optional<std::string> ipv4; // "a.b.c.d/prefix", none: only fe80:: in the GID table
  bool up = true;
  int ipv4_gid_index = 1; // where the ::ffff: entry appears (fe80:: entries below it), as on some Macs
  std::optional<std::string> profile{}; // the host's own emulator profile (a mixed fabric); none: the fabric's
};

/// The emulator's control API (emulator/include/tbverbs_emu/control.h), resolved from the same
/// loaded library by dlsym.
struct Control {
  int (*set_ipv4)(const char*, const char*, const char*, int, const char*) = nullptr;
  int (*clear_ipv4)(const char*, const char*, const char*, int) = nullptr;
  int (*set_port_up)(const char*, const char*, const char*, int, int) = nullptr;
  int (*fault_fail_call)(const char*, const char*, const char*, std::uint64_t, int, std::uint32_t) = nullptr;
  int (*fault_clear)(const char*) = nullptr;
  int (*qp_count)(const char*, const char*, const char*) = nullptr;
  int (*fault_drop_next_qp)(const char*, const char*) = nullptr;
  int (*fault_qp_fatal)(const char*, std::uint32_t) = nullptr;
  int (*set_device_removed)(const char*, const char*, const char*, int) = nullptr;
  int (*hold_qp_locks_and_stop)(const char*, std::uint32_t) = nullptr;
  const char* (*last_error)() = nullptr;

  static const Control& get() {
    static const Control c = [] {
      Control k;
      void* h = ::dlopen(TBVERBS_EMU_LIBRARY, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) return k;
      k.set_ipv4 = reinterpret_cast<decltype(k.set_ipv4)>(::dlsym(h, "tbemu_set_ipv4"));
      k.clear_ipv4 = reinterpret_cast<decltype(k.clear_ipv4)>(::dlsym(h, "tbemu_clear_ipv4"));
      k.set_port_up = reinterpret_cast<decltype(k.set_port_up)>(::dlsym(h, "tbemu_set_port_up"));
      k.fault_fail_call = reinterpret_cast<decltype(k.fault_fail_call)>(::dlsym(h, "tbemu_fault_fail_call"));
      k.fault_clear = reinterpret_cast<decltype(k.fault_clear)>(::dlsym(h, "tbemu_fault_clear"));
      k.qp_count = reinterpret_cast<decltype(k.qp_count)>(::dlsym(h, "tbemu_qp_count"));
      k.fault_drop_next_qp = reinterpret_cast<decltype(k.fault_drop_next_qp)>(::dlsym(h, "tbemu_fault_drop_next_qp"));
      k.fault_qp_fatal = reinterpret_cast<decltype(k.fault_qp_fatal)>(::dlsym(h, "tbemu_fault_qp_fatal"));
      k.set_device_removed = reinterpret_cast<decltype(k.set_device_removed)>(::dlsym(h, "tbemu_set_device_removed"));
      k.hold_qp_locks_and_stop =
          reinterpret_cast<decltype(k.hold_qp_locks_and_stop)>(::dlsym(h, "tbemu_hold_qp_locks_and_stop"));
      k.last_error = reinterpret_cast<decltype(k.last_error)>(::dlsym(h, "tbemu_last_error"));
      return k;
    }();
    return c;
  }
};

/// A private two-host fabric (one cable between a.device:1 and b.device:1) in a fresh temporary
/// directory, removed with the object. `use(host)` points this process at it as that host.
class Fabric {
public:
  explicit Fabric(PortSpec a, PortSpec b, std::string profile = "thunderbolt")
      : a_(std::move(a)), b_(std::move(b)) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tbverbs-core-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    path_ = (dir_ / "fabric.json").string();
    state_ = (dir_ / "state").string();
    auto port = [](const PortSpec& p) {
      std::string s = "{\"port\": 1, \"state\": \"" + std::string(p.up ? "up" : "down") + "\"";
      if (p.ipv4) s += ", \"ipv4\": \"" + *p.ipv4 + "\"";
      if (p.ipv4_gid_index != 1) s += ", \"ipv4_gid_index\": " + std::to_string(p.ipv4_gid_index);
      return s + "}";
    };
    auto host = [&](const PortSpec& p) {
      const std::string profile = p.profile ? ", \"profile\": \"" + *p.profile + "\"" : std::string();
      return "{\"name\": \"" + p.host + "\"" + profile + ", \"devices\": [{\"name\": \"" + p.device +
             "\", \"ports\": [" + port(p) + "]}]}";
    };
    std::ofstream f(path_);
    f << "{\"profile\": \"" << profile << "\", \"hosts\": [" << host(a_) << ", " << host(b_) << "], \"cables\": [[\""
      << a_.host << ":" << a_.device << ":1\", \"" << b_.host << ":" << b_.device << ":1\"]]}\n";
    REQUIRE(f.good());
  }
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  ~Fabric() {
    ::unsetenv("TBVERBS_EMU_FABRIC");
    ::unsetenv("TBVERBS_EMU_STATE_DIR");
    ::unsetenv("TBVERBS_EMU_HOST");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  /// This process is `host` of this fabric from now on (until another use()).
  void use(const std::string& host) const {
    ::setenv("TBVERBS_EMU_FABRIC", path_.c_str(), 1);
    ::setenv("TBVERBS_EMU_STATE_DIR", state_.c_str(), 1);
    ::setenv("TBVERBS_EMU_HOST", host.c_str(), 1);
  }

  const std::string& path() const { return path_; }
  const PortSpec& a() const { return a_; }
  const PortSpec& b() const { return b_; }

  // Control of the running fabric (the emulator's C API).
  void set_ipv4(const PortSpec& p, const std::string& cidr) const {
    REQUIRE(Control::get().set_ipv4 != nullptr);
    INFO(Control::get().last_error());
    REQUIRE(Control::get().set_ipv4(path_.c_str(), p.host.c_str(), p.device.c_str(), 1, cidr.c_str()) == 0);
  }
  void clear_ipv4(const PortSpec& p) const {
    REQUIRE(Control::get().clear_ipv4 != nullptr);
    REQUIRE(Control::get().clear_ipv4(path_.c_str(), p.host.c_str(), p.device.c_str(), 1) == 0);
  }
  void set_port_up(const PortSpec& p, bool up) const {
    REQUIRE(Control::get().set_port_up != nullptr);
    REQUIRE(Control::get().set_port_up(path_.c_str(), p.host.c_str(), p.device.c_str(), 1, up ? 1 : 0) == 0);
  }
  void fail_call(const std::string& host, const std::string& verb, int errno_value, std::uint32_t count = 0) const {
    REQUIRE(Control::get().fault_fail_call != nullptr);
    REQUIRE(Control::get().fault_fail_call(path_.c_str(), host.c_str(), verb.c_str(), 1, errno_value, count) == 0);
  }
  /// The next QP created on `host` loses everything it sends (its sends still complete).
  void drop_next_qp(const std::string& host) const {
    REQUIRE(Control::get().fault_drop_next_qp != nullptr);
    REQUIRE(Control::get().fault_drop_next_qp(path_.c_str(), host.c_str()) == 0);
  }
  /// A catastrophic error on QP `qpn` (tbverbs-emu fault qp-fatal).
  void qp_fatal(std::uint32_t qpn) const {
    REQUIRE(Control::get().fault_qp_fatal != nullptr);
    INFO(Control::get().last_error());
    REQUIRE(Control::get().fault_qp_fatal(path_.c_str(), qpn) == 0);
  }
  /// The device of `p` removed (tbverbs-emu device-remove) or brought back.
  void set_device_removed(const PortSpec& p, bool removed) const {
    REQUIRE(Control::get().set_device_removed != nullptr);
    REQUIRE(Control::get().set_device_removed(path_.c_str(), p.host.c_str(), p.device.c_str(), removed ? 1 : 0) == 0);
  }
  int qp_count(const PortSpec& p) const {
    REQUIRE(Control::get().qp_count != nullptr);
    return Control::get().qp_count(path_.c_str(), p.host.c_str(), p.device.c_str());
  }

private:
  PortSpec a_, b_;
  std::filesystem::path dir_;
  std::string path_, state_;
};

/// The emulator, loaded by absolute path (the same table every time).
inline tbverbs::Library emulator() { return ok(tbverbs::Library::load(TBVERBS_EMU_LIBRARY)); }

/// Everything one end of a connection needs, opened on `host` of `fabric`.
struct Side {
  tbverbs::Context ctx;
  tbverbs::ProtectionDomain pd;
  tbverbs::CompletionQueue cq;
  tbverbs::AlignedBuffer buf;
  tbverbs::MemoryRegion mr;

  static Side open(const Fabric& fabric, const PortSpec& port, tbverbs::Access access = tbverbs::Access::local_write,
                   std::size_t bytes = 64 * 1024) {
    fabric.use(port.host);
    const tbverbs::Library lib = emulator();
    tbverbs::Context ctx = ok(tbverbs::Context::open(lib, port.device));
    tbverbs::ProtectionDomain pd = ok(ctx.alloc_pd());
    tbverbs::CompletionQueue cq = ok(ctx.create_cq(256));
    tbverbs::AlignedBuffer buf = ok(tbverbs::AlignedBuffer::allocate(bytes));
    tbverbs::MemoryRegion mr = ok(pd.reg_mr(buf, access));
    return Side{std::move(ctx), std::move(pd), std::move(cq), std::move(buf), std::move(mr)};
  }
  /// A fresh selection from a fresh table of port 1.
  tbverbs::GidSelection select() const { return ok(ok(ctx.gid_table(1)).select()); }
};

/// A connected pair of QPs made from one recipe factory on both sides.
struct Pair {
  tbverbs::QueuePair a, b;
};
template <class MakeRecipe> Pair connect(Side& a, Side& b, MakeRecipe make) {
  tbverbs::PreparedQueuePair pa = ok(make(a.select()).prepare(a.pd, a.cq));
  tbverbs::PreparedQueuePair pb = ok(make(b.select()).prepare(b.pd, b.cq));
  // Through the wire form, as a real program would.
  const tbverbs::Endpoint ea = ok(tbverbs::Endpoint::parse(pa.endpoint().serialize()));
  const tbverbs::Endpoint eb = ok(tbverbs::Endpoint::parse(pb.endpoint().serialize()));
  tbverbs::QueuePair qa = ok(std::move(pa).connect(eb));
  tbverbs::QueuePair qb = ok(std::move(pb).connect(ea));
  return Pair{std::move(qa), std::move(qb)};
}

/// Waits for exactly one completion within `timeout`.
inline tbverbs::WorkCompletion wait_one(tbverbs::CompletionQueue& cq,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  tbverbs::WorkCompletion wc[1];
  const std::size_t n = ok(cq.wait(wc, std::chrono::steady_clock::now() + timeout));
  REQUIRE(n == 1);
  return wc[0];
}

/// Runs `body` in a child process and returns its exit status (0 = success). The child never
/// returns into Catch2: it reports on stderr and _exit()s. A child still running after
/// `timeout` is killed (by its pid) and counts as a failure (-1).
class Child {
public:
  explicit Child(const std::function<int()>& body) {
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      int rc = 100;
      try {
        rc = body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: exception: %s\n", e.what());
      } catch (...) {
        std::fprintf(stderr, "child: unknown exception\n");
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  /// The child's process id (-1 once it was waited for).
  pid_t pid() const { return pid_; }
  int wait(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

private:
  pid_t pid_ = -1;
};

} // namespace emu_test
