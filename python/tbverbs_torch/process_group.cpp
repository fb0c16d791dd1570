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
  case at::kByte: return tbverbs::DType::u8;
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

tbverbs::ReduceOp reduce_op(const c10d::ReduceOp& op, const char* what) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
  case c10d::ReduceOp::SUM: return tbverbs::ReduceOp::sum;
  case c10d::ReduceOp::PRODUCT: return tbverbs::ReduceOp::prod;
  case c10d::ReduceOp::MIN: return tbverbs::ReduceOp::min;
  case c10d::ReduceOp::MAX: return tbverbs::ReduceOp::max;
  case c10d::ReduceOp::AVG: return tbverbs::ReduceOp::avg; // floating-point tensors (the layer refuses integers)
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

c10::intrusive_ptr<BackendBase> ProcessGroupTbverbs::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                            int size, std::chrono::milliseconds timeout) {
  auto opts = tbverbs::CommunicatorOptions::from_env(rank, size);
  if (!opts) throw_error(opts.error());
  if (std::getenv("TBVERBS_TIMEOUT_MS") == nullptr && timeout.count() > 0) opts->timeout = timeout;
  // The registration cache trusts the program to forget memory before freeing it; torch frees and
  // reuses tensor memory without telling the backend, and a cached registration would then point
  // at pages the memory no longer has. Tensors are staged (copied through registered scratch).
  TORCH_CHECK(opts->memory != tbverbs::collective::Memory::registered,
              "tbverbs: TBVERBS_MEMORY=registered is not available to the torch backend: torch frees and reuses "
              "tensor memory without telling it, and a cached registration would outlive its memory (use auto or staged)");
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
  return c10::make_intrusive<ProcessGroupTbverbs>(std::move(*comm), opts->timeout);
}

ProcessGroupTbverbs::ProcessGroupTbverbs(tbverbs::Communicator comm, std::chrono::milliseconds timeout)
    : BackendBase(comm.rank(), comm.size()), comm_(std::move(comm)), timeout_(timeout) {
  worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroupTbverbs::~ProcessGroupTbverbs() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join(); // runs what is queued first: every Work completes
  (void)comm_.close();
}

