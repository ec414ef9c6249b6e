// Deterministic partner matching (CHOOSE_PARTNERS step 1 of docs/spec.md section 4):
// every node that holds the same membership view computes the same groups for a round without
// talking to anyone. The node ids are sorted, shuffled by a seed hashed from (round, membership
// digest), and cut into consecutive groups; a last group of one means a solo round for that node.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace starling {

// A hash of the set of node ids (order does not matter): two nodes agree on it exactly when they
// see the same members.
uint64_t membership_digest(std::span<const uint64_t> node_ids);

// The ids in the order the groups take them: every group_size in a row are a group, each sorted.
// What deterministic_groups cuts, without a vector per group (a choice at 10,000 members made
// 5,000 of them).
std::vector<uint64_t> deterministic_order(uint64_t round, std::span<const uint64_t> node_ids,
                                          size_t group_size);

// Groups of group_size (>= 2; throws starling::Error otherwise) for the round; every id appears
// in exactly one group, each group's ids sorted. Duplicate ids throw starling::Error.
std::vector<std::vector<uint64_t>> deterministic_groups(uint64_t round,
                                                        std::span<const uint64_t> node_ids,
                                                        size_t group_size);

}  // namespace starling
