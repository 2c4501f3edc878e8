#include "trainer/store/hdf5_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "kernels/runtime/parallel.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// The seal (docs/checkpoint-format.md): HDF5's user block, the first kSealBytes of the file,
// which libhdf5 skips, holds "topiary-seal 1\nbytes N\ncrc32 XXXXXXXX\n" (zero padded) for
// the N bytes after it (zlib's CRC-32). A reader checks it before libhdf5 parses anything:
// the library crashes on some damaged metadata, and the daemon must not.
constexpr size_t kSealBytes = 512;
constexpr char kSealMagic[] = "topiary-seal 1\n";
constexpr char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";

bool Hdf5SignatureAt(const std::string& bytes, size_t at) {
  return bytes.size() >= at + 8 && bytes.compare(at, 8, kHdf5Signature, 8) == 0;
}

uint32_t Crc32Of(const char* data, size_t n) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  return static_cast<uint32_t>(crc32_z(crc, reinterpret_cast<const Bytef*>(data), n));
}

std::string SealText(uint64_t n, uint32_t crc) {
  std::string text = absl::StrFormat("%sbytes %d\ncrc32 %08x\n", kSealMagic, n, crc);
  text.resize(kSealBytes, '\0');
  return text;
}

absl::Status CheckSeal(const std::string& path, const std::string& bytes) {
  const bool has_magic = bytes.rfind(kSealMagic, 0) == 0;
  if (!has_magic || bytes.size() < kSealBytes) {
    if (Hdf5SignatureAt(bytes, 0) || Hdf5SignatureAt(bytes, kSealBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": an HDF5 file without Topiary's seal (its whole-file checksum): written by "
          "another tool or a Topiary before 0.9; `topiary seal FILE` adds one"));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an HDF5 file"));
  }
  const uint64_t held = bytes.size() - kSealBytes;
  const std::string header = bytes.substr(0, kSealBytes);
  uint64_t declared = 0;
  unsigned int crc = 0;
  if (std::sscanf(header.c_str() + sizeof(kSealMagic) - 1, "bytes %lu\ncrc32 %8x\n", &declared,
                  &crc) != 2 ||
      header != SealText(declared, crc)) {
    return absl::DataLossError(absl::StrCat(path, ": its seal is damaged"));
  }
  if (declared != held) {
    return absl::DataLossError(absl::StrCat(path, ": truncated or extended: its seal counts ",
                                            declared, " bytes after it, the file holds ", held));
  }
  if (Crc32Of(bytes.data() + kSealBytes, held) != crc) {
    return absl::DataLossError(
        absl::StrCat(path, ": whole-file checksum mismatch (the file is damaged)"));
  }
  return absl::OkStatus();
}

absl::Mutex& Hdf5Lock() {
  static absl::Mutex* m = new absl::Mutex;
  return *m;
}

// HDF5 prints its error stack to stderr by default; errors become Statuses here instead.
void SilenceHdf5() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

// The innermost message of HDF5's current error stack, e.g. "data error detected by
// Fletcher32 checksum".
std::string Hdf5Error() {
  std::string last;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e->desc != nullptr) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &last);
  H5Eclear2(H5E_DEFAULT);
  return last.empty() ? "HDF5 error" : last;
}

// Closes an HDF5 handle of any kind when it goes out of scope.
class Handle {
 public:
  explicit Handle(hid_t id = -1) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  void reset(hid_t id) {
    if (id_ >= 0) H5Idec_ref(id_);
    id_ = id;
  }
  ~Handle() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
};

absl::Status Fail(const std::string& file, const std::string& what) {
  return absl::DataLossError(absl::StrCat(file, ": ", what, " (", Hdf5Error(), ")"));
}

