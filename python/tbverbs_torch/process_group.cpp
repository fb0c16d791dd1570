// The "tbverbs" process group (process_group.hpp): argument checks in the caller's thread (a
// wrong tensor is a Python exception at the call, and breaks nothing), the collectives on the
// worker thread.
#include "process_group.hpp"

#include <torch/version.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <algorithm>
#include <cstring>

namespace tbverbs_torch {
namespace {

// The element type of a tensor the backend can move, or an error naming what it got.
tbverbs::DType dtype_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
  case at::kFloat: return tbverbs::DType::f32;
  case at::kDouble: return tbverbs::DType::f64;
  case at::kInt: return tbverbs::DType::i32;
  case at::kLong: return tbverbs::DType::i64;
  case at::kHalf: return tbverbs::DType::f16;
  case at::kBFloat16: return tbverbs::DType::bf16;
  case at::kChar: return tbverbs::DType::i8;
  case at::kByte:
  case at::kBool: return tbverbs::DType::u8; // one byte, 0 or 1 (reduce_op() keeps it so)
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3) // torch.uint32/uint64 came in 2.3
  case at::kUInt32: return tbverbs::DType::u32;
  case at::kUInt64: return tbverbs::DType::u64;
#endif
  default: break;
  }
  TORCH_CHECK(false, "tbverbs: ", what, ": tensors of ", t.scalar_type(),
              " are not supported (float32, float64, float16, bfloat16, int8, int32, int64, uint8; uint32 and uint64 from torch 2.3)");
}

// A tensor the backend can move: on the CPU, dense, contiguous.
void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "tbverbs: ", what, ": the tensor is on ", t.device(),
              "; the tbverbs backend moves CPU tensors only (copy it with .cpu(), or use a backend for that device)");
  TORCH_CHECK(t.layout() == at::kStrided, "tbverbs: ", what, ": sparse tensors are not supported");
  TORCH_CHECK(t.is_contiguous(), "tbverbs: ", what, ": the tensor is not contiguous (call .contiguous() first)");
  (void)dtype_of(t, what);
}

// The one tensor of a call (one device per process).
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "tbverbs: ", what, " takes one tensor per process, got ", tensors.size());
  check_tensor(tensors[0], what);
  return tensors[0];
}

// `whole` holds `size` blocks of `block`'s type and size (all_gather's output, reduce_scatter's
// input); `whole_name` says which, in elements, the unit a torch user counts in.
void check_blocks(const at::Tensor& whole, const at::Tensor& block, std::int64_t size, const char* what,
                  const char* whole_name) {
  check_tensor(whole, what);
  check_tensor(block, what);
  TORCH_CHECK(whole.scalar_type() == block.scalar_type(), "tbverbs: ", what, ": the tensors are ", whole.scalar_type(),
              " and ", block.scalar_type());
  TORCH_CHECK(whole.numel() == block.numel() * size, "tbverbs: ", what, ": the ", whole_name, " has ", whole.numel(),
              " elements, not world size x ", block.numel(), " = ", size, " x ", block.numel());
}

// One list of `size` tensors, each of `like`'s type and size (all_gather's outputs, reduce_scatter's
// inputs).
const std::vector<at::Tensor>& check_list(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& like,
                                          std::int64_t size, const char* what) {
  TORCH_CHECK(lists.size() == 1 && static_cast<std::int64_t>(lists[0].size()) == size, "tbverbs: ", what,
              " takes one list of world size (", size, ") tensors");
  for (const at::Tensor& t : lists[0]) {
    check_tensor(t, what);
    TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(), "tbverbs: ", what,
                ": every tensor of the list must have the other tensor's size and type");
  }
  return lists[0];
}

// `op` as the layer takes it for tensors of `t`: on bool, SUM is any (max) and PRODUCT all (min),
// so that every result stays 0 or 1 (as torch's NCCL backend does); AVG of bool is refused.
tbverbs::ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& t, const char* what) {
  if (t.scalar_type() == at::kBool) switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::MAX: return tbverbs::ReduceOp::max;
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN: return tbverbs::ReduceOp::min;
    default: TORCH_CHECK(false, "tbverbs: ", what, ": bool tensors take SUM, PRODUCT, MIN and MAX");
    }
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
  case c10d::ReduceOp::SUM: return tbverbs::ReduceOp::sum;
  case c10d::ReduceOp::PRODUCT: return tbverbs::ReduceOp::prod;
  case c10d::ReduceOp::MIN: return tbverbs::ReduceOp::min;
  case c10d::ReduceOp::MAX: return tbverbs::ReduceOp::max;
  case c10d::ReduceOp::AVG: // refused here for integers, before any call of the op starts (a coalesced list changes nothing)
    TORCH_CHECK(t.is_floating_point(), "tbverbs: ", what, ": avg of ", t.scalar_type(),
                " tensors: avg is defined for floating-point types; for integers, sum and divide as you need");
    return tbverbs::ReduceOp::avg;
  default: break;
  }
  TORCH_CHECK(false, "tbverbs: ", what, ": only SUM, PRODUCT, MIN, MAX and AVG are supported (the bitwise ops and "
              "PREMUL_SUM are not)");
}

