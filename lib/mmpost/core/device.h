// Device and dtype resolution from recipe strings, and seeding. Device-agnostic by design:
// "auto" picks CUDA when this LibTorch build sees a GPU, else the CPU; nothing assumes either.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace mmpost {

/// Parses "auto" | "cpu" | "cuda" | "cuda:N". Throws mmpost::Error (kUsage) for other strings,
/// and for "cuda" when this LibTorch has no CUDA device (with a hint naming the fix).
torch::Device resolve_device(const std::string& spec);

/// Parses "float32" | "bfloat16" | "float16" ("auto" = bfloat16 on CUDA devices that support it,
/// float32 otherwise). Throws mmpost::Error (kUsage) naming the valid values.
torch::Dtype resolve_dtype(const std::string& spec, const torch::Device& device);

/// Automatic mixed precision for the current thread while alive (torch.autocast(device_type,
/// dtype)): matmuls, convolutions and attention run in `dtype` (bf16), parameters and what
/// autocast keeps in float32 (reductions, norms, losses) stay float32, so gradients flow into
/// float32 master weights. Restores the previous state and clears autocast's weight-cast cache
/// on destruction. enabled = false: does nothing.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, torch::Dtype dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_ = false;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  bool prev_enabled_ = false;
  torch::Dtype prev_dtype_ = torch::kFloat32;
};

/// Lower-case name of a dtype as written in configs ("float32", "bfloat16", ...).
std::string dtype_name(torch::Dtype dtype);

/// Seeds torch's CPU and CUDA generators.
void seed_everything(uint64_t seed);

/// Short device description for logs: "cpu (N threads)" (torch intra-op threads) or "cuda:K".
std::string describe_device(const torch::Device& device);

/// Bytes this process may still allocate in host memory: /proc/meminfo MemAvailable, lowered to
/// the cgroup v2 headroom (memory.max - memory.current, e.g. a Slurm job's --mem) when one is
/// set. -1 when neither can be read.
int64_t available_host_memory_bytes();

}  // namespace mmpost
