// The CUDA tests' shared device (see cuda_test.h) and the checks of the device itself: opening
// it, copies both ways, the allocator's errors.
#include "cuda_test.h"

#include <memory>

#include "common/cli_run.h"
#include "common/fixture.h"
#include "core/error.h"

namespace k3::test {

cuda::CudaDevice* cuda_device() {
  static std::unique_ptr<cuda::CudaDevice> dev = [] {
    return cuda::cuda_available() ? std::make_unique<cuda::CudaDevice>(0) : nullptr;
  }();
  return dev.get();
}

}  // namespace k3::test

using namespace k3;

TEST(CudaDevice, DescribesItselfOrWhyThereIsNone) {
  const std::string d = cuda::describe_cuda();
  EXPECT_NE(d.find("CUDA runtime"), std::string::npos) << d;
  if (!cuda::cuda_available()) {
    // No GPU: opening one is one clear error, not a crash.
    try {
      cuda::CudaDevice dev(0);
      ADD_FAILURE() << "opened a CUDA device on a machine that reports none";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << d;
  }
}

TEST(CudaDevice, CopiesRoundTripAndOutOfMemoryNamesTheSizes) {
  K3_REQUIRE_CUDA();
  std::vector<float> h(1 << 20);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(i) * 0.5f - 3.f;
  Buf<float> b = test::to_dev(h);
  Buf<float> c = b;  // a device-to-device deep copy
  b.assign_zeros(b.size());
  EXPECT_EQ(test::to_host(c), h);
  EXPECT_EQ(test::to_host(b), std::vector<float>(h.size(), 0.f));
  c.resize(h.size() + 5);  // growth keeps the contents, zero-fills the tail
  const std::vector<float> g = test::to_host(c);
  EXPECT_TRUE(std::equal(h.begin(), h.end(), g.begin()));
  EXPECT_EQ(g.back(), 0.f);
  try {
    test::cuda_device()->alloc(size_t(1) << 50);
    ADD_FAILURE() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
  }
}

// The k3cpp binary loads the backend from libk3cuda.so beside it: --version names the CUDA
// runtime (or why there is no GPU), and --device cuda is one clear error without a GPU or runs
// with one.
TEST(CudaPlugin, VersionAndDeviceOptionThroughTheBinary) {
  const test::RunResult v = test::k3cpp("--version");
  ASSERT_EQ(v.rc, 0) << v.err;
  EXPECT_NE(v.out.find("CUDA runtime"), std::string::npos) << v.out;
  const test::RunResult g = test::k3cpp("generate " + test::q(test::kReleaseTiny) + " --ids 1,2,3 --max-tokens 3 --device cuda");
  if (!cuda::cuda_available()) {
    EXPECT_EQ(g.rc, 1);
    EXPECT_NE(g.err.find("--device cuda: no usable CUDA driver or GPU"), std::string::npos) << g.err;
    const test::RunResult bad = test::k3cpp("generate " + test::q(test::kReleaseTiny) + " --ids 1 --device tpu");
    EXPECT_EQ(bad.rc, 1);
    EXPECT_NE(bad.err.find("expected cpu, cuda or cuda:N"), std::string::npos) << bad.err;
    GTEST_SKIP() << cuda::describe_cuda();
  }
  EXPECT_EQ(g.rc, 0) << g.err;
  EXPECT_NE(g.err.find("device cuda:0"), std::string::npos) << g.err;
}
