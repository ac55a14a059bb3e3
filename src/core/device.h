// Where a buffer lives: host memory, or the memory of an accelerator behind the Device
// interface (the CUDA backend's, src/cuda/cuda_device.h). The model's wiring is written once
// over raw pointers and ops (kernels/ops.h); the buffers it passes are Buf<T> (below), which
// hold their elements on the host (a std::vector underneath) or on one Device. A null
// Device* means the host everywhere in k3cpp. docs/architecture.md, "Backends".
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace k3 {

// One accelerator's memory and copies. Implementations check every call of their runtime and
// throw k3::Error with what failed (an allocation names the bytes asked for and the bytes free).
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // e.g. "cuda:0 NVIDIA H200 (sm_90, 139.8 GiB)"
  virtual void* alloc(size_t bytes) = 0;  // never null for bytes > 0
  virtual void release(void* p) noexcept = 0;
  virtual void to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;  // waits for the device's queued work
  virtual int64_t free_bytes() const = 0;
  virtual int64_t total_bytes() const = 0;
};

// Copies bytes between any two places: dst on dst_dev, src on src_dev (null = host).
void copy_between(Device* dst_dev, void* dst, Device* src_dev, const void* src, size_t bytes);

// A typed array on the host or on a Device. On the host it is a std::vector<T> (every
// element access works); on a device only the pointer, the size and whole-buffer operations
// are available (element access there is a broken invariant). Copies are deep, on the same
// device. Growth keeps the contents (device: a new allocation and a copy, amortised by
// doubling the capacity), so an append-only cache can grow in place.
template <typename T>
class Buf {
  static_assert(std::is_trivially_copyable_v<T>, "Buf holds plain numbers");

