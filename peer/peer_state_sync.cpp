#include "peer/peer_state_sync.h"

#include <string>
#include <vector>

#include "common/error.h"

namespace starling {

PeerStateSync::PeerStateSync(SwarmAuth& auth, size_t snapshots_kept,
                             std::chrono::milliseconds call_timeout, int max_concurrent_chunks)
    : auth_(auth),
      snapshots_(snapshots_kept, call_timeout),
      service_(snapshots_, auth, max_concurrent_chunks) {}

FetchResult PeerStateSync::fetch(const MemberTable& table,
                                 const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                 const SnapshotExpectation& expected,
                                 std::span<std::byte> destination, const FetchOptions& options) {
    const uint64_t self = table.self().node_id;
    std::vector<std::string> donors;
    for (uint64_t id : table.pairable_ids()) {
        if (id == self) continue;
        if (const auto member = table.find(id)) donors.push_back(member->address);
    }
    if (donors.empty())
        throw Error(
            "state sync: no live member runs this model, so there is no donor to fetch from");
    FetchOptions watched = options;
    // A donor frozen or killed mid-copy is let go once the failure detector says it is dead, not
    // at its chunk deadline, which on a slow link is tens of seconds. Suspicion alone is not
    // enough: a donor busy serving may answer probes late without being gone.
    watched.donor_gone = [&table](const std::string& address) {
        for (const Member& m : table.all())
            if (m.address == address)
                return m.state == MemberState::Dead || m.state == MemberState::Left;
        return true;  // no longer a member at all
    };
    return fetch_snapshot(donors, auth_, credentials, expected, destination, watched);
}

}  // namespace starling
