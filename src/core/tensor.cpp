#include "kiln/tensor.h"

#include <algorithm>
#include <sstream>

namespace kiln {

std::string device_name(Device d) {
  return d.is_cpu() ? "cpu" : "cuda:" + std::to_string(d.index);
}

Device parse_device(const std::string& s) {
  if (s == "auto") return cuda_available() ? Device::cuda(0) : Device::cpu();
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string n = s.substr(5);
    KILN_CHECK(!n.empty() && n.size() < 4 &&
                   std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }),
               "--device: expected auto, cpu, cuda or cuda:N, got '", s, "'");
    return Device::cuda(std::stoi(n));
  }
  KILN_FAIL("--device: expected auto, cpu, cuda or cuda:N, got '", s, "'");
}

Tensor::Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device d)
    : data(p), dtype(t), device(d) {
  KILN_CHECK_LE(dims.size(), size_t(kMaxDims));
  ndim = int(dims.size());
  int i = 0;
  for (int64_t v : dims) shape[i++] = v;
  int64_t s = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    stride[k] = s;
    s *= shape[k];
  }
}

Tensor Tensor::strided(void* p, DType t, std::initializer_list<int64_t> dims,
                       std::initializer_list<int64_t> strides, Device d) {
  KILN_CHECK_EQ(dims.size(), strides.size());
  Tensor x(p, t, dims, d);
  int i = 0;
  for (int64_t v : strides) x.stride[i++] = v;
  return x;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    if (shape[k] != 1 && stride[k] != s) return false;
    s *= shape[k];
  }
  return true;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  KILN_CHECK(ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0], "bad row slice [", begin, ", ", end,
             ") of ", describe());
  Tensor v = *this;
  v.data = static_cast<char*>(data) + begin * stride[0] * dtype_size(dtype);
  v.shape[0] = end - begin;
  return v;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> dims) const {
  KILN_CHECK(is_contiguous(), "reshape of a non-contiguous tensor ", describe());
  Tensor v(data, dtype, dims, device);
  KILN_CHECK_EQ(v.numel(), numel(), "reshape must keep the element count");
  return v;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << "] " << device_name(device);
  return os.str();
}

Tensor Buffer::view(DType t, std::initializer_list<int64_t> dims) const {
  Tensor v(data(), t, dims, device_);
  KILN_CHECK_LE(size_t(v.nbytes()), bytes_, "view larger than its buffer");
  return v;
}

}  // namespace kiln
