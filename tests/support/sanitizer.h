// Whether this test binary runs under the sanitizers of scripts/test-sanitized's host builds, and
// what a test can then not measure.
#pragma once

namespace starling::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// The sanitizer replaces malloc: glibc's malloc settings do not apply, and resident memory counts
// the sanitizer's shadow and quarantine, so tests of those figures say so and skip.
inline constexpr bool kSanitizerAllocator = true;
#else
inline constexpr bool kSanitizerAllocator = false;
#endif

#if defined(__SANITIZE_ADDRESS__)
// The address build carries UBSan, which checks an object's vptr by first writing the table into a
// pipe: with no descriptor left it cannot open one and reports a sound object as having an invalid
// vptr, so a test that runs the process out of descriptors skips there.
inline constexpr bool kSanitizerNeedsDescriptors = true;
#else
inline constexpr bool kSanitizerNeedsDescriptors = false;
#endif

}  // namespace starling::test
