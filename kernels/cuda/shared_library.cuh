// A shared library opened with dlopen and its functions looked up by name: how the CUDA backend
// reaches cuBLAS and NCCL without linking them (see cublas_library.cuh for why).
#pragma once

#include <string>

namespace starling::cuda {

class SharedLibrary {
public:
    // Throws starling::Error naming the library and what dlopen said. The library is never
    // closed: handles made from it may live until the process exits.
    explicit SharedLibrary(std::string name);

    // Sets `out` to the function `symbol`; throws starling::Error naming both when it is missing.
    template <typename F>
    void bind(const char* symbol, F& out) const {
        out = reinterpret_cast<F>(find(symbol));
    }

    const std::string& name() const { return name_; }

private:
    void* find(const char* symbol) const;

    std::string name_;
    void* handle_ = nullptr;
};

}  // namespace starling::cuda