// Fletcher-32 exactly as HDF5's checksum filter computes it: 16-bit big-endian words (an odd
// last byte is the high byte of a word), both sums modulo 65535 in ones'-complement form (a
// non-zero sum that is a multiple of 65535 reads 0xffff, not 0), sum2 in the high half.
// Computing it here lets chunks be written and read directly (H5Dwrite_chunk /
// H5Dread_chunk), bypassing HDF5's filter pipeline copies, and checked in parallel; the
// files are the same as the filter's, so h5py and h5dump verify them as usual.
uint32_t Fletcher32(const uint8_t* data, size_t bytes) {
  uint64_t a = 0, b = 0;
  bool nonzero = false;
  size_t i = 0;
  while (i + 8 <= bytes) {
    // Blocks of up to 4096 words: a < 2^29 and b < 2^41, far from overflowing.
    const size_t end = i + std::min<size_t>((bytes - i) / 8, 1024) * 8;
    for (; i < end; i += 8) {
      uint64_t x;
      std::memcpy(&x, data + i, 8);
      const uint64_t y = __builtin_bswap64(x);  // words w0 w1 w2 w3, w0 in the top bits
      const uint64_t w0 = y >> 48, w1 = (y >> 32) & 0xffff, w2 = (y >> 16) & 0xffff,
                     w3 = y & 0xffff;
      b += 4 * a + 4 * w0 + 3 * w1 + 2 * w2 + w3;
      a += w0 + w1 + w2 + w3;
    }
    nonzero = nonzero || a != 0;
    a %= 65535;
    b %= 65535;
  }
  for (; i + 2 <= bytes; i += 2) {
    a += (static_cast<uint32_t>(data[i]) << 8) | data[i + 1];
    b += a;
  }
  if (i < bytes) {  // an odd last byte is the high byte of a word
    a += static_cast<uint32_t>(data[i]) << 8;
    b += a;
  }
  nonzero = nonzero || a != 0;
  a %= 65535;
  b %= 65535;
  if (nonzero) {
    if (a == 0) a = 0xffff;
    if (b == 0) b = 0xffff;
  }
  return static_cast<uint32_t>(b << 16 | a);
}

// Datasets up to this size are one chunk (HDF5's limit is 4 GiB per chunk).
constexpr size_t kMaxSingleChunkBytes = size_t{1} << 31;

