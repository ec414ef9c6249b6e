#include "kernels/cuda/shared_library.cuh"

#include <dlfcn.h>

#include <utility>

#include "common/error.h"

namespace starling::cuda {

SharedLibrary::SharedLibrary(std::string name) : name_(std::move(name)) {
    handle_ = dlopen(name_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) throw Error("cannot load " + name_ + ": " + dlerror());
}

void* SharedLibrary::find(const char* symbol) const {
    void* found = dlsym(handle_, symbol);
    if (found == nullptr) throw Error(name_ + ": no symbol " + symbol + " (" + dlerror() + ")");
    return found;
}

}  // namespace starling::cuda
