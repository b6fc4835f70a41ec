// safetensors reader (mmap + validation of the untrusted header) and atomic, aligned writer,
// single-file and HF-sharded. See safetensors.h for the format and the guarantees.
#include "mmpost/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "mmpost/core/check.h"
#include "mmpost/io/atomic_file.h"

namespace mmpost::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; big-endian hosts need byte swapping");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the spec's limit (Rust: HeaderTooLarge)
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

struct DtypeSpec {
  const char* name;
  torch::ScalarType dtype;
  size_t size;
};

constexpr DtypeSpec kDtypes[] = {
    {"F64", torch::kFloat64, 8}, {"F32", torch::kFloat32, 4}, {"F16", torch::kFloat16, 2},
    {"BF16", torch::kBFloat16, 2}, {"I64", torch::kInt64, 8}, {"I32", torch::kInt32, 4},
    {"I16", torch::kInt16, 2}, {"I8", torch::kInt8, 1}, {"U8", torch::kUInt8, 1},
    {"BOOL", torch::kBool, 1},
};

const DtypeSpec* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeSpec* find_dtype(torch::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.dtype) return &d;
  return nullptr;
}

[[noreturn]] void bad_file(const fs::path& file, const std::string& msg) {
  throw Error(ErrorKind::kData, file.string() + ": " + msg,
              "not a valid safetensors file (a truncated download, or another format?)");
}

[[noreturn]] void bad_tensor(const fs::path& file, const std::string& name,
                             const std::string& msg) {
  throw Error(ErrorKind::kData, file.string() + ": tensor '" + name + "': " + msg);
}

// Validates one header entry {dtype, shape, data_offsets}; `data_size` bounds the offsets.
SafetensorsTensorInfo parse_entry(const fs::path& file, const std::string& name, const json& e,
                                  uint64_t data_size) {
  if (!e.is_object()) bad_tensor(file, name, "header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key))
      bad_tensor(file, name, std::string("header entry has no \"") + key + "\"");
  const json& dtype = e["dtype"];
  const json& shape = e["shape"];
  const json& offsets = e["data_offsets"];
  if (!dtype.is_string()) bad_tensor(file, name, "\"dtype\" is not a string");
  const DtypeSpec* spec = find_dtype(dtype.get<std::string>());
  if (spec == nullptr)
    bad_tensor(file, name, "unsupported dtype '" + dtype.get<std::string>() +
                               "' (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  if (!shape.is_array()) bad_tensor(file, name, "\"shape\" is not an array");
  SafetensorsTensorInfo info{spec->name, spec->dtype, {}, 0, 0};
  uint64_t numel = 1;
  for (const json& d : shape) {
    if (d.is_number_integer() && !d.is_number_unsigned())
      bad_tensor(file, name, "negative dimension " + d.dump() + " in shape " + shape.dump());
    if (!d.is_number_unsigned())
      bad_tensor(file, name, "shape " + shape.dump() + " is not integers");
    uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel) ||
        numel > static_cast<uint64_t>(INT64_MAX))
      bad_tensor(file, name, "shape " + shape.dump() + " has too many elements");
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    bad_tensor(file, name, "\"data_offsets\" is not [begin, end] of non-negative integers");
  info.offset_begin = offsets[0].get<uint64_t>();
  info.offset_end = offsets[1].get<uint64_t>();
  if (info.offset_begin > info.offset_end)
    bad_tensor(file, name, "data_offsets begin > end: " + offsets.dump());
  if (info.offset_end > data_size)
    bad_tensor(file, name, "data_offsets " + offsets.dump() + " extend past the end of the data (" +
                               std::to_string(data_size) + " bytes)");
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(spec->size), &n_bytes) ||
      n_bytes != info.offset_end - info.offset_begin)
    bad_tensor(file, name, "data_offsets " + offsets.dump() + " span " +
                               std::to_string(info.offset_end - info.offset_begin) +
                               " bytes but shape " + shape.dump() + " of " + spec->name +
                               " needs " + std::to_string(numel) + " x " +
                               std::to_string(spec->size));
  return info;
}

