// Choosing a backend from the `device` setting (kernels/backend.h). On a machine without a GPU,
// "auto" must land on the CPU and say why, and an explicit GPU must be refused with its name.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend.h"

using namespace starling;

TEST_CASE(
    "device names parse to auto, cpu, GPU indices or every GPU, and anything else is refused") {
    CHECK(parse_device("auto").kind == DeviceChoice::Kind::Auto);
    CHECK(parse_device("cpu").kind == DeviceChoice::Kind::Cpu);
    const DeviceChoice plain = parse_device("cuda");
    CHECK(plain.kind == DeviceChoice::Kind::Cuda);
    CHECK(plain.gpus == std::vector<int>{0});
    const DeviceChoice third = parse_device("cuda:2");
    CHECK(third.kind == DeviceChoice::Kind::Cuda);
    CHECK(third.gpus == std::vector<int>{2});
    CHECK_FALSE(third.all_gpus);
    const DeviceChoice some = parse_device("cuda:3,0,7");
    CHECK(some.kind == DeviceChoice::Kind::Cuda);
    CHECK(some.gpus == std::vector<int>{3, 0, 7});
    const DeviceChoice every = parse_device("cuda:all");
    CHECK(every.kind == DeviceChoice::Kind::Cuda);
    CHECK(every.all_gpus);
    CHECK(every.gpus.empty());
    for (const char* bad :
         {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999999999", "CPU", "", "cuda:1,", "cuda:,1",
          "cuda:1,,2", "cuda:1;2", "cuda:0,all", "cuda:ALL"}) {
        CHECK_THROWS_WITH(parse_device(bad),
                          Catch::Contains(std::string("device \"") + bad + "\" is not one of"));
    }
    CHECK_THROWS_WITH(parse_device("cuda:0,1,0"),
                      Catch::Contains("device \"cuda:0,1,0\" names cuda:0 twice"));
}

TEST_CASE("device cpu gives the CPU backend with its thread count") {
    const Backend backend = make_backend({"cpu", 1, "fp32"});
    REQUIRE(backend.devices.size() == 1);
    CHECK_FALSE(backend.all_reduce);
    CHECK_FALSE(backend.gpu);
    CHECK(backend.lead().name() == "cpu");
    CHECK(backend.lead().host_memory());
    CHECK(backend.description == "cpu (1 threads)");
    CHECK(backend_device_peak_bytes(backend.lead()) == 0);
}

TEST_CASE("device auto takes GPU 0 when one is usable, else the CPU with the reason") {
    std::string reason;
    const int devices = usable_cuda_devices(&reason);
    const Backend backend = make_backend({"auto", 1, "fp32"});
    REQUIRE(backend.devices.size() == 1);
    CHECK_FALSE(backend.all_reduce);
    if (devices > 0 && cuda_devices_emulated()) {
        CHECK_FALSE(backend.gpu);
        CHECK(backend.lead().name() == "cpu");
        CHECK(backend.description.find("emulated") != std::string::npos);
    } else if (devices > 0) {
        CHECK(backend.gpu);
        CHECK(backend.lead().name().starts_with("cuda:0 ("));
        CHECK_FALSE(backend.lead().host_memory());
    } else {
        CHECK_FALSE(backend.gpu);
        CHECK(backend.lead().name() == "cpu");
        CHECK(backend.description == "cpu (1 threads); no usable GPU: " + reason);
        CHECK_FALSE(reason.empty());
    }
}

TEST_CASE("an explicit GPU the machine lacks is an error naming it, never a CPU run") {
    const int devices = usable_cuda_devices();
    const std::string missing = "cuda:" + std::to_string(devices);
    CHECK_THROWS_WITH(make_backend({missing, 1, "fp32"}), Catch::Contains(missing));
    // In a list too, wherever it stands.
    const std::string listed = "cuda:0," + missing;
    CHECK_THROWS_WITH(make_backend({listed, 1, "fp32"}), Catch::Contains(missing));
}

TEST_CASE(
    "device cuda:all takes every usable GPU, and is an error naming why where there is none") {
    std::string reason;
    const int devices = usable_cuda_devices(&reason);
    if (devices == 0) {
        CHECK_THROWS_WITH(make_backend({"cuda:all", 1, "fp32"}),
                          Catch::Contains("device \"cuda:all\"") && Catch::Contains(reason));
        return;
    }
    const Backend backend = make_backend({"cuda:all", 1, "fp32"});
    REQUIRE(backend.devices.size() == static_cast<size_t>(devices));
    CHECK(backend.gpu);
    CHECK(static_cast<bool>(backend.all_reduce) == (devices > 1));
    for (int i = 0; i < devices; i++) {
        CHECK(backend.devices[static_cast<size_t>(i)]->name().starts_with(
            "cuda:" + std::to_string(i) + " ("));
    }
}

TEST_CASE("matmul precisions are fp32, tf32 or bf16, and another name is refused") {
    for (const char* ok : {"fp32", "tf32", "bf16"}) CHECK_NOTHROW(check_matmul_precision(ok));
    CHECK_THROWS_WITH(check_matmul_precision("fp16"),
                      Catch::Contains("matmul precision \"fp16\" is not one of"));
    CHECK_THROWS_WITH(make_backend({"cpu", 1, "int8"}), Catch::Contains("\"int8\""));
}
