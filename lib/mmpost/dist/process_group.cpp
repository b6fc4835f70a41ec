// Implementation of mmpost::dist. See process_group.h for the contract.
//
// ABI note (Gloo): ProcessGroupGloo.hpp includes gloo headers, and the wheel
// does not ship them, so we compile against Debian's libgloo-dev (older than
// torch's pinned gloo). That is only safe because this file never touches a
// gloo object's layout: gloo::Context (whose destructor lost `virtual`
// upstream, so its layout differs), gloo::rendezvous::Store (its vtable grew)
// and ProcessGroupGloo::GlooStore are never constructed, derived from or
// dereferenced here; we only copy std::shared_ptr<gloo::transport::Device>
// values created inside libtorch_cpu and call Device::str() (whose vtable is
// unchanged). Do not call ProcessGroupGloo::setTimeout() (inline, iterates
// contexts) or _getStore() from code built against Debian's headers. Never
// link Debian's libgloo.so: libtorch_cpu.so already exports torch's gloo.
#include "mmpost/dist/process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef MMPOST_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>

#ifndef USE_C10D_GLOO
#error "compile with -DUSE_C10D_GLOO (torch's ProcessGroupGloo.hpp is empty without it)"
#endif

namespace mmpost::dist {

// ---------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------
namespace {

std::optional<std::string> env_str(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

long long parse_int(const char* name, const std::string& raw) {
  std::string v = raw;
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  size_t b = 0;
  while (b < v.size() && std::isspace(static_cast<unsigned char>(v[b]))) ++b;
  v = v.substr(b);
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end == nullptr || *end != '\0' || errno == ERANGE ||
      x < INT_MIN || x > INT_MAX) {
    throw std::runtime_error(std::string("mmpost::dist: environment variable ") +
                             name + "='" + raw + "' is not a valid integer");
  }
  return x;
}

std::optional<int> env_int(const char* name) {
  auto v = env_str(name);
  if (!v) return std::nullopt;
  return static_cast<int>(parse_int(name, *v));
}

[[noreturn]] void bad_env(const char* name, const std::string& why) {
  throw std::runtime_error(std::string("mmpost::dist: environment variable ") + name +
                           ": " + why);
}

void validate(const WorldInfo& w, const char* rank_var, const char* size_var,
              const char* local_var) {
  if (w.world_size < 1)
    bad_env(size_var, "must be >= 1, got " + std::to_string(w.world_size));
  if (w.rank < 0 || w.rank >= w.world_size)
    bad_env(rank_var, "rank " + std::to_string(w.rank) + " is outside [0, " +
                          std::to_string(w.world_size) + ")");
  if (w.local_rank < 0 || w.local_rank >= w.world_size)
    bad_env(local_var, "local rank " + std::to_string(w.local_rank) +
                           " is outside [0, " + std::to_string(w.world_size) + ")");
  if (w.world_size > 1) {
    if (w.master_addr.empty()) bad_env("MASTER_ADDR", "must be set when world_size > 1");
    if (w.master_port < 1 || w.master_port > 65535)
      bad_env("MASTER_PORT", "port " + std::to_string(w.master_port) +
                                 " is outside 1..65535 (or unset)");
  }
}

}  // namespace

std::string first_host_of_nodelist(const std::string& nodelist) {
  auto fail = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error("mmpost::dist: malformed Slurm node list '" + nodelist +
                              "': " + why);
  };
  // 1. First top-level item (commas inside [...] do not separate hosts).
  int depth = 0;
  size_t end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    char c = nodelist[i];
    if (c == '[') {
      if (++depth > 1) throw fail("nested '['");
    } else if (c == ']') {
      if (--depth < 0) throw fail("unbalanced ']'");
    } else if (c == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  if (end == nodelist.size() && depth != 0) throw fail("unbalanced '['");
  std::string item = nodelist.substr(0, end);
  while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
  while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(0, 1);
  if (item.empty()) throw fail("empty host name");
  // 2. Replace every bracket group by the first number of its first range.
  std::string host;
  for (size_t i = 0; i < item.size(); ++i) {
    if (item[i] != '[') {
      host += item[i];
      continue;
    }
    size_t close = item.find(']', i);
    if (close == std::string::npos) throw fail("unbalanced '['");
    std::string group = item.substr(i + 1, close - i - 1);
    std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty() ||
        !std::all_of(first.begin(), first.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }))
      throw fail("bracket group '[" + group + "]' does not start with a number");
    host += first;
    i = close;
  }
  return host;
}

