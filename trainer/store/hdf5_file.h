// A small document model of an HDF5 file (groups with attributes, float32 and uint8 datasets
// with attributes) and its atomic writer and checked reader. The checkpoint store
// (checkpoint.h) maps models onto it; `topiary inspect` reads it directly.
//
// Every dataset is chunked with the Fletcher-32 checksum filter, so a flipped byte is found
// on read. Files are written under a temporary name, fsynced and renamed into place, so a
// reader sees the old file or the complete new one, never a partial one. The HDF5 library
// is not thread-safe in Debian's build; calls here are serialized by a process-wide lock.
#ifndef TOPIARY_TRAINER_STORE_HDF5_FILE_H_
#define TOPIARY_TRAINER_STORE_HDF5_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace topiary {

// Allocates without value-initializing: the large float arrays of checkpoints are always
// overwritten right away, and zero-filling them first costs as much as reading them.
template <typename T>
struct NoInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() = default;
  template <typename U>
  NoInitAllocator(const NoInitAllocator<U>&) {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using FloatArray = std::vector<float, NoInitAllocator<float>>;

using H5Attr = std::variant<int64_t, double, std::string>;
using H5Attrs = std::map<std::string, H5Attr>;

struct H5Dataset {
  std::vector<int64_t> shape;
  FloatArray f32;           // a float32 dataset, or
  std::vector<uint8_t> u8;  // a uint8 dataset (exactly one of the two is non-empty)
  H5Attrs attrs;
  size_t count() const;
};

struct H5Document {
  std::map<std::string, H5Attrs> groups;      // absolute group path ("/" too) -> attributes
  std::map<std::string, H5Dataset> datasets;  // absolute dataset path -> dataset
};

// kReplace: a file at the path is replaced. kCreate: the path must not exist when the file
// is put there (ALREADY_EXISTS otherwise, checked by the filesystem as the file is linked
// into place, so a file written meanwhile by anyone is never replaced).
enum class WriteMode { kReplace, kCreate };

// Writes `doc` to `path` atomically (temporary file, fsync, rename, fsync of the folder),
// sealed: a 512-byte HDF5 user block at the start holds a CRC-32 of the rest of the file
// (docs/checkpoint-format.md). Errors name the file and what HDF5 or the OS reported.
absl::Status WriteH5File(const std::string& path, const H5Document& doc,
                         WriteMode mode = WriteMode::kReplace);

// Reads every group attribute and dataset of `path`. Errors (missing, truncated, not HDF5,
// checksum mismatch, an unsupported type) name the file and the object.
//
// The file is untrusted: it is resolved and checked against the read policy (file_util.h),
// read whole, and its seal checked before libhdf5 parses a byte (from memory: the library
// never opens the path, and what it parses is what the seal covered). A file without a
// seal is refused (INVALID_ARGUMENT), a damaged one is DATA_LOSS. Then soft and external
// links, external storage, virtual datasets and any filter but Fletcher-32 are refused; ranks
// are 1..8, element types float32 or uint8; the declared sizes together must fit in the file's
// size, and every byte must be stored, all before anything is allocated for a dataset. Attributes
// must be scalars.
absl::StatusOr<H5Document> ReadH5File(const std::string& path);

// Only the root group's attributes of `path` (for listings; the seal is checked all the same).
absl::StatusOr<H5Attrs> ReadH5RootAttrs(const std::string& path);

// For `topiary seal` only: reads a file without a seal (libhdf5 parses it unchecked: never
// in the daemon), then rewrites it sealed, in place.
absl::StatusOr<H5Document> ReadUnsealedH5File(const std::string& path);
absl::Status SealH5File(const std::string& path);

// Writes the seal of `path` as it is, whose first 512 bytes are a reserved HDF5 user block
// (H5Pset_userblock), without parsing it: for test tools that make damaged and hostile files
// through libhdf5 itself, so that readers' deeper checks are reached.
absl::Status WriteH5Seal(const std::string& path);

// A canonical text of every group and dataset path, dataset type and shape, and attribute
// (sorted by name; the root attribute `skip_root_attr` left out), which a checksum over
// metadata covers (docs/checkpoint-format.md gives the grammar).
std::string MetadataText(const H5Document& doc, const std::string& skip_root_attr);

// Attribute accessors with a default when absent or of another type.
int64_t AttrInt(const H5Attrs& attrs, const std::string& name, int64_t fallback = 0);
double AttrDouble(const H5Attrs& attrs, const std::string& name, double fallback = 0);
std::string AttrString(const H5Attrs& attrs, const std::string& name,
                       const std::string& fallback = "");

}  // namespace topiary

#endif  // TOPIARY_TRAINER_STORE_HDF5_FILE_H_
