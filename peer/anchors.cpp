#include "peer/anchors.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "common/random.h"

namespace starling {

std::vector<uint64_t> choose_anchors(
    uint64_t self, const std::vector<Member>& members, const std::vector<uint64_t>& current,
    const std::function<std::optional<double>(uint64_t)>& round_trip_ms,
    const std::set<uint64_t>& refused, size_t want) {
    const auto usable = [&](const Member& m) {
        return m.state == MemberState::Alive && callable(m) && !refused.contains(m.node_id);
    };
    std::vector<uint64_t> chosen;
    for (const uint64_t id : current) {
        const auto it = std::find_if(members.begin(), members.end(),
                                     [&](const Member& m) { return m.node_id == id; });
        if (chosen.size() < want && it != members.end() && usable(*it)) chosen.push_back(id);
    }
    // Not public, round trip, the tie-break, id.
    std::vector<std::tuple<bool, double, uint64_t, uint64_t>> ranked;
    for (const Member& m : members) {
        if (!usable(m) || std::find(chosen.begin(), chosen.end(), m.node_id) != chosen.end())
            continue;
        const double rtt =
            round_trip_ms(m.node_id).value_or(std::numeric_limits<double>::infinity());
        ranked.emplace_back(m.reachability != Reachability::Public, rtt,
                            hash_index(self, m.node_id), m.node_id);
    }
    std::sort(ranked.begin(), ranked.end());
    for (const auto& [not_public, rtt, tie, id] : ranked) {
        if (chosen.size() >= want) break;
        chosen.push_back(id);
    }
    // A suspected anchor is kept while nobody else can take its place: dropping it would leave
    // the node no way in (a swarm with one public member, whose late answers on a busy box made
    // it suspect), and one that died is declared dead within the suspicion timeout.
    for (const uint64_t id : current) {
        const auto it = std::find_if(members.begin(), members.end(),
                                     [&](const Member& m) { return m.node_id == id; });
        if (chosen.size() < want && it != members.end() && it->state == MemberState::Suspect &&
            callable(*it) && !refused.contains(id) &&
            std::find(chosen.begin(), chosen.end(), id) == chosen.end())
            chosen.push_back(id);
    }
    return chosen;
}

bool anchors_hold(const MemberTable& table, const std::vector<uint64_t>& current) {
    return current.size() == kAnchorsWanted &&
           std::all_of(current.begin(), current.end(),
                       [&](uint64_t id) { return table.state_of(id) == MemberState::Alive; });
}

}  // namespace starling