std::span<std::byte> bytes_of(const at::Tensor& t) {
  return {static_cast<std::byte*>(t.data_ptr()), static_cast<std::size_t>(t.numel()) * t.element_size()};
}

// A root as the layer takes it: one beyond int reaches it as -1 (refused), not truncated into a rank.
int root_of(std::int64_t r) { return r >= 0 && r <= std::numeric_limits<int>::max() ? static_cast<int>(r) : -1; }

[[noreturn]] void throw_error(const tbverbs::Error& e) { TORCH_CHECK(false, "tbverbs: ", e.message()); }

// The Store keys of the rendezvous (the Store torch gives is already prefixed per group).
constexpr const char* kCoordinatorKey = "tbverbs/coordinator";

std::string to_string(const std::vector<std::uint8_t>& v) { return std::string(v.begin(), v.end()); }

} // namespace

// The default group's Core, for the subgroups torch makes after it (new_group).
std::weak_ptr<Core>& world_core() {
  static std::weak_ptr<Core> world;
  return world;
}

c10::intrusive_ptr<BackendBase> ProcessGroupTbverbs::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                            int size, std::chrono::milliseconds timeout,
                                                            const std::vector<int>& global_ranks) {
  if (!global_ranks.empty())
    if (auto world = world_core().lock()) { // a subgroup of the default group's communicator: its links
      tbverbs::Result<tbverbs::Communicator> sub = [&] {
        auto lock = world->lock();
        return world->comm().subgroup(global_ranks);
      }();
      if (!sub) throw_error(sub.error());
      TORCH_CHECK(sub->rank() == rank && sub->size() == size, "tbverbs: the subgroup's rank ", sub->rank(), " of ", sub->size(),
                  " is not torch's ", rank, " of ", size);
      const auto t = std::getenv("TBVERBS_TIMEOUT_MS") == nullptr && timeout.count() > 0 ? timeout : sub->options().timeout;
      return c10::make_intrusive<ProcessGroupTbverbs>(std::move(*sub), t);
    }
  auto opts = tbverbs::CommunicatorOptions::from_env(rank, size);
  if (!opts) throw_error(opts.error());
  if (std::getenv("TBVERBS_TIMEOUT_MS") == nullptr && timeout.count() > 0) opts->timeout = timeout;
  // TBVERBS_MEMORY=registered is allowed: a tensor's memory is then registered at its first use
  // and the registration kept only while its page frames prove the memory unchanged (the layer's
  // registration rule, docs/collectives.md "Memory"), so torch freeing and reusing tensor memory
  // without telling the backend is seen, never mistaken for the old tensor. auto (the default)
  // stages tensors through the communicator's registered scratch: one copy each way.
  if (size > 1) {
    // Rank 0 listens on a free port of every interface and publishes "host:port token": the host
    // the others reach it by is torchrun's MASTER_ADDR (TBVERBS_COORDINATOR_HOST overrides it),
    // else this machine's name. The token keeps two jobs on one machine apart.
    if (rank == 0) {
      std::string host;
      for (const char* var : {"TBVERBS_COORDINATOR_HOST", "MASTER_ADDR"})
        if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
          host = v;
          break;
        }
      if (host.empty()) {
        char name[256] = {};
        if (::gethostname(name, sizeof name - 1) == 0) host = name;
      }
      TORCH_CHECK(!host.empty(), "tbverbs: cannot tell the other ranks where rank 0 is: set MASTER_ADDR");
      std::random_device rd;
      opts->job_token = (std::uint64_t{rd()} << 32 | rd()) | 1;
      opts->job_token_secret = true; // random, and only in the framework's Store
      opts->coordinator = "*:0";
      const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
      const std::string advertised = v6 ? "[" + host + "]" : host;
      const std::uint64_t token = opts->job_token;
      opts->on_listening = [store, advertised, token](std::uint16_t port) {
        const std::string value = advertised + ":" + std::to_string(port) + " " + std::to_string(token);
        store->set(kCoordinatorKey, std::vector<std::uint8_t>(value.begin(), value.end()));
      };
    } else {
      const std::string value = to_string(store->get(kCoordinatorKey)); // waits for rank 0 (the store's timeout)
      const auto space = value.rfind(' ');
      TORCH_CHECK(space != std::string::npos, "tbverbs: malformed rendezvous record \"", value, "\" in the store");
      opts->coordinator = value.substr(0, space);
      opts->job_token = std::strtoull(value.c_str() + space + 1, nullptr, 10);
      opts->job_token_secret = true;
    }
  }
  auto comm = tbverbs::Communicator::connect(*opts);
  if (!comm) throw_error(comm.error());
  auto pg = c10::make_intrusive<ProcessGroupTbverbs>(std::move(*comm), opts->timeout);
  if (global_ranks.empty()) world_core() = pg->core_; // the default group: later groups are its subgroups
  return pg;
}

