#include "core/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace k3 {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void* aligned_alloc64(size_t bytes) {
  if (bytes == 0) bytes = 64;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) fail("out of memory allocating " + std::to_string(bytes) + " bytes");
  return p;
}
void aligned_free64(void* p) { std::free(p); }

namespace {
// The whole pages inside [p, p + bytes): [lo, hi), hi <= lo when there are none.
void inner_pages(const void* p, size_t bytes, uintptr_t& lo, uintptr_t& hi) {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  hi = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
}
}  // namespace

int64_t resident_bytes(const void* p, size_t bytes) {
  uintptr_t lo, hi;
  inner_pages(p, bytes, lo, hi);
  if (hi <= lo) return 0;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((hi - lo) / page);
  if (::mincore(reinterpret_cast<void*>(lo), hi - lo, v.data()) != 0) fail("mincore failed on a buffer");
  int64_t n = 0;
  for (unsigned char c : v) n += (c & 1) ? int64_t(page) : 0;
  return n;
}

int64_t release_pages(void* p, size_t bytes) {
  uintptr_t lo, hi;
  inner_pages(p, bytes, lo, hi);
  if (hi <= lo) return 0;
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0)
    fail("cannot give memory back to the system (madvise MADV_DONTNEED)");
  return int64_t(hi - lo);
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) { st[i] = s; s *= shape[i]; }
  return st;
}

Tensor Tensor::unallocated(DType dt, const Shape& shape) {
  for (int64_t d : shape) K3_ASSERT(d >= 0, "negative dimension in " + shape_str(shape));
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::empty(DType dt, const Shape& shape) {
  Tensor t = unallocated(dt, shape);
  void* p = aligned_alloc64(t.nbytes());
  t.owner_ = std::shared_ptr<void>(p, aligned_free64);
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(DType dt, const Shape& shape) {
  Tensor t = empty(dt, shape);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::zeros_mapped(DType dt, const Shape& shape) {
  Tensor t = unallocated(dt, shape);
  const size_t bytes = t.nbytes();
  if (bytes == 0) return zeros(dt, shape);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("out of memory mapping " + std::to_string(bytes) + " bytes");
  t.owner_ = std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, bytes); });
  t.data_ = p;
  return t;
}

Tensor Tensor::from_f32(const Shape& shape, const float* src) {
  Tensor t = empty(DType::F32, shape);
  std::memcpy(t.data_, src, t.nbytes());
  return t;
}

Tensor Tensor::view_of(DType dt, const Shape& shape, void* data, std::shared_ptr<void> owner) {
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  K3_ASSERT(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "bad slice");
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + begin * strides_[0] * int64_t(dtype_size(dtype_));
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  K3_ASSERT(is_contiguous(), "reshape of a non-contiguous tensor");
  K3_ASSERT(shape_numel(shape) == numel(), "reshape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  Tensor t = empty(dt, shape_);
  t.copy_from(*this);
  return t;
}

// Reads element i (in row-major logical order) of a contiguous tensor as double.
static double load_as_double(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::U8: case DType::BOOL: return static_cast<const uint8_t*>(p)[i];
    case DType::I8: return static_cast<const int8_t*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return double(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}
static void store_from_double(void* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::F32: static_cast<float*>(p)[i] = float(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(float(v)); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(float(v)); break;
    case DType::U8: case DType::BOOL: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case DType::I8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
  }
}

void Tensor::copy_from(const Tensor& src) {
  K3_ASSERT(src.shape_ == shape_, "copy_from shape " + shape_str(src.shape_) + " to " + shape_str(shape_));
  // Only dim-0 slices and reshapes exist, so every tensor is contiguous; keep it checked.
  K3_ASSERT(is_contiguous() && src.is_contiguous(), "copy_from of a strided tensor");
  const int64_t n = numel();
  if (src.dtype_ == dtype_) {
    std::memcpy(data_, src.data_, nbytes());
  } else if (src.dtype_ == DType::BF16 && dtype_ == DType::F32) {
    bf16_to_f32(static_cast<const uint16_t*>(src.data_), static_cast<float*>(data_), size_t(n));
  } else if (src.dtype_ == DType::F32 && dtype_ == DType::BF16) {
    f32_to_bf16(static_cast<const float*>(src.data_), static_cast<uint16_t*>(data_), size_t(n));
  } else if (src.dtype_ == DType::F16 && dtype_ == DType::F32) {
    f16_to_f32(static_cast<const uint16_t*>(src.data_), static_cast<float*>(data_), size_t(n));
  } else {
    for (int64_t i = 0; i < n; ++i) store_from_double(data_, dtype_, i, load_as_double(src.data_, src.dtype_, i));
  }
}

Mxfp4Matrix Mxfp4Matrix::from(Tensor packed, Tensor scales, const std::string& what) {
  if (packed.dtype() != DType::U8 || packed.ndim() != 2)
    fail(what + ".weight_packed: expected U8 [rows, cols/2], got " + dtype_name(packed.dtype()) + " " + shape_str(packed.shape()));
  if (scales.dtype() != DType::U8 || scales.ndim() != 2)
    fail(what + ".weight_scale: expected U8 [rows, cols/32], got " + dtype_name(scales.dtype()) + " " + shape_str(scales.shape()));
  Mxfp4Matrix m;
  m.rows = packed.dim(0);
  m.cols = packed.dim(1) * 2;
  if (scales.dim(0) != m.rows || scales.dim(1) * 32 != m.cols)
    fail(what + ".weight_scale: shape " + shape_str(scales.shape()) + " does not match packed " + shape_str(packed.shape()) +
         " (expected [" + std::to_string(m.rows) + ", " + std::to_string(m.cols / 32) + "])");
  m.packed = std::move(packed);
  m.scales = std::move(scales);
  return m;
}

Tensor Mxfp4Matrix::dequantize() const {
  Tensor out = Tensor::empty(DType::F32, {rows, cols});
  const uint8_t* p = packed.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    mxfp4_decode_row(p + r * (cols / 2), s + r * (cols / 32), o + r * cols, size_t(cols));
  return out;
}

Mxfp4Matrix Mxfp4Matrix::quantize(const Tensor& w) {
  K3_ASSERT(w.dtype() == DType::F32 && w.ndim() == 2 && w.dim(1) % 32 == 0);
  Mxfp4Matrix m;
  m.rows = w.dim(0);
  m.cols = w.dim(1);
  m.packed = Tensor::empty(DType::U8, {m.rows, m.cols / 2});
  m.scales = Tensor::empty(DType::U8, {m.rows, m.cols / 32});
  for (int64_t r = 0; r < m.rows; ++r)
    mxfp4_encode_row(w.data<float>() + r * m.cols, m.packed.data<uint8_t>() + r * (m.cols / 2),
                     m.scales.data<uint8_t>() + r * (m.cols / 32), size_t(m.cols));
  return m;
}

}  // namespace k3
