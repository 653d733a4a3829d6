// Argument checks shared by the op dispatchers: each failure names the op and the tensor.
#pragma once

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::ops::detail {

// t has `ndim` dims, dtype `dt`, a unit last stride and non-negative sizes.
inline void check_matrix(const char* op, const char* name, const Tensor& t, int ndim, DType dt) {
  KILN_CHECK(t.ndim == ndim, op, ": ", name, " must have ", ndim, " dims, got ", t.describe());
  KILN_CHECK(t.dtype == dt, op, ": ", name, " must be ", dtype_name(dt), ", got ", t.describe());
  KILN_CHECK(t.numel() == 0 || t.data != nullptr, op, ": ", name, " has no data");
  KILN_CHECK(t.shape[ndim - 1] <= 1 || t.stride[ndim - 1] == 1, op, ": ", name,
             " needs a unit last stride, got ", t.describe());
}

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.device == b.device, op, ": tensors on different devices: ", a.describe(), " and ",
             b.describe());
}

}  // namespace kiln::ops::detail