Core::Core(tbverbs::Communicator comm, std::chrono::milliseconds timeout) : comm_(std::move(comm)), timeout_(timeout) {
  completer_ = std::thread([this] { completer_loop(); });
}

void Core::start(Work& w) {
  for (const Work::Call& c : w.calls_) {
    auto r = comm_.start(c.kind, c.in, c.out, c.type, c.op, c.arg);
    if (!r) throw_error(r.error()); // a wrong argument: refused before anything was sent
    w.requests_.push_back(std::move(*r));
  }
}

void Core::submit(const c10::intrusive_ptr<Work>& w, bool point_to_point) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "tbverbs: ", w->what_, " on a process group being destroyed");
    if (point_to_point) {
      held_.push_back(w);
      return;
    }
    for (auto& h : held_) { // the layer runs the sends and recvs started before a collective first
      start(*h);
      running_.push_back(std::move(h));
    }
    held_.clear();
    start(*w);
    running_.push_back(w);
  }
  cv_.notify_all();
}

void Core::flush() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_.empty()) return;
    for (auto& h : held_) {
      try {
        start(*h);
      } catch (...) { // refused: that Work fails, the others start
        h->complete(std::current_exception());
        continue;
      }
      running_.push_back(std::move(h));
    }
    held_.clear();
  }
  cv_.notify_all();
}

void Core::abort(const std::string& why) {
  comm_.abort(tbverbs::Error::make(tbverbs::Step::collective, tbverbs::ErrorKind::timeout, why));
}

// Completes the started Works in start order (the order the layer completes them in): waits on
// each request (bounded by the communicator's timeout; past it the communicator is aborted, which
// ends the request), copies out, completes the Work and its future.
void Core::completer_loop() {
  for (;;) {
    c10::intrusive_ptr<Work> w;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !running_.empty(); });
      if (running_.empty()) return;
      w = running_.front();
    }
    std::exception_ptr error;
    for (auto& r : w->requests_) {
      auto done = r.wait();
      if (!done && done.error().is(tbverbs::ErrorKind::timeout)) {
        abort(std::string("tbverbs: ") + w->what_ + " made no progress within the timeout");
        done = r.wait();
      }
      if (!done && !error) try {
          throw_error(done.error());
        } catch (...) {
          error = std::current_exception();
        }
    }
    if (!error && w->finish_) {
      try {
        w->finish_();
      } catch (...) {
        error = std::current_exception();
      }
    }
    w->requests_.clear();
    w->keep_.clear();
    w->complete(error);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_.pop_front();
    }
    cv_.notify_all();
  }
}

void Core::shut_down() {
  flush();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (completer_.joinable()) completer_.join(); // every started Work completes first
  auto lock = this->lock();
  (void)comm_.close();
}

bool Work::isCompleted() {
  if (!c10d::Work::isCompleted()) core_->flush();
  return c10d::Work::isCompleted();
}

bool Work::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == no_timeout ? timeout_ : timeout;
  core_->flush();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
    lock.unlock();
    const std::string why = std::string("tbverbs: ") + what_ + " did not complete within " + std::to_string(limit.count()) +
                            " ms (" + (timeout == no_timeout ? "the process group's timeout" : "the timeout given to wait()") +
                            "); the communicator is aborted: every rank's calls on it fail";
    core_->abort(why);
    TORCH_CHECK(false, why);
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

