#include "peer/partners.h"

#include <algorithm>
#include <xxhash.h>

#include "common/error.h"
#include "common/random.h"

namespace starling {

namespace {

std::vector<uint64_t> sorted_unique(std::span<const uint64_t> node_ids) {
    std::vector<uint64_t> ids(node_ids.begin(), node_ids.end());
    // Views come sorted (MemberTable::pairable_ids), and every choice of a partner hashes one.
    if (!std::is_sorted(ids.begin(), ids.end())) std::sort(ids.begin(), ids.end());
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
        throw Error("partner matching: a node id appears twice in the membership view");
    }
    return ids;
}

}  // namespace

uint64_t membership_digest(std::span<const uint64_t> node_ids) {
    const std::vector<uint64_t> ids = sorted_unique(node_ids);
    return XXH3_64bits(ids.data(), ids.size() * sizeof(uint64_t));
}

std::vector<uint64_t> deterministic_order(uint64_t round, std::span<const uint64_t> node_ids,
                                          size_t group_size) {
    if (group_size < 2) throw Error("partner matching: the group size must be at least 2");
    std::vector<uint64_t> ids = sorted_unique(node_ids);
    const uint64_t seed = hash_index(membership_digest(ids), round);
    for (size_t i = ids.size(); i > 1; i--) {
        std::swap(ids[i - 1], ids[hash_index(seed, i) % i]);
    }
    for (size_t start = 0; start < ids.size(); start += group_size) {
        const auto first = ids.begin() + static_cast<std::ptrdiff_t>(start);
        std::sort(first,
                  first + static_cast<std::ptrdiff_t>(std::min(group_size, ids.size() - start)));
    }
    return ids;
}

std::vector<std::vector<uint64_t>> deterministic_groups(uint64_t round,
                                                        std::span<const uint64_t> node_ids,
                                                        size_t group_size) {
    const std::vector<uint64_t> ids = deterministic_order(round, node_ids, group_size);
    std::vector<std::vector<uint64_t>> groups;
    for (size_t start = 0; start < ids.size(); start += group_size) {
        const auto first = ids.begin() + static_cast<std::ptrdiff_t>(start);
        groups.emplace_back(
            first, first + static_cast<std::ptrdiff_t>(std::min(group_size, ids.size() - start)));
    }
    return groups;
}

}  // namespace starling
