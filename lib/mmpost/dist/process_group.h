// mmpost distributed layer: launcher detection + a small, timeout-bounded
// wrapper around c10d process groups (Gloo on CPU, NCCL when built against a
// CUDA LibTorch with -DMMPOST_WITH_NCCL).
//
// Failure model: every collective either completes or throws DistError within
// roughly the configured timeout on every surviving rank. After the first
// DistError the group is "broken": all later calls throw DistError at once.
// Argument mistakes (wrong dtype/device, bad root) throw std::invalid_argument
// and do not break the group. This header deliberately includes no c10d or
// gloo header, so only process_group.cpp depends on gloo's headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mmpost::dist {

/// Where this process sits in the job, as told by the launcher's environment.
struct WorldInfo {
  int rank = 0;              ///< global rank, 0 <= rank < world_size
  int world_size = 1;        ///< number of processes in the job
  int local_rank = 0;        ///< rank within this node (use for device choice)
  int local_world_size = 1;  ///< processes on this node (-1 when unknown)
  std::string master_addr;   ///< rendezvous host (rank 0's TCPStore)
  int master_port = 0;       ///< rendezvous TCP port
  std::string launcher;      ///< "torchrun", "env", "slurm" or "none"
  /// torchrun already hosts a TCPStore at master_addr:master_port
  /// (TORCHELASTIC_USE_AGENT_STORE=True): every rank must be a store client.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT (0 otherwise); used as a store key prefix so
  /// restarted workers never read stale keys from the agent's store.
  int restart_count = 0;
};

/// Reads the launcher's environment, in this order:
///  * torchrun / plain env: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
///    MASTER_ADDR, MASTER_PORT (RANK and WORLD_SIZE must come together);
///  * Slurm srun: SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS),
///    SLURM_LOCALID, SLURM_NTASKS_PER_NODE; master = MASTER_ADDR if set, else
///    first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST; port =
///    MASTER_PORT if set, else 20000 + SLURM_JOB_ID % 20000;
///  * otherwise a world of one (launcher "none").
/// Throws std::runtime_error naming the variable for non-integer values,
/// rank outside [0, world_size), world_size < 1, a missing MASTER_ADDR /
/// MASTER_PORT when world_size > 1, or a port outside 1..65535.
WorldInfo world_from_env();

/// First host name of a Slurm host list, e.g. "node[01-04,07],gpu5" ->
/// "node01", "rack[2-3]-n[010-012]" -> "rack2-n010", "gpu5" -> "gpu5".
/// Zero padding is kept. Throws std::runtime_error on malformed input
/// (empty list, unbalanced brackets, empty bracket group).
std::string first_host_of_nodelist(const std::string& nodelist);

/// The single exception type for a failed or timed-out distributed operation
/// (peer never joined, died, skipped or mismatched a collective, store or
/// network failure). what() names the operation, this rank, the world size,
/// the timeout, and the underlying exception's type and message.
class DistError : public std::runtime_error {
 public:
  DistError(std::string op, int rank, int world_size, double timeout_s,
            std::string cause_type, std::string cause);
  const std::string& op() const noexcept { return op_; }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  double timeout_s() const noexcept { return timeout_s_; }
  /// Demangled C++ type of the exception c10d/gloo threw (e.g.
  /// "gloo::IoException", "c10::DistStoreError"), or "mmpost" for our own.
  const std::string& cause_type() const noexcept { return cause_type_; }
  /// Message of the underlying exception (without C++ backtrace).
  const std::string& cause() const noexcept { return cause_; }

 private:
  std::string op_;
  int rank_;
  int world_size_;
  double timeout_s_;
  std::string cause_type_;
  std::string cause_;
};

class ProcessGroup;

/// Handle of an asynchronous collective. Call wait() exactly once before
/// reading the tensors it writes; until then they must not be touched.
/// Destroying an unwaited handle neither waits nor throws (the result is lost
/// and the group must still be driven by the same sequence of collectives on
/// every rank). Copyable handles share state; wait() on a copy is a no-op.
class WorkHandle {
 public:
  WorkHandle();
  ~WorkHandle();
  WorkHandle(WorkHandle&&) noexcept;
  WorkHandle& operator=(WorkHandle&&) noexcept;
  WorkHandle(const WorkHandle&) = delete;
  WorkHandle& operator=(const WorkHandle&) = delete;

  /// Blocks until the collective finished (bounded by the group's timeout)
  /// and writes the results into the caller's tensors. Throws DistError.
  void wait();
  /// True once wait() returned or the underlying work has completed.
  bool completed() const;

