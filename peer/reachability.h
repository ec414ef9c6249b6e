// Whether other members can dial the address this node announces, judged from their dial-backs
// (peer/reachability_watch.h asks for them): libp2p AutoNAT's question, answered without I/O here
// so that the rule is testable on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace starling {

enum class Reachability { Unknown = 0, Public = 1, Private = 2 };
const char* reachability_name(Reachability reachability);  // "unknown", "public", "private"

// One member's answer to this node's request to dial it back.
struct DialBackResult {
    uint64_t helper = 0;
    bool answered = false;  // the call returned: `error` is then the helper's own dial's
    std::string error;      // why the call failed, or why the helper's dial did; "" when it dialed
    bool arrived = false;   // this node's peer port received the nonce sent to that helper
    std::string observed;   // the host the helper saw the call come from
};

struct ReachabilityVerdict {
    Reachability state = Reachability::Unknown;
    std::string detail;              // what the dial-backs showed (and, from the watch, what to do)
    std::set<std::string> observed;  // hosts the helpers saw this node's calls come from
    bool another_answers = false;    // a helper connected, but the nonce never arrived here
};

// Members a check asks; a verdict of Private needs this many failed dials (or one from every
// other live member, when the swarm has fewer).
inline constexpr size_t kDialBackHelpers = 3;
inline constexpr size_t kPrivateAfterFailures = 2;

// Public as soon as one member's dial reached this node (the nonce it carried arrived here, so no
// other box answered in this node's place); Private once kPrivateAfterFailures members, or all
// `others` that could be asked when fewer, tried and none reached it; Unknown otherwise. A call
// that failed proves nothing either way, but its member could not be asked: with one public
// member and the rest private, that public member's failed dial is the verdict.
ReachabilityVerdict judge_reachability(const std::string& announced,
                                       const std::vector<DialBackResult>& results, size_t others);

}  // namespace starling
