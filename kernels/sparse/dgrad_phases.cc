#include "kernels/sparse/dgrad_phases.h"

namespace topiary::kernels {
namespace {

// One side (rows or columns) of a phase: dx positions `extent`, filter taps `taps` from
// `first`, lower padding `lo` and upper padding `hi`.
struct Side {
  int extent = 0, first = 0, taps = 0, lo = 0, hi = 0;
};

Side PhaseSide(int residue, int size, int filter, int stride, int pad, int out) {
  Side side;
  side.extent = residue < size ? (size - residue + stride - 1) / stride : 0;
  side.first = (residue + pad) % stride;
  side.taps = side.first < filter ? (filter - side.first + stride - 1) / stride : 0;
  side.lo = (residue + pad - side.first) / stride;
  side.hi = out - side.extent - side.lo + side.taps - 1;
  return side;
}

}  // namespace

std::vector<DgradPhase> DgradPhases(const ConvShape& s) {
  std::vector<DgradPhase> phases;
  for (int ph = 0; ph < s.stride_h; ++ph) {
    const Side rows = PhaseSide(ph, s.h, s.r, s.stride_h, s.pad_h, s.ho());
    for (int pw = 0; pw < s.stride_w; ++pw) {
      const Side cols = PhaseSide(pw, s.w, s.s, s.stride_w, s.pad_w, s.wo());
      DgradPhase p;
      p.ph = ph;
      p.pw = pw;
      p.r0 = rows.first;
      p.s0 = cols.first;
      p.shape = s;
      p.shape.h = rows.extent;
      p.shape.w = cols.extent;
      p.shape.r = rows.taps;
      p.shape.s = cols.taps;
      p.shape.stride_h = p.shape.stride_w = 1;
      p.shape.pad_h = rows.lo;
      p.shape.pad_w = cols.lo;
      p.pad_h_hi = rows.hi;
      p.pad_w_hi = cols.hi;
      phases.push_back(p);
    }
  }
  return phases;
}

}  // namespace topiary::kernels