void check_no_overlap(const fs::path& file,
                      const std::map<std::string, SafetensorsTensorInfo>& infos) {
  std::vector<const std::pair<const std::string, SafetensorsTensorInfo>*> sorted;
  for (const auto& kv : infos) sorted.push_back(&kv);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return std::pair(a->second.offset_begin, a->second.offset_end) <
           std::pair(b->second.offset_begin, b->second.offset_end);
  });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->second.offset_begin < sorted[i - 1]->second.offset_end)
      bad_tensor(file, sorted[i]->first,
                 "data overlaps tensor '" + sorted[i - 1]->first + "' (begin " +
                     std::to_string(sorted[i]->second.offset_begin) + " < its end " +
                     std::to_string(sorted[i - 1]->second.offset_end) + ")");
  }
}

}  // namespace

namespace {
// Address ranges [begin, end) of the live mappings, for release_mapped_pages.
std::mutex& mapping_registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<uintptr_t, uintptr_t>& mapping_registry() {
  static std::map<uintptr_t, uintptr_t> ranges;
  return ranges;
}
}  // namespace

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  void publish() {
    std::lock_guard<std::mutex> lock(mapping_registry_mutex());
    mapping_registry()[reinterpret_cast<uintptr_t>(addr)] = reinterpret_cast<uintptr_t>(addr) + size;
  }
  ~Mapping() {
    if (addr == nullptr) return;
    std::lock_guard<std::mutex> lock(mapping_registry_mutex());
    mapping_registry().erase(reinterpret_cast<uintptr_t>(addr));
    ::munmap(addr, size);
  }
};

void release_mapped_pages(const torch::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.has_storage() || t.storage().nbytes() == 0)
    return;
  const auto begin = reinterpret_cast<uintptr_t>(t.storage().data());
  const uintptr_t end = begin + t.storage().nbytes();
  std::lock_guard<std::mutex> lock(mapping_registry_mutex());
  const auto& ranges = mapping_registry();
  auto it = ranges.upper_bound(begin);  // the first mapping starting after begin
  if (it == ranges.begin()) return;
  --it;
  if (end > it->second) return;  // not inside one mapping: heap memory, never advised
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page;  // whole pages only: neighbours keep theirs
  const uintptr_t last = end / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

SafetensorsFile::SafetensorsFile(const fs::path& file) : path_(file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw Error(ErrorKind::kData, file.string() + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kData, file.string() + ": not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    bad_file(file, "file is " + std::to_string(file_size) +
                       " bytes, shorter than the 8-byte header length");
  }
  mapping_ = std::make_shared<Mapping>();
  // Private + writable = copy-on-write: in-place ops on aliasing tensors never reach the file.
  void* addr =
      ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED)
    throw Error(ErrorKind::kRuntime, file.string() + ": mmap failed: " + std::strerror(err));
  mapping_->addr = addr;
  mapping_->size = file_size;
  mapping_->publish();

  const auto* bytes = static_cast<const char*>(addr);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > kMaxHeaderBytes)
    bad_file(file, "header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  if (header_len > file_size - 8)
    bad_file(file, "header length " + std::to_string(header_len) +
                       " extends past the end of the file (" + std::to_string(file_size) +
                       " bytes)");
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {
    bad_file(file, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object())
    bad_file(file, "header is a JSON " + std::string(header.type_name()) + ", not an object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad_file(file, "\"__metadata__\" is not a JSON object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) bad_file(file, "\"__metadata__\" value of '" + k + "' is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    infos_[name] = parse_entry(file, name, entry, data_size);
  }
  check_no_overlap(file, infos_);
}

std::vector<std::string> SafetensorsFile::keys() const {
  std::vector<std::string> out;
  out.reserve(infos_.size());
  for (const auto& kv : infos_) out.push_back(kv.first);
  return out;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end())
    throw Error(ErrorKind::kData, path_.string() + ": no tensor named '" + name + "'");
  return it->second;
}

