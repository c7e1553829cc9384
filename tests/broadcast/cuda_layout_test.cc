// The broadcast layout with CUDA tensors and device streams (label gpu; every case skips when
// torch sees no CUDA device; TROUPE_GPU_TEST_DEVICE=cpu dry-runs them on the CPU). The CPU pack of
// the same tensors is the reference: a stream is the same bytes wherever the tensors or the stream
// live.
//
//   * CUDA tensors packed into a host stream (what WeightSender does for a learner on a GPU)
//     give the CPU pack's bytes, as stored and with the bfloat16 wire cast;
//   * packed into a device stream (no host round trip) they give the same bytes too;
//   * a device stream unpacks into CUDA tensors equal to what was sent (views for slots in
//     their own dtype, casts back on the device for bfloat16-wire ones).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <ATen/ATen.h>

#include "../common/gpu_device.h"
#include "troupe/broadcast/layout.h"
#include "weights_fixture.h"

namespace troupe::broadcast {
namespace {

using testing::CompareWeights;
using testing::MakeWeights;

uint64_t Seed() {
  static uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("broadcast_cuda_test seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

NamedTensors ToDevice(const NamedTensors& w, const at::Device& d) {
  NamedTensors out;
  for (const auto& [name, t] : w) out.emplace_back(name, t.to(d));  // keeps strides
  return out;
}

NamedTensors ToCpu(const NamedTensors& w) {
  NamedTensors out;
  for (const auto& [name, t] : w) out.emplace_back(name, t.to(at::kCPU));
  return out;
}

std::vector<uint8_t> HostPack(const NamedTensors& w, const Layout& layout) {
  std::vector<uint8_t> flat(layout.total_bytes, 0xAB);  // junk: padding must be zeroed
  Status st = PackTensors(w, layout, flat.data());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return flat;
}

class CudaLayout : public ::testing::TestWithParam<WireDtype> {};

TEST_P(CudaLayout, CudaTensorsPackToTheCpuBytesInHostAndDeviceStreams) {
  TROUPE_REQUIRE_GPU_DEVICE();
  const at::Device gpu_dev = troupe::test_support::GpuTestDevice();
  const WireDtype wire = GetParam();
  const NamedTensors cpu = MakeWeights(Seed(), 1);
  const NamedTensors gpu = ToDevice(cpu, gpu_dev);
  auto plan_cpu = PlanLayout(cpu, wire, 1 << 16, 1 << 14);
  auto plan_gpu = PlanLayout(gpu, wire, 1 << 16, 1 << 14);
  ASSERT_TRUE(plan_cpu.ok() && plan_gpu.ok()) << plan_gpu.status().ToString();
  ASSERT_TRUE(plan_cpu->SameTensors(*plan_gpu));
  const std::vector<uint8_t> want = HostPack(cpu, *plan_cpu);

  // CUDA tensors into a host stream: one device-to-host copy per tensor.
  EXPECT_EQ(HostPack(gpu, *plan_gpu), want);

  // Into a device stream: packed on the GPU, compared after one copy back.
  at::Tensor dev = at::full({static_cast<int64_t>(plan_gpu->total_bytes)}, 0xAB,
                            at::TensorOptions().dtype(at::kByte).device(gpu_dev));
  Status st = PackTensors(gpu, *plan_gpu, dev.data_ptr<uint8_t>(), gpu_dev);
  ASSERT_TRUE(st.ok()) << st.ToString();
  at::Tensor back = dev.to(at::kCPU);
  ASSERT_EQ(static_cast<uint64_t>(back.numel()), want.size());
  EXPECT_EQ(std::memcmp(back.data_ptr<uint8_t>(), want.data(), want.size()), 0);

  // CPU tensors into a device stream (host to device) give the same bytes as well.
  at::Tensor dev2 = at::empty_like(dev);
  ASSERT_TRUE(PackTensors(cpu, *plan_cpu, dev2.data_ptr<uint8_t>(), gpu_dev).ok());
  EXPECT_TRUE(at::equal(dev2, dev));
}

TEST_P(CudaLayout, DeviceStreamUnpacksIntoCudaTensors) {
  TROUPE_REQUIRE_GPU_DEVICE();
  const at::Device gpu_dev = troupe::test_support::GpuTestDevice();
  const WireDtype wire = GetParam();
  const NamedTensors cpu = MakeWeights(Seed(), 2);
  const NamedTensors gpu = ToDevice(cpu, gpu_dev);
  auto layout = PlanLayout(gpu, wire, 1 << 16, 1 << 14);
  ASSERT_TRUE(layout.ok());
  auto dev =
      std::make_shared<at::Tensor>(at::empty({static_cast<int64_t>(layout->total_bytes)},
                                             at::TensorOptions().dtype(at::kByte).device(gpu_dev)));
  ASSERT_TRUE(PackTensors(gpu, *layout, dev->data_ptr<uint8_t>(), gpu_dev).ok());
  auto cast =
      std::make_shared<at::Tensor>(at::empty({static_cast<int64_t>(CastAreaBytes(*layout)) + 1},
                                             at::TensorOptions().dtype(at::kByte).device(gpu_dev)));
  auto named = UnpackTensors(*layout, dev->data_ptr<uint8_t>(), dev, cast->data_ptr<uint8_t>(),
                             cast, gpu_dev);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  for (const auto& [name, t] : *named) EXPECT_EQ(t.device(), gpu_dev) << name;
  Status st = CompareWeights(ToCpu(*named), cpu, wire);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(DigestTensors(*named), DigestTensors(ToCpu(*named)));  // digests read device memory
}

INSTANTIATE_TEST_SUITE_P(Wire, CudaLayout,
                         ::testing::Values(WireDtype::kAsStored, WireDtype::kBFloat16),
                         [](const auto& info) {
                           return info.param == WireDtype::kAsStored ? std::string("AsStored")
                                                                     : std::string("BFloat16");
                         });

}  // namespace
}  // namespace troupe::broadcast