WorldInfo world_from_env() {
  WorldInfo w;
  const bool has_rank = env_str("RANK").has_value();
  const bool has_size = env_str("WORLD_SIZE").has_value();
  if (has_rank || has_size) {
    if (!has_rank) bad_env("RANK", "WORLD_SIZE is set but RANK is not");
    if (!has_size) bad_env("WORLD_SIZE", "RANK is set but WORLD_SIZE is not");
    w.rank = *env_int("RANK");
    w.world_size = *env_int("WORLD_SIZE");
    w.local_rank = env_int("LOCAL_RANK").value_or(0);
    w.local_world_size = env_int("LOCAL_WORLD_SIZE").value_or(-1);
    w.master_addr = env_str("MASTER_ADDR").value_or("");
    w.master_port = env_int("MASTER_PORT").value_or(0);
    const bool elastic = env_str("TORCHELASTIC_RUN_ID").has_value() ||
                         env_str("TORCHELASTIC_RESTART_COUNT").has_value();
    w.launcher = elastic ? "torchrun" : "env";
    w.agent_store = env_str("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    w.restart_count = env_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
    validate(w, "RANK", "WORLD_SIZE", "LOCAL_RANK");
    return w;
  }
  if (env_str("SLURM_PROCID")) {
    w.launcher = "slurm";
    w.rank = *env_int("SLURM_PROCID");
    const char* size_var = env_str("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
    auto size = env_int(size_var);
    if (!size) bad_env("SLURM_NTASKS", "SLURM_PROCID is set but SLURM_NTASKS is not");
    w.world_size = *size;
    w.local_rank = env_int("SLURM_LOCALID").value_or(0);
    // SLURM_NTASKS_PER_NODE may look like "4(x2)"; only a plain number counts.
    if (auto tpn = env_str("SLURM_NTASKS_PER_NODE");
        tpn && std::all_of(tpn->begin(), tpn->end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      w.local_world_size = static_cast<int>(parse_int("SLURM_NTASKS_PER_NODE", *tpn));
    else
      w.local_world_size = -1;
    if (auto a = env_str("MASTER_ADDR")) {
      w.master_addr = *a;
    } else {
      const char* nl_var = env_str("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
      auto nl = env_str(nl_var);
      if (!nl && w.world_size > 1)
        bad_env("SLURM_JOB_NODELIST", "needed to find the master host (or set MASTER_ADDR)");
      if (nl) {
        try {
          w.master_addr = first_host_of_nodelist(*nl);
        } catch (const std::exception& e) {
          std::string m = e.what();
          const std::string pre = "mmpost::dist: ";
          bad_env(nl_var, m.rfind(pre, 0) == 0 ? m.substr(pre.size()) : m);
        }
      }
    }
    if (auto p = env_int("MASTER_PORT")) {
      w.master_port = *p;
    } else {
      auto job = env_str("SLURM_JOB_ID");
      if (!job && w.world_size > 1)
        bad_env("SLURM_JOB_ID", "needed to derive MASTER_PORT (or set MASTER_PORT)");
      if (job) {
        long long id = parse_int("SLURM_JOB_ID", *job);
        if (id < 0) bad_env("SLURM_JOB_ID", "must be >= 0");
        w.master_port = static_cast<int>(20000 + id % 20000);
      }
    }
    validate(w, "SLURM_PROCID", size_var, "SLURM_LOCALID");
    return w;
  }
  w.launcher = "none";
  w.local_world_size = 1;
  w.master_addr = "127.0.0.1";
  return w;
}

// ---------------------------------------------------------------------------
// DistError
// ---------------------------------------------------------------------------
namespace {

std::string fmt_seconds(double s) {
  std::ostringstream o;
  o.precision(3);
  o << s;
  return o.str();
}

std::string build_message(const std::string& op, int rank, int world, double timeout_s,
                          const std::string& type, const std::string& cause) {
  return "mmpost::dist::DistError: " + op + " failed on rank " + std::to_string(rank) +
         " of world size " + std::to_string(world) + " (timeout " + fmt_seconds(timeout_s) +
         " s): [" + type + "] " + cause;
}

std::string demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : name;
  std::free(d);
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace

DistError::DistError(std::string op, int rank, int world_size, double timeout_s,
                     std::string cause_type, std::string cause)
    : std::runtime_error(build_message(op, rank, world_size, timeout_s, cause_type, cause)),
      op_(std::move(op)),
      rank_(rank),
      world_size_(world_size),
      timeout_s_(timeout_s),
      cause_type_(std::move(cause_type)),
      cause_(std::move(cause)) {}

// ---------------------------------------------------------------------------
// ProcessGroup::Impl
// ---------------------------------------------------------------------------
struct ProcessGroup::Impl {
  WorldInfo world;
  double timeout_s = 0;
  std::chrono::milliseconds timeout{0};
  std::string backend;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  bool broken = false;
  bool check = false;
  // Where small internal buffers (lengths, signatures, object bytes) live:
  // CPU for gloo, the rank's GPU for NCCL (which only moves CUDA tensors).
  at::Device obj_device{at::kCPU};
  int64_t seq = 0;  // number of checked calls so far (same on every rank)
  std::string first_failure;

  /// Must be called from inside a catch block: converts whatever is being
  /// handled into DistError, marks the group broken, and throws.
  [[noreturn]] void fail(const std::string& op) {
    std::string type = "unknown";
    if (const std::type_info* t = abi::__cxa_current_exception_type()) type = demangle(t->name());
    std::string msg;
    try {
      throw;
    } catch (const DistError&) {
      broken = true;
      throw;
    } catch (const c10::Error& e) {  // c10::DistStoreError, DistNetworkError, DistBackendError, ...
      msg = e.what_without_backtrace();
    } catch (const std::exception& e) {  // gloo::IoException, gloo::EnforceNotMet, std::system_error, ...
      msg = e.what();
    } catch (...) {
      msg = "non-standard exception";
    }
    msg = trim(msg);
    if (!broken) first_failure = op + ": [" + type + "] " + msg;
    broken = true;
    throw DistError(op, world.rank, world.world_size, timeout_s, type, msg);
  }

  [[noreturn]] void fail_own(const std::string& op, const std::string& msg) {
    if (!broken) first_failure = op + ": " + msg;
    broken = true;
    throw DistError(op, world.rank, world.world_size, timeout_s, "mmpost", msg);
  }

  void check_usable(const std::string& op) const {
    if (broken)
      throw DistError(op, world.rank, world.world_size, timeout_s, "mmpost",
                      "process group is unusable after an earlier failure (" + first_failure + ")");
  }

  /// Waits for `work`, bounded by the timeout plus a grace period. Gloo itself
  /// enforces `timeout` on each send/recv; the bound is a backstop so that a
  /// wedged worker thread can never hang the caller. Throws (raw) on failure.
  void wait_work(const c10::intrusive_ptr<c10d::Work>& work, const std::string& op) {
    auto grace = std::max(std::chrono::milliseconds(2000), timeout / 5);
    bool ok = work->wait(timeout + grace);
    if (!ok) fail_own(op, "work did not complete within timeout + grace");
  }

  /// check_collectives: all-gathers a fixed-size signature of this call so
  /// that mismatched calls are detected before any variable-size transfer.
  /// Throws (raw) on transport failure, DistError on mismatch.
  void verify_same_call(const std::string& op, int64_t a, int64_t b, int64_t c);
};

// ---------------------------------------------------------------------------
// Packing helpers: c10d's list-of-tensors collectives mean "one tensor per
// device, all reduced together", so distinct tensors are packed into one
// flat buffer per dtype instead.
// ---------------------------------------------------------------------------
// Outside the anonymous namespace: WorkHandle::State (a class with external linkage) holds
// Buckets.
namespace detail {
struct Bucket {
  at::Tensor flat;                  // 1-D buffer handed to c10d
  std::vector<at::Tensor> members;  // caller's tensors, in order
  bool direct = false;              // flat *is* the caller's tensor
};
}  // namespace detail
using detail::Bucket;

namespace {

std::vector<Bucket> pack(const std::vector<at::Tensor>& tensors, const char* op) {
  std::vector<Bucket> buckets;
  std::optional<at::Device> device;
  std::vector<at::ScalarType> order;
  std::vector<std::vector<at::Tensor>> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined())
      throw std::invalid_argument(std::string(op) + ": tensor " + std::to_string(i) + " is undefined");
    if (t.layout() != at::kStrided)
      throw std::invalid_argument(std::string(op) + ": tensor " + std::to_string(i) + " is not dense/strided");
    if (device && *device != t.device())
      throw std::invalid_argument(std::string(op) + ": tensors are on different devices");
    device = t.device();
    if (t.numel() == 0) continue;
    auto it = std::find(order.begin(), order.end(), t.scalar_type());
    if (it == order.end()) {
      order.push_back(t.scalar_type());
      groups.emplace_back();
      it = order.end() - 1;
    }
    groups[it - order.begin()].push_back(t);
  }
  for (auto& g : groups) {
    Bucket b;
    b.members = g;
    if (g.size() == 1 && g[0].is_contiguous()) {
      b.flat = g[0];
      b.direct = true;
    } else {
      int64_t total = 0;
      for (auto& t : g) total += t.numel();
      b.flat = at::empty({total}, g[0].options());
      int64_t off = 0;
      for (auto& t : g) {
        b.flat.narrow(0, off, t.numel()).view(t.sizes()).copy_(t);
        off += t.numel();
      }
    }
    buckets.push_back(std::move(b));
  }
  return buckets;
}

void unpack(Bucket& b) {
  if (b.direct) return;
  int64_t off = 0;
  for (auto& t : b.members) {
    t.copy_(b.flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::vector<std::shared_ptr<::gloo::transport::Device>> make_gloo_devices(const WorldInfo& w) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devs;
  if (auto ifn = env_str("GLOO_SOCKET_IFNAME")) {
    std::stringstream ss(*ifn);
    std::string name;
    while (std::getline(ss, name, ','))
      if (!name.empty()) devs.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
  } else if (w.world_size == 1 || is_loopback(w.master_addr)) {
    devs.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    // Like torch's Python default: bind to the address this host's name
    // resolves to; c10d falls back to loopback if that is unusable, which
    // cannot work across nodes.
    devs.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    const bool multi_node = w.local_world_size > 0 && w.local_world_size < w.world_size;
    if (multi_node && devs.back()->str().find("127.") != std::string::npos)
      throw std::runtime_error(
          "gloo picked a loopback address (" + devs.back()->str() +
          ") for a multi-node job; set GLOO_SOCKET_IFNAME to the cluster interface");
  }
  if (devs.empty()) throw std::runtime_error("GLOO_SOCKET_IFNAME names no interface");
  return devs;
}

}  // namespace

namespace {
constexpr int64_t kSigMagic = 0x6d6d706f7374;  // "mmpost"
const char* const kOpNames[] = {"?", "all_reduce_sum", "broadcast", "all_gather",
                                "all_gather_object", "barrier"};
int64_t op_code(const std::string& op) {
  for (int64_t i = 1; i < 6; ++i)
    if (op == kOpNames[i]) return i;
  return 0;
}
// FNV-1a over (dtype, numel) of each bucket: equal iff layouts agree.
int64_t layout_hash(const std::vector<Bucket>& buckets) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (auto& b : buckets) {
    mix(static_cast<uint64_t>(b.flat.scalar_type()));
    mix(static_cast<uint64_t>(b.flat.numel()));
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffull);
}
int64_t total_numel(const std::vector<Bucket>& buckets) {
  int64_t n = 0;
  for (auto& b : buckets) n += b.flat.numel();
  return n;
}
}  // namespace

void ProcessGroup::Impl::verify_same_call(const std::string& op, int64_t a, int64_t b, int64_t c) {
  if (!check || world.world_size == 1) return;
  ++seq;
  at::Tensor mine =
      at::tensor(std::vector<int64_t>{kSigMagic, op_code(op), seq, a, b, c}, at::kLong).to(obj_device);
  at::Tensor all = at::empty({world.world_size * 6}, mine.options());
  c10d::AllgatherOptions o;
  o.timeout = timeout;
  wait_work(pg->_allgather_base(all, mine, o), op);
  all = all.cpu();
  auto acc = all.accessor<int64_t, 1>();
  for (int r = 0; r < world.world_size; ++r) {
    bool same = true;
    for (int k = 0; k < 6; ++k) same = same && acc[r * 6 + k] == acc[k];
    if (!same) {
      auto desc = [&](int q) {
        int64_t code = acc[q * 6 + 1];
        std::string name = (code >= 0 && code < 6) ? kOpNames[code] : "?";
        return "rank " + std::to_string(q) + " called #" + std::to_string(acc[q * 6 + 2]) + " " + name +
               "(" + std::to_string(acc[q * 6 + 3]) + ", " + std::to_string(acc[q * 6 + 4]) + ", " +
               std::to_string(acc[q * 6 + 5]) + ")";
      };
      fail_own(op, "collective mismatch: " + desc(0) + " but " + desc(r));
    }
  }
}

// ---------------------------------------------------------------------------
// WorkHandle
// ---------------------------------------------------------------------------
struct WorkHandle::State {
  std::weak_ptr<ProcessGroup::Impl> impl;
  std::string op;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, Bucket>> parts;
  bool done = false;
};

WorkHandle::WorkHandle() = default;
WorkHandle::WorkHandle(std::shared_ptr<State> s) : s_(std::move(s)) {}
WorkHandle::~WorkHandle() = default;
WorkHandle::WorkHandle(WorkHandle&&) noexcept = default;
WorkHandle& WorkHandle::operator=(WorkHandle&&) noexcept = default;

bool WorkHandle::completed() const {
  if (!s_ || s_->done) return true;
  for (auto& p : s_->parts)
    if (!p.first->isCompleted()) return false;
  return true;
}

void WorkHandle::wait() {
  if (!s_ || s_->done) return;
  auto impl = s_->impl.lock();
  if (!impl)
    throw DistError(s_->op, -1, -1, 0, "mmpost", "process group was destroyed before wait()");
  s_->done = true;
  impl->check_usable(s_->op);
  try {
    for (auto& p : s_->parts) {
      impl->wait_work(p.first, s_->op);
      unpack(p.second);
    }
  } catch (...) {
    impl->fail(s_->op);
  }
  s_->parts.clear();
}

// ---------------------------------------------------------------------------
// ProcessGroup
// ---------------------------------------------------------------------------
ProcessGroup::ProcessGroup(const WorldInfo& world, double timeout_s, const std::string& backend,
                           bool check_collectives)
    : impl_(std::make_shared<Impl>()) {
  if (!(timeout_s > 0)) throw std::invalid_argument("mmpost::dist::ProcessGroup: timeout must be > 0");
  if (backend != "gloo" && backend != "nccl")
    throw std::invalid_argument("mmpost::dist::ProcessGroup: unknown backend '" + backend + "'");
#ifndef MMPOST_WITH_NCCL
  if (backend == "nccl")
    throw std::invalid_argument(
        "mmpost::dist::ProcessGroup: backend 'nccl' needs a build with MMPOST_WITH_NCCL "
        "against a CUDA LibTorch");
#endif
  auto& I = *impl_;
  I.world = world;
  I.timeout_s = timeout_s;
  I.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  I.backend = backend;
  I.check = check_collectives || env_str("MMPOST_DIST_CHECK").value_or("0") == "1";
  try {
    if (world.world_size == 1) {
      I.store = c10::make_intrusive<c10d::HashStore>();
    } else {
      c10d::TCPStoreOptions o;
      o.port = static_cast<std::uint16_t>(world.master_port);
      o.isServer = world.rank == 0 && !world.agent_store;
      o.numWorkers = world.agent_store ? std::nullopt : std::optional<std::size_t>(world.world_size);
      o.waitWorkers = !world.agent_store;  // server blocks until all ranks connected
      // A client's connect loop can overrun its deadline by one whole
      // attempt (each attempt may last `timeout`, plus a random back-off), so
      // clients connect with half the timeout and switch to the full one.
      o.timeout = o.isServer ? I.timeout : std::max(std::chrono::milliseconds(1000), I.timeout / 2);
      o.multiTenant = true;
      auto tcp = c10::make_intrusive<c10d::TCPStore>(world.master_addr, o);
      tcp->setTimeout(I.timeout);
      I.store = c10::make_intrusive<c10d::PrefixStore>(
          "mmpost/" + std::to_string(world.restart_count), tcp);
    }
    if (backend == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(I.timeout);
      opts->devices = make_gloo_devices(world);
      opts->threads = static_cast<int>(2 * opts->devices.size());
      // The constructor connects the full mesh through the store (bounded by
      // opts->timeout): a rank that never starts fails here.
      I.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(I.store, world.rank, world.world_size, opts);
    }
#ifdef MMPOST_WITH_NCCL
    else {
      // Untested sketch (not compiled on CPU builds). Blocking wait makes
      // Work::wait() throw DistBackendError on timeout instead of leaving the
      // watchdog to tear the process down; it must be set before creation.
      ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = I.timeout;
      I.obj_device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
      I.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(I.store, world.rank, world.world_size, opts);
    }
#endif
  } catch (...) {
    I.fail("init");
  }
}

ProcessGroup::~ProcessGroup() {
  if (!impl_) return;
  try {
    if (impl_->pg) impl_->pg->shutdown();  // no-op for gloo; required for NCCL
  } catch (...) {
  }
  impl_->pg.reset();
  impl_->store.reset();
}

int ProcessGroup::rank() const { return impl_->world.rank; }
int ProcessGroup::world_size() const { return impl_->world.world_size; }
double ProcessGroup::timeout_s() const { return impl_->timeout_s; }
const std::string& ProcessGroup::backend() const { return impl_->backend; }
bool ProcessGroup::broken() const { return impl_->broken; }
bool ProcessGroup::check_collectives() const { return impl_->check; }

WorkHandle ProcessGroup::all_reduce_sum_async(std::vector<at::Tensor>& tensors) {
  const std::string op = "all_reduce_sum";
  impl_->check_usable(op);
  auto buckets = pack(tensors, "all_reduce_sum");
  auto st = std::make_shared<WorkHandle::State>();
  st->impl = impl_;
  st->op = op;
  try {
    impl_->verify_same_call(op, total_numel(buckets), layout_hash(buckets), 0);
    for (auto& b : buckets) {
      std::vector<at::Tensor> v{b.flat};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      o.timeout = impl_->timeout;
      auto w = impl_->pg->allreduce(v, o);
      st->parts.emplace_back(std::move(w), std::move(b));
    }
  } catch (...) {
    impl_->fail(op);
  }
  return WorkHandle(st);
}

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors) {
  all_reduce_sum_async(tensors).wait();
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
  const std::string op = "broadcast";
  impl_->check_usable(op);
  if (root < 0 || root >= world_size())
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " outside [0, " +
                                std::to_string(world_size()) + ")");
  auto buckets = pack(tensors, "broadcast");
  try {
    impl_->verify_same_call(op, total_numel(buckets), layout_hash(buckets), root);
    for (auto& b : buckets) {
      std::vector<at::Tensor> v{b.flat};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.rootTensor = 0;
      o.timeout = impl_->timeout;
      impl_->wait_work(impl_->pg->broadcast(v, o), op);
      if (rank() != root) unpack(b);
    }
  } catch (...) {
    impl_->fail(op);
  }
}

namespace {
at::Tensor gather_rows(ProcessGroup::Impl& I, const at::Tensor& tensor, const std::string& op) {
  // c10d's _allgather_base splits `out` along dim 0 into world_size chunks
  // shaped like `in`, so gather flat and reshape to [world, *shape] after.
  at::Tensor in = tensor.contiguous().reshape({-1});
  std::vector<int64_t> shape{I.world.world_size};
  for (auto s : tensor.sizes()) shape.push_back(s);
  at::Tensor out = at::empty({I.world.world_size * in.numel()}, in.options());
  if (in.numel() > 0) {
    c10d::AllgatherOptions o;
    o.timeout = I.timeout;
    I.wait_work(I.pg->_allgather_base(out, in, o), op);
  }
  return out.view(shape);
}
}  // namespace

at::Tensor ProcessGroup::all_gather(const at::Tensor& tensor) {
  const std::string op = "all_gather";
  impl_->check_usable(op);
  if (!tensor.defined() || tensor.layout() != at::kStrided)
    throw std::invalid_argument("all_gather: tensor must be defined and dense");
  try {
    impl_->verify_same_call(op, tensor.numel(), static_cast<int64_t>(tensor.scalar_type()), tensor.dim());
    return gather_rows(*impl_, tensor, op);
  } catch (...) {
    impl_->fail(op);
  }
}

namespace {
// Gathers variable-length byte blobs: lengths first, then max-padded bytes.
std::vector<std::string> gather_bytes(ProcessGroup::Impl& I, const std::string& bytes,
                                      const std::string& op) {
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong).to(I.obj_device);
  at::Tensor lens = gather_rows(I, len, op).cpu();  // [world, 1]
  int64_t maxlen = lens.max().item<int64_t>();
  std::vector<std::string> out(I.world.world_size);
  if (maxlen == 0) return out;
  at::Tensor buf = at::zeros({maxlen}, at::kByte);
  if (!bytes.empty()) std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  at::Tensor all = gather_rows(I, buf.to(I.obj_device), op).cpu();  // [world, maxlen]
  const auto* base = all.data_ptr<uint8_t>();
  auto lacc = lens.accessor<int64_t, 2>();
  for (int r = 0; r < I.world.world_size; ++r) {
    int64_t n = lacc[r][0];
    if (n < 0 || n > maxlen) throw std::runtime_error("corrupt length from rank " + std::to_string(r));
    out[r].assign(reinterpret_cast<const char*>(base + r * maxlen), static_cast<size_t>(n));
  }
  return out;
}
}  // namespace

std::vector<std::string> ProcessGroup::all_gather_object(const std::string& value) {
  const std::string op = "all_gather_object";
  impl_->check_usable(op);
  try {
    impl_->verify_same_call(op, 1, 0, 0);  // lengths may differ by design
    return gather_bytes(*impl_, value, op);
  } catch (...) {
    impl_->fail(op);
  }
}

std::vector<std::vector<double>> ProcessGroup::all_gather_object(const std::vector<double>& value) {
  const std::string op = "all_gather_object";
  impl_->check_usable(op);
  std::string bytes(value.size() * sizeof(double), '\0');
  if (!value.empty()) std::memcpy(bytes.data(), value.data(), bytes.size());
  std::vector<std::string> raw;
  try {
    impl_->verify_same_call(op, 2, 0, 0);
    raw = gather_bytes(*impl_, bytes, op);
  } catch (...) {
    impl_->fail(op);
  }
  std::vector<std::vector<double>> out(raw.size());
  for (size_t r = 0; r < raw.size(); ++r) {
    out[r].resize(raw[r].size() / sizeof(double));
    if (!out[r].empty()) std::memcpy(out[r].data(), raw[r].data(), out[r].size() * sizeof(double));
  }
  return out;
}

void ProcessGroup::barrier() {
  const std::string op = "barrier";
  impl_->check_usable(op);
  try {
    impl_->verify_same_call(op, 0, 0, 0);
    c10d::BarrierOptions o;
    o.timeout = impl_->timeout;
    impl_->wait_work(impl_->pg->barrier(o), op);
  } catch (...) {
    impl_->fail(op);
  }
}

std::vector<double> sum_over_ranks(ProcessGroup* pg, std::vector<double> values) {
  if (pg == nullptr || pg->world_size() == 1 || values.empty()) return values;
  std::vector<at::Tensor> t{at::tensor(values, at::kDouble)};
  pg->all_reduce_sum(t);
  auto out = t[0].contiguous();
  return {out.data_ptr<double>(), out.data_ptr<double>() + out.numel()};
}

}  // namespace mmpost::dist
