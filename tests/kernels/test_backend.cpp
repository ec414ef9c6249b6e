// Choosing a backend from the `device` setting (kernels/backend.h). On a machine without a GPU,
// "auto" must land on the CPU and say why, and an explicit GPU must be refused with its name.
#include <catch2/catch.hpp>

#include <string>

#include "common/error.h"
#include "kernels/backend.h"

using namespace starling;

TEST_CASE("device names parse to auto, cpu or a GPU index, and anything else is refused") {
    CHECK(parse_device("auto").kind == DeviceChoice::Kind::Auto);
    CHECK(parse_device("cpu").kind == DeviceChoice::Kind::Cpu);
    const DeviceChoice plain = parse_device("cuda");
    CHECK(plain.kind == DeviceChoice::Kind::Cuda);
    CHECK(plain.index == 0);
    const DeviceChoice third = parse_device("cuda:2");
    CHECK(third.kind == DeviceChoice::Kind::Cuda);
    CHECK(third.index == 2);
    for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999999999", "CPU", ""}) {
        CHECK_THROWS_WITH(parse_device(bad),
                          Catch::Contains(std::string("device \"") + bad + "\" is not one of"));
    }
}

TEST_CASE("device cpu gives the CPU backend with its thread count") {
    const Backend backend = make_backend({"cpu", 1, "fp32"});
    REQUIRE(backend.ops);
    CHECK_FALSE(backend.gpu);
    CHECK(backend.ops->name() == "cpu");
    CHECK(backend.ops->host_memory());
    CHECK(backend.description == "cpu (1 threads)");
    CHECK(backend_device_peak_bytes(*backend.ops) == 0);
}

TEST_CASE("device auto takes GPU 0 when one is usable, else the CPU with the reason") {
    std::string reason;
    const int devices = usable_cuda_devices(&reason);
    const Backend backend = make_backend({"auto", 1, "fp32"});
    REQUIRE(backend.ops);
    if (devices > 0) {
        CHECK(backend.gpu);
        CHECK(backend.ops->name().starts_with("cuda:0 ("));
        CHECK_FALSE(backend.ops->host_memory());
    } else {
        CHECK_FALSE(backend.gpu);
        CHECK(backend.ops->name() == "cpu");
        CHECK(backend.description == "cpu (1 threads); no usable GPU: " + reason);
        CHECK_FALSE(reason.empty());
    }
}

TEST_CASE("an explicit GPU the machine lacks is an error naming it, never a CPU run") {
    const int devices = usable_cuda_devices();
    const std::string missing = "cuda:" + std::to_string(devices);
    CHECK_THROWS_WITH(make_backend({missing, 1, "fp32"}), Catch::Contains(missing));
}

TEST_CASE("matmul precisions are fp32, tf32 or bf16, and another name is refused") {
    for (const char* ok : {"fp32", "tf32", "bf16"}) CHECK_NOTHROW(check_matmul_precision(ok));
    CHECK_THROWS_WITH(check_matmul_precision("fp16"),
                      Catch::Contains("matmul precision \"fp16\" is not one of"));
    CHECK_THROWS_WITH(make_backend({"cpu", 1, "int8"}), Catch::Contains("\"int8\""));
}
