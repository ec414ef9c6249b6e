// Whether this test binary runs under a sanitizer that replaces malloc (the host builds of
// scripts/test-sanitized): glibc's malloc settings do not apply there, and resident memory counts
// the sanitizer's shadow and quarantine, so tests of those figures say so and skip.
#pragma once

namespace starling::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerAllocator = true;
#else
inline constexpr bool kSanitizerAllocator = false;
#endif

}  // namespace starling::test
