/// @file loader.hpp
/// Loading the verbs library at run time: `dlopen` plus one table of function pointers per
/// library (nothing is linked at build time). Several libraries may be loaded side by side
/// (the real one and the emulator, say); every handle remembers the table it came from.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/mutex.hpp"
#include "error.hpp"
#include "result.hpp"

#include <dlfcn.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

TBVERBS_NAMESPACE_BEGIN

namespace detail {

/// rdma-core's `struct ibv_gid_entry` (verbs.h, IBVERBS_1.11), declared here so no particular
/// verbs.h is needed (Apple's may lack it); the emulated tests check it against rdma-core's.
struct GidEntryAbi {
  std::uint8_t gid[16];       ///< The GID value.
  std::uint32_t gid_index;    ///< Index in its port's table.
  std::uint32_t port_num;     ///< Port number.
  std::uint32_t gid_type;     ///< enum ibv_gid_type: 0 IB, 1 RoCE v1, 2 RoCE v2.
  std::uint32_t ndev_ifindex; ///< Interface index of the netdev (0: none known).
};

/// The verbs functions tbverbs calls, resolved once per loaded library. The data path
/// (post_send, post_recv, poll_cq, req_notify_cq) is not here: like the platform header's
/// inline functions, it goes through each context's ops table.
struct VerbsApi {
  // Required: loading fails with a named error when one is missing. Exactly the set the public
  // Apple consumers resolve (JACCL, ds4), so no symbol only tbverbs asks for can stop a Mac.
  abi::ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(abi::ibv_device** list) = nullptr;
  const char* (*get_device_name)(abi::ibv_device* device) = nullptr;
  abi::ibv_context* (*open_device)(abi::ibv_device* device) = nullptr;
  int (*close_device)(abi::ibv_context* context) = nullptr;
  int (*query_device)(abi::ibv_context* context, abi::ibv_device_attr* attr) = nullptr;
  // The exported symbol behind the header's ibv_query_port macro; the caller zeroes the struct.
  int (*query_port)(abi::ibv_context* context, std::uint8_t port, abi::ibv_port_attr* attr) = nullptr;
  int (*query_gid)(abi::ibv_context* context, std::uint8_t port, int index, abi::ibv_gid* gid) = nullptr;
  abi::ibv_pd* (*alloc_pd)(abi::ibv_context* context) = nullptr;
  int (*dealloc_pd)(abi::ibv_pd* pd) = nullptr;
  abi::ibv_mr* (*reg_mr)(abi::ibv_pd* pd, void* addr, std::size_t length, int access) = nullptr;
  int (*dereg_mr)(abi::ibv_mr* mr) = nullptr;
  abi::ibv_cq* (*create_cq)(abi::ibv_context* context, int cqe, void* cq_context,
                            abi::ibv_comp_channel* channel, int comp_vector) = nullptr;
  int (*destroy_cq)(abi::ibv_cq* cq) = nullptr;
  abi::ibv_qp* (*create_qp)(abi::ibv_pd* pd, abi::ibv_qp_init_attr* attr) = nullptr;
  int (*destroy_qp)(abi::ibv_qp* qp) = nullptr;
  int (*modify_qp)(abi::ibv_qp* qp, abi::ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*query_qp)(abi::ibv_qp* qp, abi::ibv_qp_attr* attr, int attr_mask,
                  abi::ibv_qp_init_attr* init_attr) = nullptr;
  // Optional: null means the feature is absent, never a failure.
  // The node GUID (network byte order): no Apple consumer resolves it; Device::guid() is then empty.
  std::uint64_t (*get_device_guid)(abi::ibv_device* device) = nullptr;
  // Completion channels: without them waits poll instead of sleeping on a channel (TN3205 says
  // the caller must poll; no Apple consumer uses them).
  abi::ibv_comp_channel* (*create_comp_channel)(abi::ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(abi::ibv_comp_channel* channel) = nullptr;
  int (*get_cq_event)(abi::ibv_comp_channel* channel, abi::ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(abi::ibv_cq* cq, unsigned int nevents) = nullptr;
  // Asynchronous events (port up/down, QP and CQ errors, device loss): Context::wait_async_event.
  // Usable only with both; Apple documents none (TN3205 is silent on them).
  int (*get_async_event)(abi::ibv_context* context, abi::ibv_async_event* event) = nullptr;
  void (*ack_async_event)(abi::ibv_async_event* event) = nullptr;
  // GID types (rdma-core 36+, IBVERBS_1.11): the whole table with types and netdevs in one call,
  // or one entry; both return an errno (the table: its negation). Absent on older rdma-core.
  ssize_t (*query_gid_table)(abi::ibv_context* context, GidEntryAbi* entries, std::size_t max_entries,
                          std::uint32_t flags, std::size_t entry_size) = nullptr;
  int (*query_gid_ex)(abi::ibv_context* context, std::uint32_t port, std::uint32_t index, GidEntryAbi* entry,
                      std::uint32_t flags, std::size_t entry_size) = nullptr;
  // rdma-core's private helper (IBVERBS_PRIVATE_34, what ibv_devinfo uses): the sysfs type,
  // 0 = "IB/RoCE v1", 1 = "RoCE v2"; -1 with errno on failure.
  int (*query_gid_type)(abi::ibv_context* context, std::uint8_t port, unsigned int index, int* type) = nullptr;

  /// Where the table came from (a path, or a name for fake tables).
  std::string origin;
  /// The dlopen handle it was resolved from (never closed); null for tables made by hand.
  void* handle = nullptr;
  /// Provider family guessed from the library (refined per device by its name).
  Platform platform = Platform::any;
};

// Function-pointer slots of different types are filled through one small lambda per entry.
template <class F> inline void assign(F& slot, void* p) noexcept {
  slot = reinterpret_cast<F>(p);
}

/// One verbs function to resolve: its name, rdma-core version node, whether it is required,
/// and how to store it in the table.
struct SymbolEntry {
  const char* name;
  const char* version;
  bool required;
  void (*set)(VerbsApi&, void*);
};

inline void* lookup(void* handle, const char* name, const char* version) noexcept {
#if defined(__GLIBC__)
  // rdma-core versions its symbols; ask for the node the header was written against, as the
  // platform header's own references do, and fall back to the default version.
  if (void* p = ::dlvsym(handle, name, version)) return p;
#else
  (void)version;
#endif
  return ::dlsym(handle, name);
}

/// Internal: one row of the symbol table (undefined again right after it).
#define TBVERBS_SYM(field, ver, req)                                                              \
  ::tbverbs::detail::SymbolEntry { "ibv_" #field, ver, req, [](VerbsApi& a, void* p) { assign(a.field, p); } }

/// Every verbs function tbverbs resolves, in lookup order. The required ones are exactly those
/// the public Apple consumers (JACCL, ds4) resolve, so a Mac's librdma.dylib that serves them
/// serves tbverbs; everything else is optional (a test pins both sets).
inline std::span<const SymbolEntry> symbol_table() noexcept {
  static const SymbolEntry entries[] = {
      TBVERBS_SYM(get_device_list, "IBVERBS_1.1", true),
      TBVERBS_SYM(free_device_list, "IBVERBS_1.1", true),
      TBVERBS_SYM(get_device_name, "IBVERBS_1.1", true),
      TBVERBS_SYM(open_device, "IBVERBS_1.1", true),
      TBVERBS_SYM(close_device, "IBVERBS_1.1", true),
      TBVERBS_SYM(query_device, "IBVERBS_1.1", true),
      TBVERBS_SYM(query_port, "IBVERBS_1.1", true),
      TBVERBS_SYM(query_gid, "IBVERBS_1.1", true),
      TBVERBS_SYM(alloc_pd, "IBVERBS_1.1", true),
      TBVERBS_SYM(dealloc_pd, "IBVERBS_1.1", true),
      TBVERBS_SYM(reg_mr, "IBVERBS_1.1", true),
      TBVERBS_SYM(dereg_mr, "IBVERBS_1.1", true),
      TBVERBS_SYM(create_cq, "IBVERBS_1.1", true),
      TBVERBS_SYM(destroy_cq, "IBVERBS_1.1", true),
      TBVERBS_SYM(create_qp, "IBVERBS_1.1", true),
      TBVERBS_SYM(destroy_qp, "IBVERBS_1.1", true),
      TBVERBS_SYM(modify_qp, "IBVERBS_1.1", true),
      TBVERBS_SYM(query_qp, "IBVERBS_1.1", true),
      TBVERBS_SYM(get_device_guid, "IBVERBS_1.1", false),
      TBVERBS_SYM(create_comp_channel, "IBVERBS_1.0", false),
      TBVERBS_SYM(destroy_comp_channel, "IBVERBS_1.0", false),
      TBVERBS_SYM(get_cq_event, "IBVERBS_1.1", false),
      TBVERBS_SYM(ack_cq_events, "IBVERBS_1.1", false),
      TBVERBS_SYM(get_async_event, "IBVERBS_1.1", false),
      TBVERBS_SYM(ack_async_event, "IBVERBS_1.1", false),
      // GID types: the exported names behind verbs.h's inline ibv_query_gid_ex/_table.
      SymbolEntry{"_ibv_query_gid_table", "IBVERBS_1.11", false,
                  [](VerbsApi& a, void* p) { assign(a.query_gid_table, p); }},
      SymbolEntry{"_ibv_query_gid_ex", "IBVERBS_1.11", false, [](VerbsApi& a, void* p) { assign(a.query_gid_ex, p); }},
      TBVERBS_SYM(query_gid_type, "IBVERBS_PRIVATE_34", false),
  };
  return entries;
}
#undef TBVERBS_SYM

/// Resolves every symbol of `api` from `handle`; returns the first required symbol missing.
/// A missing optional symbol leaves its slot null: the feature is absent, loading succeeds.
inline Result<void> resolve_all(void* handle, VerbsApi& api) {
  for (const SymbolEntry& e : symbol_table()) {
    void* p = lookup(handle, e.name, e.version);
    if (p == nullptr && e.required) {
      Error err = Error::make(Step::resolve_symbol, ErrorKind::symbol_missing);
      std::string d = std::string(e.name) + " (" + e.version + ") not found in " + api.origin;
      return fail(err.from(api.platform).with_detail(d));
    }
    e.set(api, p);
  }
  // A channel is only usable with all four of its functions.
  if (!api.create_comp_channel || !api.destroy_comp_channel || !api.get_cq_event || !api.ack_cq_events) {
    api.create_comp_channel = nullptr;
    api.destroy_comp_channel = nullptr;
    api.get_cq_event = nullptr;
    api.ack_cq_events = nullptr;
  }
  if (!api.get_async_event || !api.ack_async_event) { // an event must be acknowledged
    api.get_async_event = nullptr;
    api.ack_async_event = nullptr;
  }
  return {};
}

/// Tables live for the whole process (libraries are never unloaded, so handles can never
/// outlive the code they call): a list of nodes that are never freed keeps their addresses
/// stable. Newest first.
struct LoadedTables {
  struct Node {
    VerbsApi api;
    const Node* next;
  };
  Mutex mutex;
  const Node* first = nullptr;
};
inline LoadedTables& loaded_tables() {
  static LoadedTables t;
  return t;
}

inline Platform platform_of_path(std::string_view path) noexcept {
  return path.find("librdma") != std::string_view::npos ? Platform::apple : Platform::rdma_core;
}

} // namespace detail

/// A loaded verbs library: a cheap, copyable reference to its resolved function table.
///
/// Libraries are opened with `dlopen` and never closed. Loading the same path twice returns the
/// same table. Thread-safe.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto lib
/// \until lib.error()
class Library {
public:
  /// Loads the verbs library. Search order: `path` when non-empty, then the `TBVERBS_LIBRARY`
  /// environment variable, then the platform defaults (macOS: `/usr/lib/librdma.dylib`, then
  /// `librdma.dylib`; elsewhere `libibverbs.so.1`).
  /// Errors: `library_not_found` (naming every path tried and dlerror's text) or
  /// `symbol_missing` (naming the symbol), both at Step::load_library / Step::resolve_symbol.
  [[nodiscard]] static Result<Library> load(std::string_view path = {}) {
    std::string tried;
    auto attempt = [&](const std::string& candidate) -> Result<Library> {
      return open_one(candidate, tried);
    };
    if (!path.empty()) return attempt(std::string(path));
    if (const char* env = std::getenv("TBVERBS_LIBRARY"); env != nullptr && *env != '\0')
      return attempt(env);
#if defined(__APPLE__)
    const char* defaults[] = {"/usr/lib/librdma.dylib", "librdma.dylib"};
#else
    const char* defaults[] = {"libibverbs.so.1"};
#endif
    Result<Library> last = fail(Error::make(Step::load_library, ErrorKind::library_not_found));
    for (const char* d : defaults) {
      last = attempt(d);
      if (last || last.error().kind != ErrorKind::library_not_found) return last;
    }
    return last;
  }

  /// Wraps a caller-owned function table (tests use fake tables). `api` must outlive every
  /// handle made from it.
  [[nodiscard]] static Library from_table(const detail::VerbsApi& api) noexcept { return Library(&api); }

  /// The resolved function table.
  const detail::VerbsApi& api() const noexcept { return *api_; }
  /// The path it was loaded from, followed by "(resolved to FILE)" when the dynamic loader
  /// returned another file (a library with the same soname was already loaded).
  std::string_view path() const noexcept { return api_->origin; }
  /// The provider family guessed from the library name.
  Platform platform() const noexcept { return api_->platform; }
  /// True when the library exports all four completion-channel functions (optional: without
  /// them completion waits poll, as Apple's TN3205 prescribes anyway).
  bool has_completion_channels() const noexcept { return api_->create_comp_channel != nullptr; }
  /// True when the library exports `ibv_get_async_event` and `ibv_ack_async_event` (optional:
  /// without them Context::wait_async_event answers `unsupported`).
  bool has_async_events() const noexcept { return api_->get_async_event != nullptr; }
  /// True when the library exports `ibv_get_device_guid` (optional; Device::guid() is empty
  /// without it).
  bool has_device_guid() const noexcept { return api_->get_device_guid != nullptr; }
  /// Looks up any other verbs function by name, for what tbverbs does not wrap (SRQs,
  /// `ibv_reg_dmabuf_mr`/`ibv_reg_mr_iova2` for GPU memory, address handles, async events):
  /// `lib.symbol<int(ibv_srq*)>("ibv_destroy_srq")`. `F` is the function type (or a pointer to
  /// it); `version` is the rdma-core symbol version to ask for first (glibc only; then the default
  /// version). The library is never unloaded, so the pointer stays valid for the process.
  /// Errors: `symbol_missing` at Step::resolve_symbol naming the symbol; `unsupported` for a table
  /// that was not loaded from a library (Library::from_table).
  template <class F>
  [[nodiscard]] Result<std::conditional_t<std::is_pointer_v<F>, F, F*>> symbol(const char* name,
                                                                               const char* version = "IBVERBS_1.1") const {
    using P = std::conditional_t<std::is_pointer_v<F>, F, F*>;
    if (api_->handle == nullptr)
      return fail(Error::make(Step::resolve_symbol, ErrorKind::unsupported,
                              std::string("no library handle behind ") + api_->origin + " to look up " + name)
                      .from(api_->platform));
    void* p = detail::lookup(api_->handle, name, version);
    if (p == nullptr)
      return fail(Error::make(Step::resolve_symbol, ErrorKind::symbol_missing,
                              std::string(name) + " not found in " + api_->origin)
                      .from(api_->platform));
    return reinterpret_cast<P>(p);
  }
  /// True when the library can say a GID entry's type itself (`_ibv_query_gid_table`,
  /// `_ibv_query_gid_ex` or `ibv_query_gid_type`, all optional); without them the GID table
  /// falls back to sysfs `gid_attrs/types/N` on Linux.
  bool has_gid_types() const noexcept {
    return api_->query_gid_table != nullptr || api_->query_gid_ex != nullptr || api_->query_gid_type != nullptr;
  }

private:
  explicit Library(const detail::VerbsApi* api) noexcept : api_(api) {}

  static Result<Library> open_one(const std::string& path, std::string& tried) {
    auto& reg = detail::loaded_tables();
    detail::Lock lock(reg.mutex);
    for (const auto* n = reg.first; n != nullptr; n = n->next)
      if (n->api.origin == path || n->api.origin.starts_with(path + " (resolved to ")) return Library(&n->api);
    // RTLD_LOCAL: the real library and the emulator (same symbol names) must not interpose.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      if (!tried.empty()) tried += "; ";
      tried += path + ": " + (why ? why : "dlopen failed");
      Error e = Error::make(Step::load_library, ErrorKind::library_not_found, tried);
      return fail(e.from(detail::platform_of_path(path)));
    }
    detail::VerbsApi api;
    api.handle = handle;
    api.origin = path;
    api.platform = detail::platform_of_path(path);
    if (auto r = detail::resolve_all(handle, api); !r) return fail(r.error());
    // A bare name whose soname is already loaded (the emulator is also "libibverbs.so.1") gives
    // back that library: name the file the functions really come from, so errors never mislead.
    Dl_info where{};
    if (::dladdr(reinterpret_cast<void*>(api.get_device_list), &where) != 0 && where.dli_fname != nullptr &&
        path != where.dli_fname)
      api.origin = path + " (resolved to " + where.dli_fname + ")";
    reg.first = new detail::LoadedTables::Node{std::move(api), reg.first}; // NOLINT: never freed (above)
    return Library(&reg.first->api);
  }

  const detail::VerbsApi* api_;
};

TBVERBS_NAMESPACE_END
