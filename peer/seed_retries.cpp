#include "peer/seed_retries.h"

#include <algorithm>

namespace starling {

SeedRetries::SeedRetries(std::chrono::milliseconds first_backoff,
                         std::chrono::milliseconds max_backoff)
    : first_(first_backoff), max_(max_backoff) {}

void SeedRetries::add(const std::string& seed) {
    MutexLock lock(mutex_);
    seeds_[seed] = Backoff{};
}

std::vector<std::string> SeedRetries::due(
    SteadyClock::time_point now, const std::function<bool(const std::string&)>& is_member) {
    std::vector<std::string> ripe;
    {
        MutexLock lock(mutex_);
        for (const auto& [seed, backoff] : seeds_)
            if (now >= backoff.next_try) ripe.push_back(seed);
    }
    // Asked without the lock: the caller's answer may take the member table's.
    std::erase_if(ripe, is_member);
    MutexLock lock(mutex_);
    for (auto& [seed, backoff] : seeds_)
        if (now >= backoff.next_try && std::find(ripe.begin(), ripe.end(), seed) == ripe.end())
            backoff = Backoff{};
    return ripe;
}

void SeedRetries::tried(const std::string& seed, bool joined, SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    Backoff& backoff = seeds_[seed];
    backoff.wait = joined ? max_ : std::min(max_, std::max(first_, backoff.wait * 2));
    backoff.next_try = now + backoff.wait;
}

std::vector<std::string> SeedRetries::seeds() const {
    MutexLock lock(mutex_);
    std::vector<std::string> all;
    for (const auto& [seed, backoff] : seeds_) all.push_back(seed);
    return all;
}

}  // namespace starling