void ProcessGroupTbverbs::worker_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::enqueue(c10d::OpType type, const char* what,
                                                            std::vector<at::Tensor> outputs,
                                                            std::function<tbverbs::Result<void>(tbverbs::Communicator&)> run) {
  auto work = c10::make_intrusive<Work>(getRank(), type, what, std::move(outputs), timeout_);
  auto task = [this, work, run = std::move(run)] {
    std::exception_ptr error;
    try {
      if (auto r = run(comm_); !r) throw_error(r.error());
    } catch (...) {
      error = std::current_exception();
    }
    work->complete(error);
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "all_reduce");
  const auto op = reduce_op(opts.reduceOp, "all_reduce");
  const auto dt = dtype_of(t, "all_reduce");
  return enqueue(c10d::OpType::ALLREDUCE, "all_reduce", tensors, [t, op, dt](tbverbs::Communicator& c) {
    return c.all_reduce(bytes_of(t), bytes_of(t), dt, op);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions&) {
  check_blocks(output, input, getSize(), "all_gather_into_tensor", "output");
  const auto dt = dtype_of(input, "all_gather_into_tensor");
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output},
                 [in = input, out = output, dt](tbverbs::Communicator& c) { return c.all_gather(bytes_of(in), bytes_of(out), dt); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  at::Tensor in = single(inputs, "all_gather");
  std::vector<at::Tensor> outs = check_list(outputs, in, getSize(), "all_gather");
  const auto dt = dtype_of(in, "all_gather");
  return enqueue(c10d::OpType::ALLGATHER, "all_gather", outs, [in, outs, dt](tbverbs::Communicator& c) -> tbverbs::Result<void> {
    // Gathered into one block, then copied out: the layer gathers into contiguous memory.
    at::Tensor all = at::empty({static_cast<std::int64_t>(outs.size()) * in.numel()}, in.options());
    if (auto r = c.all_gather(bytes_of(in), bytes_of(all), dt); !r) return r;
    for (std::size_t i = 0; i < outs.size(); ++i)
      outs[i].view({-1}).copy_(all.narrow(0, static_cast<std::int64_t>(i) * in.numel(), in.numel()));
    return {};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  check_blocks(input, output, getSize(), "reduce_scatter_tensor", "input");
  const auto op = reduce_op(opts.reduceOp, "reduce_scatter_tensor");
  const auto dt = dtype_of(input, "reduce_scatter_tensor");
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output},
                 [in = input, out = output, dt, op](tbverbs::Communicator& c) {
                   return c.reduce_scatter(bytes_of(in), bytes_of(out), dt, op);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  std::vector<at::Tensor> ins = check_list(inputs, out, getSize(), "reduce_scatter");
  const auto op = reduce_op(opts.reduceOp, "reduce_scatter");
  const auto dt = dtype_of(out, "reduce_scatter");
  return enqueue(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", {out}, [ins, out, dt, op](tbverbs::Communicator& c) {
    // The inputs side by side, as the layer takes them.
    at::Tensor all = at::empty({static_cast<std::int64_t>(ins.size()) * out.numel()}, out.options());
    for (std::size_t i = 0; i < ins.size(); ++i)
      all.narrow(0, static_cast<std::int64_t>(i) * out.numel(), out.numel()).copy_(ins[i].view({-1}));
    return c.reduce_scatter(bytes_of(all), bytes_of(out), dt, op);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const int root = root_of(opts.rootRank); // the layer refuses a root outside the group (invalid_argument, nothing sent)
  const auto dt = dtype_of(t, "broadcast");
  return enqueue(c10d::OpType::BROADCAST, "broadcast", tensors,
                 [t, root, dt](tbverbs::Communicator& c) { return c.broadcast(bytes_of(t), dt, root); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  const auto op = reduce_op(opts.reduceOp, "reduce");
  const auto dt = dtype_of(t, "reduce");
  const int root = root_of(opts.rootRank);
  // In place at the root; the other ranks' tensors are left as they were.
  return enqueue(c10d::OpType::REDUCE, "reduce", tensors,
                 [t, op, dt, root](tbverbs::Communicator& c) { return c.reduce(bytes_of(t), bytes_of(t), dt, op, root); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  const int root = root_of(opts.rootRank);
  const bool at_root = getRank() == root;
  std::vector<at::Tensor> outs;
  if (at_root) outs = check_list(outputs, in, getSize(), "gather");
  else TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "tbverbs: gather: only the root passes a gather_list");
  const auto dt = dtype_of(in, "gather");
  return enqueue(c10d::OpType::GATHER, "gather", outs, [in, outs, dt, root, at_root](tbverbs::Communicator& c) -> tbverbs::Result<void> {
    // At the root, gathered into one block, then copied out (the layer gathers into contiguous memory).
    at::Tensor all = at::empty({at_root ? static_cast<std::int64_t>(outs.size()) * in.numel() : 0}, in.options());
    if (auto r = c.gather(bytes_of(in), bytes_of(all), dt, root); !r) return r;
    for (std::size_t i = 0; i < outs.size(); ++i)
      outs[i].view({-1}).copy_(all.narrow(0, static_cast<std::int64_t>(i) * in.numel(), in.numel()));
    return {};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  const int root = root_of(opts.rootRank);
  const bool at_root = getRank() == root;
  std::vector<at::Tensor> ins;
  if (at_root) ins = check_list(inputs, out, getSize(), "scatter");
  else TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "tbverbs: scatter: only the root passes a scatter_list");
  const auto dt = dtype_of(out, "scatter");
  return enqueue(c10d::OpType::SCATTER, "scatter", {out}, [ins, out, dt, root](tbverbs::Communicator& c) {
    // At the root, the inputs side by side, as the layer takes them.
    at::Tensor all = at::empty({static_cast<std::int64_t>(ins.size()) * out.numel()}, out.options());
    for (std::size_t i = 0; i < ins.size(); ++i)
      all.narrow(0, static_cast<std::int64_t>(i) * out.numel(), out.numel()).copy_(ins[i].view({-1}));
    return c.scatter(bytes_of(all), bytes_of(out), dt, root);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<std::int64_t>& output_splits,
                                                                  std::vector<std::int64_t>& input_splits, const c10d::AllToAllOptions&) {
  check_tensor(input, "all_to_all_single");
  check_tensor(output, "all_to_all_single");
  TORCH_CHECK(input.scalar_type() == output.scalar_type() && input.numel() == output.numel(),
              "tbverbs: all_to_all_single: the input and output must have one type and size");
  TORCH_CHECK(input.dim() > 0 && input.size(0) % getSize() == 0, "tbverbs: all_to_all_single: the first dimension (",
              input.dim() > 0 ? input.size(0) : 0, ") must be a multiple of the world size");
  const std::int64_t rows = input.size(0) / getSize();
  for (const auto* splits : {&input_splits, &output_splits})
    for (std::int64_t s : *splits)
      TORCH_CHECK(s == rows, "tbverbs: all_to_all_single: only equal splits are supported (the layer's all_to_all moves equal blocks)");
  const auto dt = dtype_of(input, "all_to_all_single");
  return enqueue(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output},
                 [in = input, out = output, dt](tbverbs::Communicator& c) { return c.all_to_all(bytes_of(in), bytes_of(out), dt); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::send(std::vector<at::Tensor>& tensors, int dst, int) {
  at::Tensor t = single(tensors, "send");
  // A peer outside the group, or this rank, the layer refuses (invalid_argument, nothing sent).
  const auto dt = dtype_of(t, "send");
  return enqueue(c10d::OpType::SEND, "send", tensors,
                 [t, dst, dt](tbverbs::Communicator& c) { return c.send(bytes_of(t), dt, dst); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::recv(std::vector<at::Tensor>& tensors, int src, int) {
  at::Tensor t = single(tensors, "recv");
  // As send(): the layer checks the peer.
  const auto dt = dtype_of(t, "recv");
  return enqueue(c10d::OpType::RECV, "recv", tensors,
                 [t, src, dt](tbverbs::Communicator& c) { return c.recv(bytes_of(t), dt, src); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTbverbs::barrier(const c10d::BarrierOptions&) {
  return enqueue(c10d::OpType::BARRIER, "barrier", {}, [](tbverbs::Communicator& c) { return c.barrier(); });
}

} // namespace tbverbs_torch
