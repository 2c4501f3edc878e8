#include "trainer/approx/multiplier_info.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

namespace topiary {

topiary::v1::MultiplierInfo DescribeMultiplier(const Multiplier& m) {
  const MultiplierMetrics x = ComputeMetrics(m.table);
  topiary::v1::MultiplierInfo info;
  info.set_name(m.name);
  info.set_source(m.source);
  info.set_sha256(m.sha256);
  info.set_mae(x.mae);
  info.set_mae_pct(x.mae_pct);
  info.set_wce(x.wce);
  info.set_wce_pct(x.wce_pct);
  info.set_ep_pct(x.ep_pct);
  info.set_mre_pct(x.mre_pct);
  info.set_mse(x.mse);
  if (m.known) {
    info.set_power_mw(m.known->power_mw);
    info.set_area_um2(m.known->area_um2);
    info.set_known_circuit(m.known->name);
  }
  return info;
}

std::vector<topiary::v1::MultiplierInfo> ListMultiplierFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // symlink_status: a link is listed as a link, never followed out of the folder.
    const fs::file_status st = it->symlink_status(ec);
    if (ec || !fs::is_regular_file(st) || it->path().extension() != ".bin") continue;
    files.push_back(it->path());
    if (static_cast<int>(files.size()) >= kMaxListedMultipliers) break;
  }
  std::sort(files.begin(), files.end());
  std::vector<topiary::v1::MultiplierInfo> out;
  for (const fs::path& f : files) {
    auto m = LoadMultiplier(f.string());
    if (m.ok()) {
      out.push_back(DescribeMultiplier(*m));
    } else {
      topiary::v1::MultiplierInfo bad;
      bad.set_name(f.stem().string());
      bad.set_source(f.string());
      bad.set_error(std::string(m.status().message()));
      out.push_back(std::move(bad));
    }
  }
  return out;
}

}  // namespace topiary
