// TOPIARY_RETURN_IF_ERROR(expr): returns the Status of expr from the enclosing function when
// it is not OK.
#ifndef TOPIARY_KERNELS_STATUS_MACROS_H_
#define TOPIARY_KERNELS_STATUS_MACROS_H_

#include "absl/status/status.h"

#define TOPIARY_RETURN_IF_ERROR(expr)          \
  do {                                         \
    const absl::Status _topiary_st = (expr);   \
    if (!_topiary_st.ok()) return _topiary_st; \
  } while (0)

#endif  // TOPIARY_KERNELS_STATUS_MACROS_H_
