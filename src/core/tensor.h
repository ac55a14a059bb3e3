// Tensor: shape, strides (in elements), dtype, and memory that is either owned (64-byte
// aligned heap block) or viewed (a sub-range of another tensor or of an mmap'ed file, kept
// alive by a shared handle). Numeric kernels take raw pointers + dimensions; Tensor is the
// currency of I/O, the model's parameter store and the CLI.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace k3 {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

// 64-byte aligned allocation; throws k3::Error when out of memory.
void* aligned_alloc64(size_t bytes);
void aligned_free64(void* p);

// Bytes of [p, p + bytes) resident in memory (mincore over the whole pages inside the range).
int64_t resident_bytes(const void* p, size_t bytes);
// Gives the whole pages inside [p, p + bytes) of an anonymous private mapping back to the
// system (madvise MADV_DONTNEED; they read as zeros afterwards); returns the bytes released.
int64_t release_pages(void* p, size_t bytes);

// An n-dimensional array of one dtype: a shape fixed when it is made, over memory it owns
// (allocated once, 64-byte aligned, uninitialised unless asked) or views. It never grows or
// reallocates; a larger one is a new Tensor.
class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(DType dt, const Shape& shape);  // owned, uninitialised
  static Tensor zeros(DType dt, const Shape& shape);  // owned, zero-filled
  // Owned and zero, from an anonymous mapping (mmap; whole pages): a page takes memory
  // only once written, so ranges never written (another rank's experts) cost none, and
  // madvise(MADV_DONTNEED) over written ones gives them back (reading as zeros again).
  static Tensor zeros_mapped(DType dt, const Shape& shape);
  static Tensor from_f32(const Shape& shape, const float* src);  // owned copy
  // A view of external memory kept alive by `owner` (e.g. an mmap'ed file).
  static Tensor view_of(DType dt, const Shape& shape, void* data, std::shared_ptr<void> owner);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool is_contiguous() const;

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T> T* data() { check_type<T>(); return static_cast<T*>(data_); }
  template <typename T> const T* data() const { check_type<T>(); return static_cast<const T*>(data_); }

  // Views (share memory): rows [begin, end) of dim 0; same data with another shape.
  Tensor slice0(int64_t begin, int64_t end) const;
  Tensor reshape(const Shape& shape) const;  // contiguous tensors only

  Tensor clone() const;               // owned contiguous copy, same dtype
  Tensor to(DType dt) const;          // owned contiguous converted copy (float types, ints)
  Tensor to_f32() const { return to(DType::F32); }
  void copy_from(const Tensor& src);  // same shape; converts dtype

 private:
  static Tensor unallocated(DType dt, const Shape& shape);  // dtype, shape and strides only
  template <typename T> void check_type() const;
  DType dtype_ = DType::F32;
  Shape shape_, strides_;
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
};

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = DType::BF16; };  // or F16
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::I8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };

template <typename T> void Tensor::check_type() const {
  if constexpr (std::is_same_v<T, uint16_t>) {
    K3_ASSERT(dtype_ == DType::BF16 || dtype_ == DType::F16, "tensor is not 16-bit float");
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    K3_ASSERT(dtype_ == DType::U8 || dtype_ == DType::BOOL, "tensor is not u8");
  } else if constexpr (std::is_same_v<T, void>) {
  } else {
    K3_ASSERT(dtype_ == dtype_of<T>::value, std::string("tensor dtype is ") + dtype_name(dtype_));
  }
}

// MXFP4 weight matrix [rows, cols]: packed nibbles U8 [rows, cols/2] and E8M0 scales
// U8 [rows, cols/32], as stored in the checkpoint (`weight_packed`, `weight_scale`).
struct Mxfp4Matrix {
  Tensor packed, scales;
  int64_t rows = 0, cols = 0;
  // Validates shapes: throws k3::Error naming `what` on mismatch.
  static Mxfp4Matrix from(Tensor packed, Tensor scales, const std::string& what);
  Tensor dequantize() const;  // f32 [rows, cols]
  static Mxfp4Matrix quantize(const Tensor& w);  // from f32 [rows, cols], cols % 32 == 0
};

}  // namespace k3