const std::byte* SafetensorsFile::mapping_data() const {
  return static_cast<const std::byte*>(mapping_->addr);
}

size_t SafetensorsFile::mapping_size() const { return mapping_->size; }

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensorInfo& info = this->info(name);
  auto options = torch::TensorOptions().dtype(info.dtype).device(torch::kCPU);
  const uint64_t n_bytes = info.offset_end - info.offset_begin;
  if (n_bytes == 0) return torch::empty(info.shape, options);
  auto* data = static_cast<char*>(mapping_->addr) + data_start_ + info.offset_begin;
  if (info.dtype == torch::kBool) {
    // Any byte but 0/1 in a C++ bool is undefined behaviour; reject rather than propagate.
    const auto* u = reinterpret_cast<const uint8_t*>(data);
    if (std::any_of(u, u + n_bytes, [](uint8_t b) { return b > 1; }))
      bad_tensor(path_, name, "BOOL data holds bytes other than 0 and 1");
  }
  const size_t elem = torch::elementSize(info.dtype);
  if (reinterpret_cast<uintptr_t>(data) % elem == 0) {
    std::shared_ptr<Mapping> keep = mapping_;
    return torch::from_blob(data, info.shape, [keep](void*) {}, options);
  }
  torch::Tensor out = torch::empty(info.shape, options);
  std::memcpy(out.data_ptr(), data, n_bytes);
  return out;
}

// ---- folders and shards -------------------------------------------------------------------------

namespace {

SafetensorsContents read_sharded(const fs::path& dir) {
  const fs::path index_path = dir / kIndexName;
  json index;
  try {
    std::ifstream in(index_path);
    MMPOST_CHECK_DATA(in.good(), index_path.string(), ": cannot open");
    index = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kData, index_path.string() + ": not valid JSON: " + e.what());
  }
  MMPOST_CHECK_DATA(index.is_object() && index.contains("weight_map") &&
                        index["weight_map"].is_object(),
                    index_path.string(), ": expected an object with a \"weight_map\" object");
  SafetensorsContents out;
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensor names
  for (const auto& [name, shard] : index["weight_map"].items()) {
    MMPOST_CHECK_DATA(shard.is_string(), index_path.string(), ": weight_map['", name,
                      "'] is not a string");
    fs::path rel = shard.get<std::string>();
    bool inside = rel.is_relative() && !rel.empty() &&
                  std::none_of(rel.begin(), rel.end(), [](const fs::path& p) { return p == ".."; });
    MMPOST_CHECK_DATA(inside, index_path.string(), ": weight_map['", name, "'] = '", rel.string(),
                      "' is not a file inside the folder");
    by_shard[rel.string()].push_back(name);
  }
  for (const auto& [shard, names] : by_shard) {
    SafetensorsFile file(dir / shard);
    for (const std::string& name : names) {
      MMPOST_CHECK_DATA(file.contains(name), file.path().string(), ": tensor '", name,
                        "' listed in ", kIndexName, " is missing from the shard");
      out.tensors[name] = file.tensor(name);
    }
    for (const auto& kv : file.metadata()) out.metadata.insert(kv);
  }
  if (index.contains("metadata") && index["metadata"].is_object())
    for (const auto& [k, v] : index["metadata"].items())
      if (v.is_string()) out.metadata.insert({k, v.get<std::string>()});
  return out;
}

}  // namespace

SafetensorsContents read_safetensors(const fs::path& file_or_hf_dir) {
  std::error_code ec;
  if (fs::is_directory(file_or_hf_dir, ec)) {
    if (fs::exists(file_or_hf_dir / kIndexName)) return read_sharded(file_or_hf_dir);
    MMPOST_CHECK_DATA(fs::exists(file_or_hf_dir / kSingleName), file_or_hf_dir.string(),
                      ": folder has neither ", kIndexName, " nor ", kSingleName);
    return read_safetensors(file_or_hf_dir / kSingleName);
  }
  SafetensorsFile file(file_or_hf_dir);
  SafetensorsContents out;
  for (const std::string& name : file.keys()) out.tensors[name] = file.tensor(name);
  out.metadata = file.metadata();
  return out;
}