ProcessGroupTbverbs::ProcessGroupTbverbs(tbverbs::Communicator comm, std::chrono::milliseconds timeout)
    : BackendBase(comm.rank(), comm.size()), core_(std::make_shared<Core>(std::move(comm), timeout)), timeout_(timeout) {}

ProcessGroupTbverbs::~ProcessGroupTbverbs() { core_->shut_down(); }

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::submit(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs,
                                                           std::vector<Work::Call> calls, std::vector<at::Tensor> keep,
                                                           std::function<void()> finish) {
  auto work = c10::make_intrusive<Work>(core_, getRank(), type, what, std::move(outputs), timeout_);
  const bool p2p = type == c10d::OpType::SEND || type == c10d::OpType::RECV;
  work->calls_ = std::move(calls);
  work->keep_ = std::move(keep);
  work->finish_ = std::move(finish);
  core_->submit(work, p2p);
  return work;
}

namespace {
using tbverbs::collective::Collective;

Work::Call make_call(Collective kind, std::span<const std::byte> in, std::span<std::byte> out, tbverbs::DType t,
                     tbverbs::ReduceOp op = tbverbs::ReduceOp::sum, int arg = 0) {
  return Work::Call{kind, in, out, t, op, arg};
}

// The tensors of a list side by side in one new tensor (the layer takes contiguous blocks).
at::Tensor side_by_side(const std::vector<at::Tensor>& list, const at::Tensor& like) {
  at::Tensor all = at::empty({static_cast<std::int64_t>(list.size()) * like.numel()}, like.options());
  for (std::size_t i = 0; i < list.size(); ++i) all.narrow(0, static_cast<std::int64_t>(i) * like.numel(), like.numel()).copy_(list[i].view({-1}));
  return all;
}

// Block i of `all` into list[i].
std::function<void()> copy_out(std::vector<at::Tensor> list, at::Tensor all) {
  return [list = std::move(list), all = std::move(all)] {
    const std::int64_t n = list.empty() ? 0 : list[0].numel();
    for (std::size_t i = 0; i < list.size(); ++i) list[i].view({-1}).copy_(all.narrow(0, static_cast<std::int64_t>(i) * n, n));
  };
}
} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "all_reduce");
  const auto op = reduce_op(opts.reduceOp, t, "all_reduce");
  return submit(c10d::OpType::ALLREDUCE, "all_reduce", tensors,
                {make_call(Collective::all_reduce, bytes_of(t), bytes_of(t), dtype_of(t, "all_reduce"), op)}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                        const c10d::AllreduceCoalescedOptions& opts) {
  std::vector<Work::Call> calls;
  for (const at::Tensor& t : tensors) {
    check_tensor(t, "all_reduce_coalesced");
    const auto op = reduce_op(opts.reduceOp, t, "all_reduce_coalesced");
    calls.push_back(make_call(Collective::all_reduce, bytes_of(t), bytes_of(t), dtype_of(t, "all_reduce_coalesced"), op));
  }
  return submit(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, std::move(calls), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  check_blocks(output, input, getSize(), "all_gather_into_tensor", "output");
  return submit(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output},
                {make_call(Collective::all_gather, bytes_of(input), bytes_of(output), dtype_of(input, "all_gather_into_tensor"))},
                {input, output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  at::Tensor in = single(inputs, "all_gather");
  std::vector<at::Tensor> outs = check_list(outputs, in, getSize(), "all_gather");
  at::Tensor all = at::empty({static_cast<std::int64_t>(outs.size()) * in.numel()}, in.options()); // gathered here, then copied out
  return submit(c10d::OpType::ALLGATHER, "all_gather", outs,
                {make_call(Collective::all_gather, bytes_of(in), bytes_of(all), dtype_of(in, "all_gather"))}, {in, all},
                copy_out(outs, all));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  check_blocks(input, output, getSize(), "reduce_scatter_tensor", "input");
  const auto op = reduce_op(opts.reduceOp, input, "reduce_scatter_tensor");
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output},
                {make_call(Collective::reduce_scatter, bytes_of(input), bytes_of(output), dtype_of(input, "reduce_scatter_tensor"), op)},
                {input, output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  std::vector<at::Tensor> ins = check_list(inputs, out, getSize(), "reduce_scatter");
  const auto op = reduce_op(opts.reduceOp, out, "reduce_scatter");
  at::Tensor all = side_by_side(ins, out); // copied in now: the inputs may change once this returns
  return submit(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", {out},
                {make_call(Collective::reduce_scatter, bytes_of(all), bytes_of(out), dtype_of(out, "reduce_scatter"), op)}, {all, out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const int root = root_of(opts.rootRank); // the layer refuses a root outside the group (invalid_argument, nothing sent)
  return submit(c10d::OpType::BROADCAST, "broadcast", tensors,
                {make_call(Collective::broadcast, bytes_of(t), bytes_of(t), dtype_of(t, "broadcast"), tbverbs::ReduceOp::sum, root)}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  const auto op = reduce_op(opts.reduceOp, t, "reduce");
  // In place at the root; the other ranks' tensors are left as they were.
  return submit(c10d::OpType::REDUCE, "reduce", tensors,
                {make_call(Collective::reduce, bytes_of(t), bytes_of(t), dtype_of(t, "reduce"), op, root_of(opts.rootRank))}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  const int root = root_of(opts.rootRank);
  const bool at_root = getRank() == root;
  std::vector<at::Tensor> outs;
  if (at_root) outs = check_list(outputs, in, getSize(), "gather");
  else TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "tbverbs: gather: only the root passes a gather_list");
  at::Tensor all = at::empty({at_root ? static_cast<std::int64_t>(outs.size()) * in.numel() : 0}, in.options());
  return submit(c10d::OpType::GATHER, "gather", outs,
                {make_call(Collective::gather, bytes_of(in), bytes_of(all), dtype_of(in, "gather"), tbverbs::ReduceOp::sum, root)},
                {in, all}, copy_out(outs, all));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  const int root = root_of(opts.rootRank);
  const bool at_root = getRank() == root;
  std::vector<at::Tensor> ins;
  if (at_root) ins = check_list(inputs, out, getSize(), "scatter");
  else TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "tbverbs: scatter: only the root passes a scatter_list");
  at::Tensor all = side_by_side(ins, out);
  return submit(c10d::OpType::SCATTER, "scatter", {out},
                {make_call(Collective::scatter, bytes_of(all), bytes_of(out), dtype_of(out, "scatter"), tbverbs::ReduceOp::sum, root)},
                {all, out});
}

// Equal splits: the layer's all_to_all. Uneven ones: a send and a recv per peer (started as one
// group, which the layer orders so that no two ranks wait on each other) and a copy of this
// rank's own rows.
c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<std::int64_t>& output_splits,
                                                                  std::vector<std::int64_t>& input_splits, const c10d::AllToAllOptions&) {
  check_tensor(input, "all_to_all_single");
  check_tensor(output, "all_to_all_single");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "tbverbs: all_to_all_single: the input and output must have one type");
  const std::int64_t n = getSize();
  const auto dt = dtype_of(input, "all_to_all_single");
  auto rows_of = [&](const at::Tensor& t, std::vector<std::int64_t>& splits, const char* which) {
    TORCH_CHECK(t.dim() > 0, "tbverbs: all_to_all_single: the ", which, " has no first dimension");
    if (splits.empty()) {
      TORCH_CHECK(t.size(0) % n == 0, "tbverbs: all_to_all_single: the ", which, "'s first dimension (", t.size(0),
                  ") must be a multiple of the world size without splits");
      return std::vector<std::int64_t>(static_cast<std::size_t>(n), t.size(0) / n);
    }
    TORCH_CHECK(static_cast<std::int64_t>(splits.size()) == n, "tbverbs: all_to_all_single: ", which, " splits has ", splits.size(),
                " entries, not the world size ", n);
    std::int64_t sum = 0;
    for (std::int64_t s : splits) {
      TORCH_CHECK(s >= 0, "tbverbs: all_to_all_single: a negative split");
      sum += s;
    }
    TORCH_CHECK(sum == t.size(0), "tbverbs: all_to_all_single: the ", which, " splits add up to ", sum, ", not its first dimension ", t.size(0));
    return splits;
  };
  const auto in_rows = rows_of(input, input_splits, "input"), out_rows = rows_of(output, output_splits, "output");
  const bool equal = std::all_of(in_rows.begin(), in_rows.end(), [&](std::int64_t r) { return r == in_rows[0]; }) && in_rows == out_rows;
  if (equal)
    return submit(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output},
                  {make_call(Collective::all_to_all, bytes_of(input), bytes_of(output), dt)}, {input, output});
  return uneven_all_to_all(output, input, in_rows, out_rows, dt);
}

// Uneven splits: a send and a receive per peer, started as one group (the layer orders it so that
// no two ranks wait on each other), received into a staging tensor. The output (this rank's own
// rows too) is written only once every transfer completed: a rank that made another call fails
// the transfers with it, and then nothing reaches the output.
c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::uneven_all_to_all(at::Tensor& output, const at::Tensor& input,
                                                                      const std::vector<std::int64_t>& in_rows,
                                                                      const std::vector<std::int64_t>& out_rows, tbverbs::DType dt) {
  const auto row_bytes = [](const at::Tensor& t) {
    return static_cast<std::size_t>(t.numel() / std::max<std::int64_t>(t.size(0), 1) * t.element_size());
  };
  const std::size_t in_row = row_bytes(input), out_row = row_bytes(output);
  at::Tensor staging = at::empty_like(output);
  std::span<std::byte> in_bytes = bytes_of(input), out_bytes = bytes_of(staging);
  std::vector<Work::Call> calls;
  std::size_t in_at = 0, out_at = 0;
  for (std::size_t q = 0; q < in_rows.size(); ++q) {
    const auto send = in_bytes.subspan(in_at * in_row, static_cast<std::size_t>(in_rows[q]) * in_row);
    const auto recv = out_bytes.subspan(out_at * out_row, static_cast<std::size_t>(out_rows[q]) * out_row);
    in_at += static_cast<std::size_t>(in_rows[q]);
    out_at += static_cast<std::size_t>(out_rows[q]);
    if (static_cast<int>(q) != getRank()) {
      calls.push_back(make_call(Collective::send, send, {}, dt, tbverbs::ReduceOp::sum, static_cast<int>(q)));
      calls.push_back(make_call(Collective::recv, {}, recv, dt, tbverbs::ReduceOp::sum, static_cast<int>(q)));
      continue;
    }
    TORCH_CHECK(send.size() == recv.size(), "tbverbs: all_to_all_single: this rank sends itself ", in_rows[q], " rows and expects ",
                out_rows[q]);
    if (!send.empty()) std::memcpy(recv.data(), send.data(), send.size()); // into the staging tensor
  }
  // Sends and receives: held with the other point-to-point work, then started as one group.
  auto work = c10::make_intrusive<Work>(core_, getRank(), c10d::OpType::ALLTOALL_BASE, "all_to_all_single (uneven)",
                                        std::vector<at::Tensor>{output}, timeout_);
  work->calls_ = std::move(calls);
  work->keep_ = {input, staging};
  work->finish_ = [output, staging]() mutable { output.copy_(staging); };
  core_->submit(work, true);
  core_->flush();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions&) {
  TORCH_CHECK(static_cast<std::int64_t>(inputs.size()) == getSize() && outputs.size() == inputs.size(),
              "tbverbs: all_to_all: one input and one output tensor per rank");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "all_to_all");
    check_tensor(outputs[i], "all_to_all");
    TORCH_CHECK(inputs[i].numel() == inputs[0].numel() && outputs[i].numel() == inputs[0].numel() &&
                    inputs[i].scalar_type() == inputs[0].scalar_type() && outputs[i].scalar_type() == inputs[0].scalar_type(),
                "tbverbs: all_to_all: the tensors must have one size and type (the layer's all_to_all moves equal blocks)");
  }
  at::Tensor in = side_by_side(inputs, inputs[0]);
  at::Tensor out = at::empty_like(in);
  return submit(c10d::OpType::ALLTOALL, "all_to_all", outputs,
                {make_call(Collective::all_to_all, bytes_of(in), bytes_of(out), dtype_of(in, "all_to_all"))}, {in, out},
                copy_out(outputs, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::send(std::vector<at::Tensor>& tensors, int dst, int) {
  at::Tensor t = single(tensors, "send");
  // A peer outside the group, or this rank, the layer refuses (invalid_argument, nothing sent).
  return submit(c10d::OpType::SEND, "send", tensors,
                {make_call(Collective::send, bytes_of(t), {}, dtype_of(t, "send"), tbverbs::ReduceOp::sum, dst)}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::recv(std::vector<at::Tensor>& tensors, int src, int) {
  at::Tensor t = single(tensors, "recv");
  return submit(c10d::OpType::RECV, "recv", tensors,
                {make_call(Collective::recv, {}, bytes_of(t), dtype_of(t, "recv"), tbverbs::ReduceOp::sum, src)}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::barrier(const c10d::BarrierOptions&) {
  return submit(c10d::OpType::BARRIER, "barrier", {}, {make_call(Collective::barrier, {}, {}, tbverbs::DType::i32, tbverbs::ReduceOp::max)});
}

} // namespace tbverbs_torch
