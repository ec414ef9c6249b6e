// Process-wide malloc settings for a process that streams large messages (starlingd, the exchange
// benchmark). By default glibc returns freed multi-megabyte blocks to the kernel at once (mmap, or
// trimming the heap's top), so each 4 MiB frame gRPC reads into lands on fresh pages that the
// kernel must fault in and zero: on loopback that cost about as much CPU as the data's copies.
// Kept in the heap instead, the next frame reuses them. What stays reserved is bounded by the
// largest burst of such buffers, not by how many pass through.
#pragma once

namespace starling {

// Call once at the start of main, before threads start. False if glibc refused the settings, which
// costs speed only.
bool keep_freed_buffers_for_reuse();

}  // namespace starling