absl::Status WriteAttrs(hid_t obj, const H5Attrs& attrs, const std::string& file,
                        const std::string& where) {
  // Strings are variable-length UTF-8, which h5py returns as str.
  Handle string_type(H5Tcopy(H5T_C_S1));
  H5Tset_size(string_type.get(), H5T_VARIABLE);
  H5Tset_cset(string_type.get(), H5T_CSET_UTF8);
  for (const auto& [name, value] : attrs) {
    Handle space(H5Screate(H5S_SCALAR));
    hid_t type = -1;
    const void* data = nullptr;
    const char* text = nullptr;
    if (const auto* i = std::get_if<int64_t>(&value)) {
      type = H5T_NATIVE_INT64;
      data = i;
    } else if (const auto* d = std::get_if<double>(&value)) {
      type = H5T_NATIVE_DOUBLE;
      data = d;
    } else {
      type = string_type.get();
      text = std::get<std::string>(value).c_str();
      data = &text;
    }
    Handle attr(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!attr.ok() || H5Awrite(attr.get(), type, data) < 0) {
      return Fail(file, absl::StrCat("cannot write attribute ", where, "@", name));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteDocument(hid_t file_id, const H5Document& doc, const std::string& file) {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  for (const auto& [path, attrs] : doc.groups) {
    Handle group(path == "/"
                     ? H5Gopen2(file_id, "/", H5P_DEFAULT)
                     : H5Gcreate2(file_id, path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!group.ok()) return Fail(file, "cannot create group " + path);
    if (auto st = WriteAttrs(group.get(), attrs, file, path); !st.ok()) return st;
  }
  // Checksums of the single-chunk datasets, computed in parallel up front.
  std::vector<const std::pair<const std::string, H5Dataset>*> entries;
  for (const auto& entry : doc.datasets) entries.push_back(&entry);
  auto bytes_of = [](const H5Dataset& d) {
    return d.f32.empty() ? d.u8.size() : d.f32.size() * sizeof(float);
  };
  auto data_of = [](const H5Dataset& d) {
    return d.f32.empty() ? d.u8.data() : reinterpret_cast<const uint8_t*>(d.f32.data());
  };
  std::vector<uint32_t> checksums(entries.size());
  kernels::ParallelFor(static_cast<int64_t>(entries.size()), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const H5Dataset& d = entries[i]->second;
      if (bytes_of(d) <= kMaxSingleChunkBytes) checksums[i] = Fletcher32(data_of(d), bytes_of(d));
    }
  });
  std::vector<uint8_t> chunk_buffer;
  for (size_t index = 0; index < entries.size(); ++index) {
    const std::string& path = entries[index]->first;
    const H5Dataset& d = entries[index]->second;
    const bool is_float = !d.f32.empty();
    std::vector<hsize_t> dims(d.shape.begin(), d.shape.end());
    if (dims.empty() || d.count() == 0 || d.count() != (is_float ? d.f32.size() : d.u8.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": dataset ", path, " is empty or its shape does not match"));
    }
    const size_t bytes = bytes_of(d);
    const bool single_chunk = bytes <= kMaxSingleChunkBytes;
    Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    // The checksum filter needs chunked storage. One chunk per dataset when it fits; else
    // chunks of whole rows of the first dimension (written through the filter pipeline).
    std::vector<hsize_t> chunk = dims;
    if (!single_chunk) {
      size_t row_bytes = is_float ? 4 : 1;
      for (size_t i = 1; i < dims.size(); ++i) row_bytes *= dims[i];
      chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (64u << 20) / row_bytes));
    }
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    H5Pset_fletcher32(dcpl.get());
    const hid_t file_type = is_float ? H5T_IEEE_F32LE : H5T_STD_U8LE;
    const hid_t mem_type = is_float ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT8;
    Handle ds(H5Dcreate2(file_id, path.c_str(), file_type, space.get(), lcpl.get(), dcpl.get(),
                         H5P_DEFAULT));
    if (!ds.ok()) return Fail(file, "cannot create dataset " + path);
    herr_t rc;
    if (single_chunk) {
      // The chunk as the filter would store it: the data, then the checksum little-endian.
      chunk_buffer.resize(bytes + 4);
      std::memcpy(chunk_buffer.data(), data_of(d), bytes);
      for (int i = 0; i < 4; ++i) chunk_buffer[bytes + i] = (checksums[index] >> (8 * i)) & 0xff;
      const std::vector<hsize_t> origin(dims.size(), 0);
      rc = H5Dwrite_chunk(ds.get(), H5P_DEFAULT, 0, origin.data(), chunk_buffer.size(),
                          chunk_buffer.data());
    } else {
      rc = H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data_of(d));
    }
    if (rc < 0) return Fail(file, "cannot write dataset " + path);
    if (auto st = WriteAttrs(ds.get(), d.attrs, file, path); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// Computes and writes the seal of the closed file `path`, whose first kSealBytes are its
// (reserved) user block.
absl::Status WriteSeal(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, path + ": cannot open to seal");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < kSealBytes) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": not a file with a user block to seal"));
  }
  uLong crc = crc32_z(0L, Z_NULL, 0);
  std::vector<char> buf(size_t{8} << 20);
  uint64_t total = 0;
  for (off_t at = kSealBytes;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return ErrnoStatus(errno, path + ": read failed while sealing");
    }
    if (n == 0) break;
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<size_t>(n));
    at += n;
    total += static_cast<uint64_t>(n);
  }
  const std::string seal = SealText(total, static_cast<uint32_t>(crc));
  const bool ok = ::pwrite(fd, seal.data(), seal.size(), 0) == static_cast<ssize_t>(seal.size());
  const int err = errno;
  ::close(fd);
  return ok ? absl::OkStatus() : ErrnoStatus(err, path + ": cannot write the seal");
}

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return absl::InternalError(absl::StrCat(path, ": cannot open to sync"));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat(path, ": fsync failed"));
  return absl::OkStatus();
}

// Largest fixed-length string attribute read (specs and metrics are far smaller).
constexpr size_t kMaxAttrStringBytes = size_t{16} << 20;

