#include "clients/file_commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "clients/progress.h"
#include "clients/text.h"
#include "trainer/util/file_util.h"
#include "trainer/util/sha256.h"

namespace topiary {
namespace {

namespace fs = std::filesystem;
using topiary::v1::FileInfo;

constexpr size_t kChunkBytes = 256 * 1024;  // well under the daemon's 1 MiB per message

// A local file and where it goes (or comes from) in the data directory.
struct Transfer {
  std::string local, remote;
  uint64_t size = 0;
  std::string sha256;
};

int UsageError(const std::string& message) {
  absl::FPrintF(stderr, "topiary: %s\n", message);
  return kExitUsage;
}

// A local failure (a file that cannot be read or written): as a daemon error would be.
int LocalError(const Args& a, grpc::StatusCode code, const std::string& message) {
  return Fail(a, absl::Status(static_cast<absl::StatusCode>(code), message));
}

// Feeds a local file's first `limit` bytes (all of it by default) to `hash`; false when it
// cannot be read.
bool FeedLocal(const std::string& path, Sha256* hash, uint64_t limit = UINT64_MAX) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string buf(1 << 20, '\0');
  while (limit > 0 && in) {
    in.read(buf.data(), std::min<uint64_t>(buf.size(), limit));
    hash->Update(buf.data(), in.gcount());
    limit -= in.gcount();
  }
  return !in.bad();
}

// The SHA-256 of a local file; false when it cannot be read.
bool HashLocal(const std::string& path, std::string* digest) {
  Sha256 h;
  if (!FeedLocal(path, &h)) return false;
  *digest = h.HexDigest();
  return true;
}

// The daemon's files at `remote` (a file, or those under a folder); none when it is not
// there.
grpc::Status RemoteFiles(Connection& c, const std::string& remote, bool sha256,
                         std::vector<FileInfo>* out) {
  topiary::v1::ListFilesRequest req;
  req.set_path(remote);
  req.set_sha256(sha256);
  topiary::v1::ListFilesResponse resp;
  auto ctx = c.Context(/*stream=*/true);  // checksums of a large folder take a while
  grpc::Status st = c.stub().ListFiles(ctx.get(), req, &resp);
  if (st.error_code() == grpc::StatusCode::NOT_FOUND) return grpc::Status::OK;
  out->assign(resp.files().begin(), resp.files().end());
  return st;
}

// The local file, or the files under the local folder (hidden names left out, as the daemon
// refuses them), each with its path under `remote`.
std::vector<Transfer> LocalFiles(const std::string& local, const std::string& remote, int* hidden) {
  std::vector<Transfer> out;
  if (!fs::is_directory(local)) {
    out.push_back({local, remote, static_cast<uint64_t>(fs::file_size(local)), ""});
    return out;
  }
  for (auto it = fs::recursive_directory_iterator(local); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      ++*hidden;
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    const std::string rel = fs::relative(it->path(), local).generic_string();
    out.push_back({it->path().string(), remote + "/" + rel, it->file_size(), ""});
  }
  std::sort(out.begin(), out.end(),
            [](const Transfer& x, const Transfer& y) { return x.remote < y.remote; });
  return out;
}

// Streams `files` to the daemon in one upload.
grpc::Status SendFiles(Connection& c, const std::vector<Transfer>& files,
                       TransferProgress* progress, topiary::v1::UploadSummary* summary) {
  auto ctx = c.Context(/*stream=*/true);
  auto writer = c.stub().UploadFiles(ctx.get(), summary);
  uint64_t sent = 0;
  int done = 0;
  std::string buf(kChunkBytes, '\0');
  for (const Transfer& f : files) {
    topiary::v1::UploadChunk head;
    head.mutable_header()->set_path(f.remote);
    head.mutable_header()->set_size(f.size);
    head.mutable_header()->set_sha256(f.sha256);
    if (!writer->Write(head)) break;  // the daemon ended the call: Finish says why
    std::ifstream in(f.local, std::ios::binary);
    bool open = true;
    while (open && in) {
      in.read(buf.data(), buf.size());
      if (in.gcount() == 0) break;
      topiary::v1::UploadChunk chunk;
      chunk.set_data(buf.data(), in.gcount());
      open = writer->Write(chunk);
      sent += in.gcount();
      progress->Update(done, sent);
    }
    if (!open) break;
    progress->Update(++done, sent);
  }
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace

int UploadCommand(const Args& a, Connection& c) {
  if (a.positional.size() != 2) {
    return UsageError(
        "upload needs LOCAL (a file or folder) and REMOTE (its path in the daemon's data "
        "directory)");
  }
  const std::string local = a.positional[0];
  const std::string remote(absl::StripSuffix(a.positional[1], "/"));
  std::error_code ec;
  if (!fs::exists(local, ec)) {
    return LocalError(a, grpc::StatusCode::NOT_FOUND, local + ": no such file or folder");
  }
  int hidden = 0;
  std::vector<Transfer> files;
  try {
    files = LocalFiles(local, remote, &hidden);
  } catch (const fs::filesystem_error& e) {
    return LocalError(a, grpc::StatusCode::PERMISSION_DENIED, e.what());
  }
  std::vector<FileInfo> there;
  if (grpc::Status st = RemoteFiles(c, remote, /*sha256=*/true, &there); !st.ok()) {
    return Report(a, c, st);
  }
  std::map<std::string, std::string> there_sha;
  for (const FileInfo& f : there) there_sha[f.path()] = f.sha256();
  std::vector<Transfer> to_send;
  std::vector<std::string> conflicts;
  uint64_t total = 0;
  int same = 0;
  for (Transfer& f : files) {
    if (!HashLocal(f.local, &f.sha256)) {
      return LocalError(a, grpc::StatusCode::NOT_FOUND, f.local + ": cannot be read");
    }
    const auto it = there_sha.find(f.remote);
    if (it == there_sha.end()) {
      total += f.size;
      to_send.push_back(f);
    } else if (it->second == f.sha256) {
      ++same;  // sent before (an upload run again after a failure)
    } else {
      conflicts.push_back(f.remote);
    }
  }
  if (!conflicts.empty()) {
    conflicts.resize(std::min<size_t>(conflicts.size(), 5));
    return LocalError(
        a, grpc::StatusCode::ALREADY_EXISTS,
        absl::StrCat("the data directory already has ", conflicts.size() > 1 ? "" : "a ",
                     "different ", absl::StrJoin(conflicts, ", "),
                     "; uploads never replace a file: choose another REMOTE "
                     "path (nothing was sent)"));
  }
  TransferProgress progress(stderr, !a.json && isatty(STDERR_FILENO), "upload",
                            static_cast<int>(to_send.size()), total);
  topiary::v1::UploadSummary summary;
  if (!to_send.empty()) {
    if (grpc::Status st = SendFiles(c, to_send, &progress, &summary); !st.ok()) {
      return Report(a, c, st);
    }
  }
  if (a.json) {
    absl::PrintF("{\"path\":%s,\"uploaded\":%d,\"already_there\":%d,\"bytes\":%d}\n",
                 JsonString(remote), summary.files_size(), same, summary.bytes());
    return kExitOk;
  }
  std::string note = same > 0 ? absl::StrCat("; ", same, " already there") : "";
  if (hidden > 0) absl::StrAppend(&note, "; ", hidden, " hidden name(s) left out");
  progress.Done(absl::StrFormat("uploaded %d file(s), %s, to %s%s", summary.files_size(),
                                HumanBytes(summary.bytes()), remote, note));
  return kExitOk;
}

namespace {

// Fetches one file into `dest` through dest.part, continuing a part left by a broken
// download; the whole file's checksum is checked before it is renamed into place.
grpc::Status FetchFile(Connection& c, const FileInfo& remote, const std::string& dest,
                       TransferProgress* progress, int done, uint64_t* moved) {
  const std::string part = dest + ".part";
  std::error_code ec;
  fs::create_directories(fs::path(dest).parent_path().empty() ? "." : fs::path(dest).parent_path(),
                         ec);
  uint64_t offset = fs::exists(part, ec) ? fs::file_size(part, ec) : 0;
  if (offset > static_cast<uint64_t>(remote.size())) offset = 0;  // not this file's part
  Sha256 hash;  // the part's bytes count in the checksum
  if (offset > 0 && !FeedLocal(part, &hash, offset)) {
    offset = 0;  // an unreadable part is written again
    hash = Sha256();
  }
  std::ofstream out(
      part, offset > 0 ? std::ios::binary | std::ios::app : std::ios::binary | std::ios::trunc);
  if (!out) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, part + ": cannot be written");
  topiary::v1::DownloadFileRequest req;
  req.set_path(remote.path());
  req.set_offset(offset);
  auto ctx = c.Context(/*stream=*/true);
  auto reader = c.stub().DownloadFile(ctx.get(), req);
  topiary::v1::FileChunk chunk;
  std::string expected;
  *moved += offset;
  while (reader->Read(&chunk)) {
    if (chunk.has_info()) expected = chunk.info().sha256();
    out.write(chunk.data().data(), chunk.data().size());
    hash.Update(chunk.data().data(), chunk.data().size());
    *moved += chunk.data().size();
    progress->Update(done, *moved);
  }
  grpc::Status st = reader->Finish();
  out.close();
  if (!st.ok()) return st;  // the part stays: run download again to continue it
  if (!out) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, part + ": write failed");
  if (hash.HexDigest() != expected) {
    fs::remove(part, ec);
    return grpc::Status(grpc::StatusCode::DATA_LOSS,
                        absl::StrCat(remote.path(), ": what arrived has SHA-256 ", hash.HexDigest(),
                                     ", the daemon's file ", expected,
                                     " (it changed meanwhile?); run download again"));
  }
  fs::rename(part, dest, ec);
  if (ec) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, dest + ": " + ec.message());
  return grpc::Status::OK;
}