std::map<std::string, torch::Tensor> load_safetensors(const fs::path& file_or_hf_dir) {
  return read_safetensors(file_or_hf_dir).tensors;
}

// ---- writing ------------------------------------------------------------------------------------

namespace {

const DtypeSpec& checked_dtype(const std::string& name, const torch::Tensor& t) {
  MMPOST_CHECK_USAGE(!name.empty() && name != "__metadata__",
                     "save_safetensors: invalid tensor name '", name, "'");
  MMPOST_CHECK_USAGE(t.defined(), "save_safetensors: tensor '", name, "' is undefined");
  const DtypeSpec* spec = find_dtype(t.scalar_type());
  MMPOST_CHECK_USAGE(spec != nullptr, "save_safetensors: tensor '", name, "' has dtype ",
                     t.scalar_type(), ", which safetensors I/O does not support");
  return *spec;
}

uint64_t byte_size(const torch::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
}

}  // namespace

void save_safetensors(const fs::path& file, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Layout order: element size descending, then name (as Python safetensors), keeping alignment.
  std::vector<std::pair<const std::string*, const torch::Tensor*>> order;
  for (const auto& [name, t] : tensors) {
    checked_dtype(name, t);
    order.emplace_back(&name, &t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->element_size() > b.second->element_size();
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    const uint64_t n = byte_size(*t);
    header[*name] = {{"dtype", checked_dtype(*name, *t).name},
                     {"shape", t->sizes().vec()},
                     {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data buffer starts 8-byte aligned
  const uint64_t header_len = text.size();

  AtomicFile out(file);
  out.write(&header_len, 8);
  out.write(text.data(), text.size());
  for (const auto& [name, t] : order) {
    torch::Tensor cpu = t->to(torch::kCPU).contiguous();  // one tensor at a time
    if (cpu.numel() > 0) out.write(cpu.data_ptr(), byte_size(cpu));
  }
  out.commit();
}

void save_safetensors_sharded(const fs::path& dir,
                              const std::map<std::string, torch::Tensor>& tensors,
                              uint64_t max_shard_bytes,
                              const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MMPOST_CHECK(!ec, dir.string(), ": cannot create folder: ", ec.message());
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += byte_size(t);

  std::set<std::string> written;
  if (total <= max_shard_bytes) {
    save_safetensors(dir / kSingleName, tensors, metadata);
    written.insert(kSingleName);
  } else {
    std::vector<std::map<std::string, torch::Tensor>> shards(1);
    uint64_t shard_bytes = 0;
    for (const auto& [name, t] : tensors) {
      checked_dtype(name, t);
      if (!shards.back().empty() && shard_bytes + byte_size(t) > max_shard_bytes) {
        shards.emplace_back();
        shard_bytes = 0;
      }
      shards.back()[name] = t;
      shard_bytes += byte_size(t);
    }
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char shard_name[64];
      std::snprintf(shard_name, sizeof(shard_name), "model-%05zu-of-%05zu.safetensors", i + 1,
                    shards.size());
      save_safetensors(dir / shard_name, shards[i], metadata);
      written.insert(shard_name);
      for (const auto& kv : shards[i]) weight_map[kv.first] = shard_name;
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::string text = index.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    AtomicFile out(dir / kIndexName);
    out.write(text.data(), text.size());
    out.commit();
    written.insert(kIndexName);
  }
  // Remove what an earlier save left behind, so a loader cannot mix layouts.
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string fname = entry.path().filename().string();
    bool ours = fname == kSingleName || fname == kIndexName ||
                (fname.rfind("model-", 0) == 0 && fname.find("-of-") != std::string::npos &&
                 fname.size() > 12 && fname.substr(fname.size() - 12) == ".safetensors");
    if (ours && written.count(fname) == 0) stale.push_back(entry.path());
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
}

}  // namespace mmpost::io