absl::StatusOr<H5Attr> ReadAttr(hid_t attr) {
  Handle space(H5Aget_space(attr));
  if (!space.ok() || H5Sget_simple_extent_npoints(space.get()) != 1) {
    return absl::DataLossError("not a single value (attributes here are scalars)");
  }
  Handle type(H5Aget_type(attr));
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: {
      int64_t v = 0;
      if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0) break;
      return H5Attr(v);
    }
    case H5T_FLOAT: {
      double v = 0;
      if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v) < 0) break;
      return H5Attr(v);
    }
    case H5T_STRING: {
      if (H5Tis_variable_str(type.get()) > 0) {
        char* text = nullptr;
        Handle mem(H5Tcopy(H5T_C_S1));
        H5Tset_size(mem.get(), H5T_VARIABLE);
        H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
        if (H5Aread(attr, mem.get(), &text) < 0) break;
        std::string s = text ? text : "";
        H5free_memory(text);
        return H5Attr(s);
      }
      const size_t size = H5Tget_size(type.get());
      if (size == 0 || size > kMaxAttrStringBytes) {
        return absl::DataLossError(absl::StrCat("a string of ", size, " bytes"));
      }
      std::string s(size, '\0');
      if (H5Aread(attr, type.get(), s.data()) < 0) break;
      s.resize(s.find('\0') == std::string::npos ? s.size() : s.find('\0'));
      return H5Attr(s);
    }
    default:
      return absl::UnimplementedError("unsupported attribute type");
  }
  return absl::DataLossError(Hdf5Error());
}

absl::Status ReadAttrs(hid_t obj, H5Attrs* out) {
  struct Ctx {
    H5Attrs* out;
    absl::Status status;
  } ctx{out, absl::OkStatus()};
  H5Aiterate2(
      obj, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t loc, const char* name, const H5A_info_t*, void* p) -> herr_t {
        auto* c = static_cast<Ctx*>(p);
        Handle attr(H5Aopen(loc, name, H5P_DEFAULT));
        absl::StatusOr<H5Attr> v = absl::DataLossError("unreadable");
        try {  // no exception may unwind through HDF5's C frames
          v = attr.ok() ? ReadAttr(attr.get()) : absl::DataLossError(Hdf5Error());
        } catch (const std::exception& e) {
          v = absl::ResourceExhaustedError(e.what());
        }
        if (!v.ok()) {
          c->status = absl::Status(v.status().code(),
                                   absl::StrCat("attribute ", name, ": ", v.status().message()));
          return -1;
        }
        (*c->out)[name] = *v;
        return 0;
      },
      &ctx);
  return ctx.status;
}

// A chunk read raw whose checksum is still to be checked.
struct PendingCheck {
  std::string path;
  const uint8_t* data;
  size_t bytes;
  uint32_t stored;
};

// True when `ds` is stored the way WriteH5File stores it: one chunk covering the dataset,
// Fletcher-32 as its only filter. Such datasets are read raw and checked here.
bool IsSingleChecksummedChunk(hid_t ds, const std::vector<hsize_t>& dims) {
  Handle dcpl(H5Dget_create_plist(ds));
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED || H5Pget_nfilters(dcpl.get()) != 1) return false;
  unsigned flags = 0, values[8];
  size_t nvalues = 8;
  char name[64];
  unsigned config = 0;
  if (H5Pget_filter2(dcpl.get(), 0, &flags, &nvalues, values, sizeof(name), name, &config) !=
      H5Z_FILTER_FLETCHER32) {
    return false;
  }
  std::vector<hsize_t> chunk(dims.size());
  if (H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) !=
      static_cast<int>(dims.size())) {
    return false;
  }
  return chunk == dims;
}

