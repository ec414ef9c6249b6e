#include "peer/peer_state_sync.h"

#include <string>
#include <vector>

#include <fmt/format.h>

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
    size_t private_members = 0;
    for (uint64_t id : table.pairable_ids()) {
        if (id == self) continue;
        const auto member = table.find(id);
        if (!member) continue;
        // Nobody can dial a private member (docs/nat.md): its snapshot cannot be fetched.
        if (!callable(*member)) {
            ++private_members;
            continue;
        }
        donors.push_back(member->address);
    }
    if (donors.empty() && private_members > 0)
        throw Error(fmt::format(
            "state sync: every live member that runs this model ({}) is private: nobody can "
            "dial them, so there is no donor to fetch from",
            private_members));
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
