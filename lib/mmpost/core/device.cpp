// Device/dtype parsing and seeding (see device.h).
#include "mmpost/core/device.h"

#include <ATen/autocast_mode.h>

#include <fstream>

#include "mmpost/core/check.h"

namespace mmpost {

torch::Device resolve_device(const std::string& spec) {
  if (spec == "auto") {
    return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  }
  if (spec == "cpu") return torch::Device(torch::kCPU);
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    MMPOST_CHECK_USAGE(torch::cuda::is_available(),
                       "device \"", spec, "\" requested but this LibTorch build sees no CUDA device",
                       "\n  hint: use --device cpu; `mmpost --version` says whether this build "
                       "has CUDA: a CPU build needs a CUDA LibTorch (Torch_DIR), a CUDA build "
                       "a visible GPU (nvidia-smi, CUDA_VISIBLE_DEVICES)");
    int64_t index = 0;
    if (spec.size() > 5) {
      try {
        index = std::stoll(spec.substr(5));
      } catch (const std::exception&) {
        throw Error(ErrorKind::kUsage, "device \"" + spec + "\": bad CUDA index");
      }
    }
    MMPOST_CHECK_USAGE(index >= 0 && index < static_cast<int64_t>(torch::cuda::device_count()),
                       "device \"", spec, "\": only ", torch::cuda::device_count(),
                       " CUDA device(s) visible");
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw Error(ErrorKind::kUsage, "device \"" + spec + "\" is not valid",
              "valid values: auto, cpu, cuda, cuda:N");
}

torch::Dtype resolve_dtype(const std::string& spec, const torch::Device& device) {
  if (spec == "float32" || spec == "fp32") return torch::kFloat32;
  if (spec == "bfloat16" || spec == "bf16") return torch::kBFloat16;
  if (spec == "float16" || spec == "fp16") return torch::kFloat16;
  if (spec == "auto") return device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  throw Error(ErrorKind::kUsage, "dtype \"" + spec + "\" is not valid",
              "valid values: auto, float32, bfloat16, float16");
}

std::string dtype_name(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    case torch::kFloat64: return "float64";
    case torch::kInt64: return "int64";
    case torch::kInt32: return "int32";
    default: return std::string(c10::toString(dtype));
  }
}

void seed_everything(uint64_t seed) {
  torch::manual_seed(seed);
  if (torch::cuda::is_available()) torch::cuda::manual_seed_all(seed);
}

std::string describe_device(const torch::Device& device) {
  if (device.is_cpu()) return "cpu (" + std::to_string(torch::get_num_threads()) + " threads)";
  return device.str();
}

int64_t available_host_memory_bytes() {
  int64_t avail = -1;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit) {
      if (key == "MemAvailable:") {
        avail = kb * 1024;
        break;
      }
    }
  }
  // cgroup v2: the limit of this process's own group (its path from /proc/self/cgroup "0::/...").
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    std::ifstream max_in(dir + "/memory.max"), cur_in(dir + "/memory.current");
    std::string max_s;
    int64_t cur = 0;
    if (max_in >> max_s && max_s != "max" && cur_in >> cur) {
      const int64_t headroom = std::max<int64_t>(0, std::stoll(max_s) - cur);
      avail = avail < 0 ? headroom : std::min(avail, headroom);
    }
  }
  return avail;
}

AutocastGuard::AutocastGuard(const torch::Device& device, torch::Dtype dtype, bool enabled)
    : enabled_(enabled), device_type_(device.type()) {
  if (!enabled_) return;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
}

}  // namespace mmpost