// Checks a dataset's declaration before anything is allocated for it: rank, element type,
// storage (no external files, no virtual datasets, no filter but Fletcher-32, so nothing
// inflates), a size that the file can actually hold, and data that is really stored. `budget`
// is what the file's size leaves for datasets not yet read.
absl::Status CheckDatasetDeclaration(hid_t ds, const std::vector<hsize_t>& dims, bool is_u8,
                                     uint64_t* budget) {
  Handle dcpl(H5Dget_create_plist(ds));
  if (!dcpl.ok()) return absl::DataLossError("no creation properties");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT) {
    return absl::DataLossError("virtual or unknown storage layout (refused)");
  }
  if (H5Pget_external_count(dcpl.get()) != 0) {
    return absl::PermissionDeniedError("stored in external files (never followed)");
  }
  const int filters = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, values[8];
    size_t nvalues = 8;
    char name[64];
    unsigned config = 0;
    const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nvalues,
                                          values, sizeof(name), name, &config);
    if (f != H5Z_FILTER_FLETCHER32) {
      return absl::DataLossError(
          absl::StrCat("filter ", static_cast<int>(f), " (only Fletcher-32 is read)"));
    }
  }
  uint64_t count = 1;
  for (hsize_t d : dims) {
    if (d == 0) return absl::DataLossError("an empty dimension");
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) {
      return absl::ResourceExhaustedError("a shape whose size overflows");
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, uint64_t{is_u8 ? 1u : 4u}, &bytes) || bytes > *budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "declares ", count, " elements, more than the file's remaining ", *budget, " bytes hold"));
  }
  // Unwritten data would read as fill values: every byte must be stored in the file.
  if (H5Dget_storage_size(ds) < bytes) {
    return absl::DataLossError(absl::StrCat("declares ", bytes, " bytes but stores ",
                                            H5Dget_storage_size(ds), " (unwritten or damaged)"));
  }
  *budget -= bytes;
  return absl::OkStatus();
}

constexpr int kMaxRank = 8;

absl::Status ReadDataset(hid_t ds, const std::string& path, H5Dataset* out,
                         std::vector<PendingCheck>* checks, uint64_t* budget) {
  Handle space(H5Dget_space(ds));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank <= 0 || rank > kMaxRank) {
    return absl::DataLossError(
        absl::StrCat(path, ": rank ", rank, ", not an array of 1 to ", kMaxRank, " dimensions"));
  }
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  Handle type(H5Dget_type(ds));
  const H5T_class_t cls = H5Tget_class(type.get());
  const bool is_float =
      cls == H5T_FLOAT && H5Tget_size(type.get()) == 4 && H5Tget_order(type.get()) == H5T_ORDER_LE;
  const bool is_u8 =
      cls == H5T_INTEGER && H5Tget_size(type.get()) == 1 && H5Tget_sign(type.get()) == H5T_SGN_NONE;
  if (!is_float && !is_u8) {
    return absl::DataLossError(absl::StrCat(path, ": element type of class ", static_cast<int>(cls),
                                            " and ", H5Tget_size(type.get()),
                                            " bytes; only float32 and uint8 are read"));
  }
  if (auto st = CheckDatasetDeclaration(ds, dims, is_u8, budget); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  }
  out->shape.assign(dims.begin(), dims.end());
  const size_t bytes = out->count() * (is_u8 ? 1 : 4);
  if (IsSingleChecksummedChunk(ds, dims)) {
    const std::vector<hsize_t> origin(dims.size(), 0);
    hsize_t stored = 0;
    if (H5Dget_chunk_storage_size(ds, origin.data(), &stored) < 0 || stored != bytes + 4) {
      return absl::DataLossError(absl::StrCat(path, ": chunk of the wrong size (damaged?)"));
    }
    // Read the chunk and its checksum in place: one extra element holds the 4 bytes.
    uint8_t* raw;
    if (is_float) {
      out->f32.resize(out->count() + 1);
      raw = reinterpret_cast<uint8_t*>(out->f32.data());
    } else {
      out->u8.resize(bytes + 4);
      raw = out->u8.data();
    }
    uint32_t filter_mask = 0;
    if (H5Dread_chunk(ds, H5P_DEFAULT, origin.data(), &filter_mask, raw) < 0) {
      return absl::DataLossError(absl::StrCat(path, ": ", Hdf5Error()));
    }
    if (filter_mask != 0) {
      return absl::DataLossError(absl::StrCat(path, ": chunk stored without its checksum"));
    }
    uint32_t checksum = 0;
    for (int i = 0; i < 4; ++i) checksum |= static_cast<uint32_t>(raw[bytes + i]) << (8 * i);
    if (is_float) {
      out->f32.pop_back();
    } else {
      out->u8.resize(bytes);
    }
    checks->push_back({path, raw, bytes, checksum});
  } else {
    herr_t rc;
    if (is_u8) {
      out->u8.resize(out->count());
      rc = H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->u8.data());
    } else {
      out->f32.resize(out->count());
      rc = H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->f32.data());
    }
    if (rc < 0) return absl::DataLossError(absl::StrCat(path, ": ", Hdf5Error()));
  }
  return ReadAttrs(ds, &out->attrs);
}

}  // namespace

