// A private member's anchors: members that can be dialed, each holding a stream the private
// member opened to it (the Anchor call), over which the probes of the member reach it. The member
// names them in its digest; a prober pings it through them (SwimCore::indirect_helpers) rather
// than at an address nobody can dial, so the member is not suspected at every probe. Which
// members to hold is decided here, without I/O: the daemon (peer/anchor_links.h) and the
// simulator (sim/) both call it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "peer/membership.h"

namespace starling {

// Two: one anchor's departure leaves the member reachable while it finds another.
inline constexpr size_t kAnchorsWanted = 2;
// The streams one anchor holds at most (AnchorHub): each takes one of the peer server's threads
// (PeerConfig::max_server_threads is 32 by default), and the cap spreads private members over the
// public ones rather than all onto the first they met.
inline constexpr size_t kAnchorStreamsMax = 8;

// The anchors to hold, at most `want`: the current ones still alive and callable (a stream is not
// dropped for a shift in latency), then members that said they are public, then those that said
// nothing yet, each group by the round trip this node measured to them (`round_trip_ms`; never
// measured last), then by a hash of `self` and their id, so private members that measured nothing
// yet spread over the public ones; a current anchor that is suspected last, only while nobody
// else fills its place. `members` are the other members; `refused` are left out (an anchor that
// turned this node away lately, as it held all the streams it takes).
std::vector<uint64_t> choose_anchors(
    uint64_t self, const std::vector<Member>& members, const std::vector<uint64_t>& current,
    const std::function<std::optional<double>(uint64_t)>& round_trip_ms,
    const std::set<uint64_t>& refused, size_t want = kAnchorsWanted);

// Whether `current` is a whole set of anchors that `table` still lists alive: then no choice is
// made (choose_anchors would keep them all).
bool anchors_hold(const MemberTable& table, const std::vector<uint64_t>& current);

}  // namespace starling