// Fetches the daemon's `remote` (a file or folder) to `local`.
int DownloadPath(const Args& a, Connection& c, const std::string& remote_in,
                 const std::string& local) {
  const std::string remote(absl::StripSuffix(remote_in, "/"));
  std::vector<FileInfo> files;
  if (grpc::Status st = RemoteFiles(c, remote, /*sha256=*/true, &files); !st.ok()) {
    return Report(a, c, st);
  }
  if (files.empty()) {
    return Report(a, c,
                  grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("path: '", remote, "': no file there")));
  }
  const bool single = files.size() == 1 && files[0].path() == remote;
  std::vector<std::pair<FileInfo, std::string>> to_fetch;
  uint64_t total = 0;
  int same = 0;
  for (const FileInfo& f : files) {
    const std::string dest = single ? local : local + f.path().substr(remote.size());
    std::string digest;
    std::error_code ec;
    if (fs::exists(dest, ec)) {
      if (HashLocal(dest, &digest) && digest == f.sha256()) {
        ++same;
        continue;
      }
      return LocalError(a, grpc::StatusCode::ALREADY_EXISTS,
                        dest +
                            " exists with other content; not replaced (move it away, or "
                            "name another LOCAL path)");
    }
    total += f.size();
    to_fetch.push_back({f, dest});
  }
  TransferProgress progress(stderr, !a.json && isatty(STDERR_FILENO), "download",
                            static_cast<int>(to_fetch.size()), total);
  uint64_t moved = 0;
  int done = 0;
  for (const auto& [f, dest] : to_fetch) {
    if (grpc::Status st = FetchFile(c, f, dest, &progress, done, &moved); !st.ok()) {
      return Report(a, c, st);
    }
    ++done;
  }
  if (a.json) {
    absl::PrintF("{\"path\":%s,\"downloaded\":%d,\"already_there\":%d,\"bytes\":%d}\n",
                 JsonString(local), done, same, total);
    return kExitOk;
  }
  progress.Done(absl::StrFormat("downloaded %d file(s), %s, to %s%s", done, HumanBytes(total),
                                local, same > 0 ? absl::StrCat("; ", same, " already there") : ""));
  return kExitOk;
}

}  // namespace

