// The sane() check of docs/spec.md section 4: a partner's decoded values join the outer
// step only if every one is finite and their distance from this node's own values is not far
// beyond the usual. A corrupt, mismatched or hostile state otherwise drags phi away in one round.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <span>
#include <string>

namespace starling {

class MessageSanity {
public:
    // Refuses a distance above factor times the median of the last `window` distances seen. It
    // judges only once the window is full: replicas start from the same weights, so the first
    // rounds' distances are far below the usual and would make every later one look hostile.
    explicit MessageSanity(double factor = 10.0, size_t window = 8);

    // Empty when the message may be used, otherwise why not. The distance of every finite message
    // joins the history, refused or not, so a lasting change of scale is accepted after a while.
    std::optional<std::string> check(std::span<const float> decoded, std::span<const float> own);

private:
    double factor_;
    size_t window_;
    std::deque<double> recent_;
};

}  // namespace starling