size_t H5Dataset::count() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

absl::Status WriteH5File(const std::string& path, const H5Document& doc, WriteMode mode) {
  absl::MutexLock lock(&Hdf5Lock());
  SilenceHdf5();
  // Made fresh (H5F_ACC_EXCL after removing a stale one: a planted link is not followed),
  // in a folder the write roots allow (file_util.h).
  TOPIARY_RETURN_IF_ERROR(CheckWritable(path));
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  TOPIARY_RETURN_IF_ERROR(CheckWritable(tmp));
  ::unlink(tmp.c_str());
  absl::Status status = [&] {
    Handle fcpl(H5Pcreate(H5P_FILE_CREATE));
    if (!fcpl.ok() || H5Pset_userblock(fcpl.get(), kSealBytes) < 0) {
      return Fail(path, "cannot reserve the seal's user block");
    }
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, fcpl.get(), H5P_DEFAULT));
    if (!file.ok()) return Fail(path, "cannot create " + tmp);
    absl::Status st = WriteDocument(file.get(), doc, path);
    if (st.ok() && H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) st = Fail(path, "flush");
    return st;
  }();
  if (status.ok()) status = WriteSeal(tmp);
  if (status.ok()) status = SyncPath(tmp, O_RDONLY);
  if (status.ok() && mode == WriteMode::kCreate) {
    // link() fails when the name exists, whoever made it since the caller looked.
    if (::link(tmp.c_str(), path.c_str()) != 0) {
      status = errno == EEXIST ? absl::AlreadyExistsError(
                                     absl::StrCat(path,
                                                  ": exists (made while this file was written?); "
                                                  "nothing was replaced"))
                               : ErrnoStatus(errno, absl::StrCat(path, ": cannot link ", tmp));
    }
    ::unlink(tmp.c_str());
  } else if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(absl::StrCat(path, ": cannot rename ", tmp, " into place"));
  }
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (!status.ok()) {
    std::remove(tmp.c_str());
    // HDF5 reports a full disk as a failed write; say what it is (and with the code for it).
    struct statvfs fs;
    if (!absl::IsAlreadyExists(status) && ::statvfs(folder.c_str(), &fs) == 0 &&
        static_cast<uint64_t>(fs.f_bavail) * fs.f_bsize < (uint64_t{1} << 20)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": cannot write it: the disk is full (", status.message(), ")"));
    }
    return status;
  }
  return SyncPath(folder, O_RDONLY | O_DIRECTORY);
}

namespace {

// libhdf5's core driver reading `bytes` in place, read-only: the image callbacks hand the
// library our buffer wherever it would allocate and copy one, and free nothing (the hl
// library's H5LTopen_file_image does the same but leaks its bookkeeping on every open).
hid_t OpenImage(std::string* bytes) {
  H5FD_file_image_callbacks_t callbacks;
  callbacks.image_malloc = [](size_t, H5FD_file_image_op_t, void* udata) -> void* {
    return static_cast<std::string*>(udata)->data();
  };
  callbacks.image_memcpy = [](void* dest, const void* src, size_t size, H5FD_file_image_op_t,
                              void*) -> void* {
    if (dest != src) std::memmove(dest, src, size);  // only ever our buffer onto itself
    return dest;
  };
  callbacks.image_realloc = [](void*, size_t, H5FD_file_image_op_t, void*) -> void* {
    return nullptr;  // read-only: the image never grows
  };
  callbacks.image_free = [](void*, H5FD_file_image_op_t, void*) -> herr_t { return 0; };
  callbacks.udata_copy = [](void* udata) -> void* { return udata; };
  callbacks.udata_free = [](void*) -> herr_t { return 0; };
  callbacks.udata = bytes;
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.ok() || H5Pset_fapl_core(fapl.get(), 1 << 20, /*backing_store=*/0) < 0 ||
      H5Pset_file_image_callbacks(fapl.get(), &callbacks) < 0 ||
      H5Pset_file_image(fapl.get(), bytes->data(), bytes->size()) < 0) {
    return -1;
  }
  return H5Fopen("topiary-image", H5F_ACC_RDONLY, fapl.get());
}