int DownloadCommand(const Args& a, Connection& c) {
  if (a.positional.empty() || a.positional.size() > 2) {
    return UsageError(
        "download needs REMOTE (a path in the daemon's data directory) and optionally LOCAL");
  }
  const std::string remote(absl::StripSuffix(a.positional[0], "/"));
  const std::string local =
      a.positional.size() == 2 ? a.positional[1] : fs::path(remote).filename().string();
  return DownloadPath(a, c, remote, local);
}

int FilesCommand(const Args& a, Connection& c) {
  if (a.positional.size() > 1) return UsageError("files takes at most one REMOTE path");
  topiary::v1::ListFilesRequest req;
  if (!a.positional.empty()) req.set_path(std::string(absl::StripSuffix(a.positional[0], "/")));
  req.set_sha256(a.sha256);
  topiary::v1::ListFilesResponse resp;
  auto ctx = c.Context(/*stream=*/true);
  const grpc::Status st = c.stub().ListFiles(ctx.get(), req, &resp);
  if (!st.ok()) return Report(a, c, st);
  if (a.json) {
    absl::PrintF("%s\n", ScriptJson(resp));
    return kExitOk;
  }
  MakePrintable(&resp);
  for (const FileInfo& f : resp.files()) {
    absl::PrintF("%10s  %s  %s%s\n", HumanBytes(f.size()), f.modified_at(), f.path(),
                 f.sha256().empty() ? "" : "  " + f.sha256());
  }
  return kExitOk;
}

}  // namespace topiary
