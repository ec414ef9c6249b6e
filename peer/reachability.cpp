#include "peer/reachability.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "peer/identity.h"

namespace starling {

const char* reachability_name(Reachability reachability) {
    switch (reachability) {
        case Reachability::Public: return "public";
        case Reachability::Private: return "private";
        case Reachability::Unknown: break;
    }
    return "unknown";
}

ReachabilityVerdict judge_reachability(const std::string& announced,
                                       const std::vector<DialBackResult>& results, size_t others) {
    std::vector<std::string> failures;
    std::set<std::string> observed;
    bool something_else = false;
    size_t unanswered = 0;
    for (const DialBackResult& r : results) {
        if (!r.answered) {
            ++unanswered;
            continue;
        }
        if (!r.observed.empty()) observed.insert(r.observed);
        if (r.arrived)
            return {Reachability::Public,
                    fmt::format("member {} dialed {} and reached this node",
                                format_node_id(r.helper), announced),
                    std::move(observed)};
        if (r.error.empty()) {
            something_else = true;
            failures.push_back(fmt::format("{}: connected, but this node never heard it",
                                           format_node_id(r.helper)));
        } else {
            failures.push_back(fmt::format("{}: {}", format_node_id(r.helper), r.error));
        }
    }
    // A member whose call failed cannot be asked: most likely it cannot be dialed either (in a
    // swarm of one public node and several private ones, each private node waited on the others'
    // answers for good). Every other member means every other that could be asked.
    const size_t askable = others - std::min(others, unanswered);
    const size_t needed = std::max<size_t>(1, std::min(kPrivateAfterFailures, askable));
    if (failures.size() < needed) return {Reachability::Unknown, "", std::move(observed)};
    const std::string shown =
        fmt::format("members could not dial this node's announced address {} ({}){}", announced,
                    fmt::join(failures, "; "),
                    something_else ? ": another process or machine answers at that address" : "");
    return {Reachability::Private, shown, std::move(observed), something_else};
}

}  // namespace starling