// A file read whole (through the read policy, file_util.h) and opened by libhdf5 from memory:
// what the seal covered is exactly what the library parses (the file cannot change in
// between), and the library never opens the path itself.
struct OpenedFile {
  std::string bytes;  // outlives `file` (members are destroyed in reverse order)
  Handle file;
  uint64_t size() const { return bytes.size(); }  // the budget for what the file declares
};

absl::Status OpenForReading(const std::string& path, bool sealed, OpenedFile* out) {
  TOPIARY_ASSIGN_OR_RETURN(out->bytes, ReadFile(path));
  if (sealed) {
    TOPIARY_RETURN_IF_ERROR(CheckSeal(path, out->bytes));
  } else if (!Hdf5SignatureAt(out->bytes, 0) && !Hdf5SignatureAt(out->bytes, kSealBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an HDF5 file"));
  }
  const hid_t file = OpenImage(&out->bytes);
  if (file < 0) return Fail(path, "cannot open (truncated or damaged?)");
  out->file.reset(file);
  return absl::OkStatus();
}

absl::Status ReadRootAttrs(hid_t file, const std::string& path, H5Attrs* out) {
  Handle root(H5Gopen2(file, "/", H5P_DEFAULT));
  if (auto st = ReadAttrs(root.get(), out); !st.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": /: ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {
// Every group attribute and dataset of `path`; `sealed`: its seal must check first.
absl::StatusOr<H5Document> ReadH5FileChecked(const std::string& path, bool sealed);
}  // namespace

absl::StatusOr<H5Document> ReadH5File(const std::string& path) {
  return ReadH5FileChecked(path, /*sealed=*/true);
}

absl::StatusOr<H5Document> ReadUnsealedH5File(const std::string& path) {
  return ReadH5FileChecked(path, /*sealed=*/false);
}

absl::Status WriteH5Seal(const std::string& path) { return WriteSeal(path); }

absl::Status SealH5File(const std::string& path) {
  TOPIARY_ASSIGN_OR_RETURN(const H5Document doc, ReadUnsealedH5File(path));
  return WriteH5File(path, doc);
}

namespace {

absl::StatusOr<H5Document> ReadH5FileChecked(const std::string& path, bool sealed) {
  absl::MutexLock lock(&Hdf5Lock());
  SilenceHdf5();
  OpenedFile opened;
  TOPIARY_RETURN_IF_ERROR(OpenForReading(path, sealed, &opened));
  const Handle& file = opened.file;
  const uint64_t file_size = opened.size();
  H5Document doc;
  struct Ctx {
    H5Document* doc;
    absl::Status status;
    std::vector<PendingCheck> checks;
    uint64_t budget;
  } ctx{&doc, absl::OkStatus(), {}, file_size};
  if (auto st = ReadRootAttrs(file.get(), path, &doc.groups["/"]); !st.ok()) return st;
  const herr_t rc = H5Lvisit(
      file.get(), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t root, const char* name, const H5L_info_t* info, void* p) -> herr_t {
        auto* c = static_cast<Ctx*>(p);
        const std::string full = absl::StrCat("/", name);
        // Soft and external links could lead anywhere, another file included: never followed.
        if (info->type != H5L_TYPE_HARD) {
          c->status = absl::PermissionDeniedError(
              absl::StrCat(full, ": a ", info->type == H5L_TYPE_EXTERNAL ? "external" : "soft",
                           " link (links are never followed)"));
          return -1;
        }
        Handle obj(H5Oopen(root, name, H5P_DEFAULT));
        if (!obj.ok()) {
          c->status = absl::DataLossError(absl::StrCat(full, ": cannot open (", Hdf5Error(), ")"));
          return -1;
        }
        try {  // no exception may unwind through HDF5's C frames
          const H5I_type_t type = H5Iget_type(obj.get());
          if (type == H5I_GROUP) {
            c->status = ReadAttrs(obj.get(), &c->doc->groups[full]);
          } else if (type == H5I_DATASET) {
            c->status =
                ReadDataset(obj.get(), full, &c->doc->datasets[full], &c->checks, &c->budget);
          }
        } catch (const std::exception& e) {
          c->status = absl::ResourceExhaustedError(absl::StrCat("cannot read: ", e.what()));
        }
        if (!c->status.ok() && c->status.message().find(full) == std::string::npos) {
          c->status = absl::Status(c->status.code(), absl::StrCat(full, ": ", c->status.message()));
        }
        return c->status.ok() ? 0 : -1;
      },
      &ctx);
  if (!ctx.status.ok()) {
    const absl::StatusCode code = ctx.status.code() == absl::StatusCode::kPermissionDenied
                                      ? absl::StatusCode::kPermissionDenied
                                      : absl::StatusCode::kDataLoss;
    return absl::Status(code, absl::StrCat(path, ": ", ctx.status.message()));
  }
  if (rc < 0) return Fail(path, "cannot list the file's objects (truncated or damaged?)");
  // Checksums of the chunks read raw, in parallel (the data stay where they were read: the
  // map's nodes do not move).
  std::vector<char> bad(ctx.checks.size(), 0);
  kernels::ParallelFor(static_cast<int64_t>(ctx.checks.size()), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const PendingCheck& c = ctx.checks[i];
      bad[i] = Fletcher32(c.data, c.bytes) != c.stored;
    }
  });
  for (size_t i = 0; i < bad.size(); ++i) {
    if (bad[i]) {
      return absl::DataLossError(absl::StrCat(path, ": ", ctx.checks[i].path,
                                              ": data error detected by Fletcher32 checksum "
                                              "(the file is corrupted)"));
    }
  }
  return doc;
}

}  // namespace

