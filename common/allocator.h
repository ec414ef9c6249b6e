// Process-wide malloc settings for a process that streams large messages (starlingd, the exchange
// benchmark). By default glibc returns freed multi-megabyte blocks to the kernel at once (mmap, or
// trimming the heap's top), so each 4 MiB frame gRPC reads into lands on fresh pages that the
// kernel must fault in and zero: on loopback that cost about as much CPU as the data's copies.
// Kept in the heap instead, the next frame reuses them. What stays reserved is bounded by the
// largest burst of such buffers, not by how many pass through, and a long-lived process gives the
// free part of it back from time to time (release_free_memory), so that its resident size follows
// what it uses rather than the largest burst it ever had.
#pragma once

namespace starling {

// Call once at the start of main, before threads start. False if glibc refused the settings, which
// costs speed only.
bool keep_freed_buffers_for_reuse();

// Returns the heap's free pages to the kernel, wherever they lie in it (malloc_trim); true when
// there were any. Every thread's malloc waits meanwhile (about 0.1 ms per MiB given back on a
// 2-core VM, well under 0.1 ms when there is none), and pages given back are faulted in again when
// next used: call it rarely (starlingd: once a minute).
bool release_free_memory();

}  // namespace starling