  struct State;  // implementation detail

 private:
  friend class ProcessGroup;
  explicit WorkHandle(std::shared_ptr<State> s);
  std::shared_ptr<State> s_;
};

/// A group of all ranks of the job over c10d. Collectives must be called in
/// the same order with matching arguments (shapes, dtypes) on every rank.
/// WARNING: with Gloo, a collective whose byte size differs between ranks
/// makes gloo throw gloo::EnforceNotMet on its own I/O thread, which calls
/// std::terminate() on the receiving rank (observed with torch 2.13). Enable
/// check_collectives (or MMPOST_DIST_CHECK=1) to turn any op/shape/dtype
/// mismatch into a DistError on every rank instead; it costs one extra
/// 48-byte all-gather per call (and makes *_async launches synchronous).
/// Not thread-safe: call it from one thread (async handles may be waited from
/// that same thread in any order).
class ProcessGroup {
 public:
  /// Rendezvous with every rank: rank 0 hosts a c10d::TCPStore at
  /// world.master_addr:master_port (unless world.agent_store) and waits for
  /// all ranks, then the backend connects a full mesh.
  /// backend: "gloo" (CPU tensors; CUDA tensors are staged by c10d) or
  /// "nccl" (only when compiled with MMPOST_WITH_NCCL, CUDA tensors; the
  /// caller must set the current CUDA device to world.local_rank first).
  /// Gloo interface: GLOO_SOCKET_IFNAME (comma list) if set; loopback when
  /// master_addr is a loopback address or world_size == 1; otherwise the
  /// address this host's name resolves to (c10d's createDefaultDevice).
  /// check_collectives: see the class comment (forced on by the environment
  /// variable MMPOST_DIST_CHECK=1; must be the same on every rank).
  /// Throws DistError (op "init") when a peer does not join within
  /// timeout_s, std::invalid_argument for an unknown backend or timeout <= 0.
  ProcessGroup(const WorldInfo& world, double timeout_s,
               const std::string& backend = "gloo",
               bool check_collectives = false);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  double timeout_s() const;
  const std::string& backend() const;
  /// True after a DistError; every later call throws DistError immediately.
  bool broken() const;
  /// Whether every call first verifies that all ranks make the same call.
  bool check_collectives() const;

  /// In-place element-wise sum over ranks of each tensor. Tensors may have
  /// any shapes and dtypes (float32/64, float16, bfloat16, int8/uint8,
  /// int32/64), be non-contiguous, and must all be on one device; they are
  /// packed into one flat buffer per dtype (order preserved). Throws DistError,
  /// std::invalid_argument for undefined / sparse / mixed-device tensors.
  void all_reduce_sum(std::vector<at::Tensor>& tensors);

  /// Same as all_reduce_sum but returns at once; results land in `tensors`
  /// during WorkHandle::wait(). Keep `tensors` alive and untouched until then.
  /// Launch order must match on every rank. wait() throws DistError.
  WorkHandle all_reduce_sum_async(std::vector<at::Tensor>& tensors);

  /// Copies root's tensors into every other rank's tensors, in place. Shapes
  /// and dtypes must match across ranks. Throws DistError,
  /// std::invalid_argument if root is outside [0, world_size).
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0);

  /// Gathers one tensor of identical shape/dtype from every rank.
  /// Returns a new tensor of shape [world_size, *tensor.shape] on tensor's
  /// device; row r is rank r's input. Throws DistError.
  at::Tensor all_gather(const at::Tensor& tensor);

  /// Gathers one string per rank (any lengths, arbitrary bytes), rank order.
  /// Two collectives: lengths, then max-length padded bytes. Throws DistError.
  std::vector<std::string> all_gather_object(const std::string& value);

  /// Gathers one vector<double> per rank (any lengths), rank order.
  /// Throws DistError.
  std::vector<std::vector<double>> all_gather_object(
      const std::vector<double>& value);

  /// Returns once every rank reached the barrier (and this rank's earlier
  /// async work finished). Throws DistError.
  void barrier();

  struct Impl;  // implementation detail

 private:
  std::shared_ptr<Impl> impl_;  // shared with pending WorkHandles
};

/// Element-wise sum over the ranks of `pg` of a few host values (float64 all-reduce), e.g. the
/// counts and sums behind a mean; with pg == nullptr (one process) the values themselves.
/// Throws DistError.
std::vector<double> sum_over_ranks(ProcessGroup* pg, std::vector<double> values);

}  // namespace mmpost::dist