 public:
  Buf() = default;
  explicit Buf(size_t n) : host_(n) {}
  Buf(const Buf& o) : dev_(o.dev_) { *this = o; }
  Buf(Buf&& o) noexcept { swap(o); }
  Buf& operator=(const Buf& o) {
    if (this == &o) return *this;
    if (o.dev_ == nullptr) {
      free_device();
      dev_ = nullptr;
      host_ = o.host_;
    } else {
      if (dev_ != o.dev_) {
        free_device();
        host_ = {};
        dev_ = o.dev_;
      }
      reserve_device(o.n_);
      if (o.n_) dev_->copy(p_, o.p_, o.n_ * sizeof(T));
      n_ = o.n_;
    }
    return *this;
  }
  Buf& operator=(Buf&& o) noexcept {
    if (this != &o) {
      Buf tmp;
      tmp.swap(o);
      swap(tmp);
    }
    return *this;
  }
  ~Buf() { free_device(); }
  void swap(Buf& o) noexcept {
    std::swap(host_, o.host_);
    std::swap(dev_, o.dev_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(cap_, o.cap_);
  }

  Device* device() const { return dev_; }
  bool on_host() const { return dev_ == nullptr; }
  // Moves the buffer to `dev` (null: the host), keeping its contents.
  void move_to(Device* dev);
  // Empties the buffer and places it on `dev` (scratch whose contents need not survive).
  void place(Device* dev) {
    if (dev == dev_) return;
    free_device();
    host_ = {};
    dev_ = dev;
  }

  T* data() { return dev_ ? p_ : host_.data(); }
  const T* data() const { return dev_ ? p_ : host_.data(); }
  size_t size() const { return dev_ ? n_ : host_.size(); }
  bool empty() const { return size() == 0; }
  // Keeps the first min(n, size) elements. New host elements are value-initialised (zero);
  // new device elements are zero-filled too, so both kinds read alike.
  void resize(size_t n) {
    if (!dev_) return host_.resize(n);
    reserve_device(n);
    if (n > n_) dev_->zero(p_ + n_, (n - n_) * sizeof(T));
    n_ = n;
  }
  void clear() {
    if (dev_) n_ = 0;
    else host_.clear();
  }
  void reserve(size_t n) {
    if (dev_) reserve_device(n);
    else host_.reserve(n);
  }
  // n copies of zero (every element, on either kind).
  void assign_zeros(size_t n) {
    if (!dev_) return host_.assign(n, T(0));
    reserve_device(n);
    n_ = n;
    if (n) dev_->zero(p_, n * sizeof(T));
  }
  // Appends n elements from src (on src_dev; null: the host).
  void append(const T* src, size_t n, Device* src_dev = nullptr) {
    const size_t at = size();
    if (!dev_ && !src_dev) return (void)host_.insert(host_.end(), src, src + n);
    resize_uninit(at + n);
    copy_between(dev_, data() + at, src_dev, src, n * sizeof(T));
  }
  // Copies n elements of this buffer starting at `from` into dst (on dst_dev; null: the host).
  void read(T* dst, size_t from, size_t n, Device* dst_dev = nullptr) const {
    K3_ASSERT(from + n <= size(), "Buf::read past the end");
    copy_between(dst_dev, dst, dev_, data() + from, n * sizeof(T));
  }
  // Overwrites n elements starting at `at` from src (on src_dev; null: the host).
  void write(size_t at, const T* src, size_t n, Device* src_dev = nullptr) {
    K3_ASSERT(at + n <= size(), "Buf::write past the end");
    copy_between(dev_, data() + at, src_dev, src, n * sizeof(T));
  }

  // Host only (K3_ASSERT on a device buffer).
  std::vector<T>& host() {
    K3_ASSERT(!dev_, "Buf::host() on a device buffer");
    return host_;
  }
  const std::vector<T>& host() const {
    K3_ASSERT(!dev_, "Buf::host() on a device buffer");
    return host_;
  }
  T& operator[](size_t i) { return host()[i]; }
  const T& operator[](size_t i) const { return host()[i]; }
  T* begin() { return host().data(); }
  T* end() { return host().data() + host_.size(); }
  const T* begin() const { return host().data(); }
  const T* end() const { return host().data() + host_.size(); }
  void assign(size_t n, const T& v) { host().assign(n, v); }
  template <typename It>
  void assign(It first, It last) {
    host().assign(first, last);
  }

 private:
  std::vector<T> host_;
  Device* dev_ = nullptr;
  T* p_ = nullptr;  // device storage [cap_], the first n_ valid
  size_t n_ = 0, cap_ = 0;

  void free_device() noexcept {
    if (dev_ && p_) dev_->release(p_);
    p_ = nullptr;
    n_ = cap_ = 0;
  }
  void reserve_device(size_t n) {
    if (n <= cap_) return;
    const size_t cap = std::max(n, cap_ + cap_ / 2);
    T* p = static_cast<T*>(dev_->alloc(cap * sizeof(T)));
    if (n_) dev_->copy(p, p_, n_ * sizeof(T));
    if (p_) dev_->release(p_);
    p_ = p;
    cap_ = cap;
  }
  void resize_uninit(size_t n) {
    if (!dev_) return host_.resize(n);
    reserve_device(n);
    n_ = n;
  }
};

// Equal sizes and equal elements (a device buffer is read back to compare).
template <typename T>
bool operator==(const Buf<T>& a, const Buf<T>& b) {
  if (a.size() != b.size()) return false;
  if (a.on_host() && b.on_host()) return a.host() == b.host();
  std::vector<T> x(a.size()), y(b.size());
  a.read(x.data(), 0, x.size());
  b.read(y.data(), 0, y.size());
  return x == y;
}

template <typename T>
void Buf<T>::move_to(Device* dev) {
  if (dev == dev_) return;
  Buf<T> moved;
  moved.dev_ = dev;
  moved.resize_uninit(size());
  if (size()) copy_between(dev, moved.data(), dev_, data(), size() * sizeof(T));
  swap(moved);
}

}  // namespace k3
