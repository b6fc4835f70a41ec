// The safetensors format (spec: github.com/huggingface/safetensors README): an 8-byte
// little-endian u64 header length N, N bytes of JSON header, then the data buffer. Reading
// memory-maps the file and validates the untrusted header before any tensor is touched; writing is
// atomic, 8-byte aligned and HF-compatible, including HF's sharded layout
// (model-0000i-of-0000N.safetensors + model.safetensors.index.json).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mmpost::io {

/// One tensor's header entry. Offsets are bytes relative to the start of the data buffer.
struct SafetensorsTensorInfo {
  std::string dtype_name;       ///< as in the file: "F32", "BF16", ...
  torch::ScalarType dtype;      ///< the matching torch dtype
  std::vector<int64_t> shape;   ///< [] for a 0-d scalar
  uint64_t offset_begin = 0;    ///< data_offsets[0]
  uint64_t offset_end = 0;      ///< data_offsets[1] (exclusive)
};

/// A memory-mapped, validated safetensors file. Supported dtypes: F64 F32 F16 BF16 I64 I32 I16
/// I8 U8 BOOL. Construction throws mmpost::Error (kData, kRuntime for open/mmap failures) naming
/// the file and, where one is at fault, the tensor: file shorter than 8 bytes, header length over
/// 100 MB or past the end of the file, header not a JSON object, an entry missing dtype/shape/
/// data_offsets or with wrong types, negative dims, begin > end, offsets past the data buffer,
/// overlapping tensors, byte count != numel x element size (overflow-checked), unknown dtype,
/// non-string __metadata__ values. Tensors from tensor() keep the mapping alive, so the
/// SafetensorsFile itself may be destroyed first. Assumes a little-endian host (static_assert).
class SafetensorsFile {
 public:
  /// Opens and maps `file` (MAP_PRIVATE, read + copy-on-write: in-place ops on returned tensors
  /// are allowed and never modify the file). Truncating the file while it is mapped is undefined
  /// (SIGBUS); this project's writers replace files by rename, which is safe.
  explicit SafetensorsFile(const std::filesystem::path& file);

  const std::filesystem::path& path() const { return path_; }
  /// Tensor names, sorted.
  std::vector<std::string> keys() const;
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  /// Header entry of `name`; throws mmpost::Error (kData) naming the file if absent.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  /// CPU tensor of `name`. It aliases the mapping (no copy) when its data is aligned to the
  /// element size, which holds for files from this writer and from Python's safetensors; otherwise
  /// (a hand-made or foreign file) the bytes are copied into a fresh tensor, since misaligned
  /// typed access is undefined behaviour in C++ kernels even where torch allows it. Empty tensors
  /// are fresh. BOOL bytes other than 0/1 are rejected (kData). Throws if `name` is absent.
  torch::Tensor tensor(const std::string& name) const;
  /// The "__metadata__" map (empty if the header has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The whole mapped file, e.g. to test whether a tensor aliases it.
  const std::byte* mapping_data() const;
  size_t mapping_size() const;

  struct Mapping;  // munmaps on destruction; shared with every aliasing tensor

 private:
  std::filesystem::path path_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t data_start_ = 0;  // file offset of the data buffer (8 + header length)
  std::map<std::string, SafetensorsTensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// Tensors and metadata of a file or HF folder.
struct SafetensorsContents {
  std::map<std::string, torch::Tensor> tensors;
  /// "__metadata__" of the file; for a sharded folder, the union over shards (first shard wins)
  /// plus the string entries of the index's "metadata".
  std::map<std::string, std::string> metadata;
};

/// Reads a safetensors file, or an HF model folder holding model.safetensors.index.json (all the
/// shards its weight_map names; preferred when present) or model.safetensors. Tensors are CPU and
/// alias the mapping where aligned (see SafetensorsFile::tensor). Throws mmpost::Error (kData)
/// naming the file/folder and tensor: invalid files, a folder with neither file, an index that is
/// not {"weight_map": {name: shard}} or names a shard outside the folder or a missing tensor.
SafetensorsContents read_safetensors(const std::filesystem::path& file_or_hf_dir);

/// read_safetensors(file_or_hf_dir).tensors.
std::map<std::string, torch::Tensor> load_safetensors(const std::filesystem::path& file_or_hf_dir);

/// For loaders, after the last use of a tensor read_safetensors / SafetensorsFile returned: when
/// `t`'s storage lies inside a live file mapping of theirs, drops the whole pages of that storage
/// from this process's resident set (madvise MADV_DONTNEED on the private mapping). The bytes read
/// back from the file on the next access; an in-place change made to them is lost. So loading a
/// model copies one tensor's pages at a time and its peak RSS is the model plus one tensor, not
/// the model plus the whole file (what transformers' loading reaches too). A no-op for any other
/// tensor (heap, copies, non-CPU). Never throws.
void release_mapped_pages(const torch::Tensor& t);

/// Writes `tensors` to `file` atomically (temp "<file>.tmp.<pid>", fsync, rename). Tensors may
/// live on any device, any layout: each is copied to contiguous CPU memory one at a time while
/// writing. The header is padded with spaces so the data buffer starts 8-byte aligned; tensors are
/// laid out without gaps sorted by (element size descending, name) -- Python safetensors' own order
/// -- so every tensor stays aligned to its element size and reads back without a copy. Throws
/// mmpost::Error: kUsage for an empty or "__metadata__" name, an undefined tensor or an
/// unsupported dtype; kRuntime naming the file for write errors (disk full: temp removed).
void save_safetensors(const std::filesystem::path& file,
                      const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// Writes `tensors` into folder `dir` (created if needed) in HF's layout: a single
/// "model.safetensors" if their total byte size is <= max_shard_bytes, else shards
/// "model-00001-of-0000N.safetensors" (filled greedily in name order; a tensor larger than the
/// limit gets a shard of its own) plus "model.safetensors.index.json"
/// ({"metadata": {"total_size": bytes}, "weight_map": {name: shard}}), written last. `metadata`
/// goes into every file's "__metadata__". Stale model*.safetensors files and index from an earlier
/// save in `dir` are removed afterwards. Throws like save_safetensors.
void save_safetensors_sharded(
    const std::filesystem::path& dir, const std::map<std::string, torch::Tensor>& tensors,
    uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace mmpost::io