absl::StatusOr<H5Attrs> ReadH5RootAttrs(const std::string& path) {
  absl::MutexLock lock(&Hdf5Lock());
  SilenceHdf5();
  OpenedFile opened;
  TOPIARY_RETURN_IF_ERROR(OpenForReading(path, /*sealed=*/true, &opened));
  H5Attrs attrs;
  TOPIARY_RETURN_IF_ERROR(ReadRootAttrs(opened.file.get(), path, &attrs));
  return attrs;
}

std::string MetadataText(const H5Document& doc, const std::string& skip_root_attr) {
  std::string out;
  auto attrs = [&](const std::string& where, const H5Attrs& a) {
    for (const auto& [name, value] : a) {
      if (where == "/" && name == skip_root_attr) continue;
      absl::StrAppend(&out, "  ", name, "=");
      if (const auto* i = std::get_if<int64_t>(&value)) {
        absl::StrAppend(&out, "i:", *i, "\n");
      } else if (const auto* d = std::get_if<double>(&value)) {
        absl::StrAppendFormat(&out, "d:%.17g\n", *d);
      } else {
        const std::string& text = std::get<std::string>(value);
        absl::StrAppend(&out, "s:", text.size(), ":", text, "\n");
      }
    }
  };
  for (const auto& [path, a] : doc.groups) {
    if (a.empty()) continue;  // intermediate groups carry nothing (and exist implicitly)
    absl::StrAppend(&out, "G ", path, "\n");
    attrs(path, a);
  }
  for (const auto& [path, d] : doc.datasets) {
    absl::StrAppend(&out, "D ", path, " ", d.u8.empty() ? "f32" : "u8", " ",
                    absl::StrJoin(d.shape, "x"), "\n");
    attrs(path, d.attrs);
  }
  return out;
}

int64_t AttrInt(const H5Attrs& attrs, const std::string& name, int64_t fallback) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return fallback;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return *i;
  return fallback;
}

double AttrDouble(const H5Attrs& attrs, const std::string& name, double fallback) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return fallback;
  if (const auto* d = std::get_if<double>(&it->second)) return *d;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  return fallback;
}

std::string AttrString(const H5Attrs& attrs, const std::string& name, const std::string& fallback) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return fallback;
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  return fallback;
}

}  // namespace topiary
