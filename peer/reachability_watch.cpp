#include "peer/reachability_watch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <vector>

#include "peer/address.h"
#include "peer/connection_gate.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {

std::string reachability_advice(const std::string& announced, const ReachabilityVerdict& verdict) {
    const std::optional<HostPort> at = parse_host_port(announced);
    const std::string port = at ? std::to_string(at->port) : "the peer port";
    if (verdict.another_answers)
        return "Set [peer].announce to the address and port this node listens on (or that is "
               "forwarded to it); until then members cannot probe it or ask it to pair";
    if (at && !verdict.observed.empty() && !verdict.observed.contains(at->host))
        return fmt::format(
            "Members see this node's calls come from {}, not {}: it is behind NAT or a firewall. "
            "Forward TCP port {} of that address to this machine and set [peer].announce to it, "
            "or open the port in the firewall; until then members cannot probe it or ask it to pair",
            fmt::join(verdict.observed, " and "), at->host, port);
    return fmt::format(
        "Open TCP port {} to this machine in its firewall (or forward it), or set [peer].announce "
        "to an address members can dial; until then members cannot probe it or ask it to pair",
        port);
}

DialBackResult ask_dial_back(const std::shared_ptr<grpc::Channel>& channel, const SwarmAuth& auth,
                             const std::string& address, DialBackInbox& inbox,
                             grpc::ClientContext& context) {
    DialBackResult result;
    const DialBackNonce nonce = random_dial_back_nonce();
    v1::DialBackRequest request;
    request.set_address(address);
    request.set_nonce(nonce.data(), nonce.size());
    v1::DialBackResponse response;
    context.set_deadline(std::chrono::system_clock::now() + kDialBackTimeout + kDialBackArrival);
    auth.attach(context, "DialBack");
    const grpc::Status status = v1::Peer::NewStub(channel)->DialBack(&context, request, &response);
    if (!status.ok()) {
        result.error = status.error_message();
        return result;
    }
    result.answered = true;
    result.error = response.error();
    result.observed = response.observed();
    result.arrived = result.error.empty() && inbox.wait_for(nonce, kDialBackArrival);
    return result;
}

ReachabilityWatch::ReachabilityWatch(MemberTable& table, PeerChannels& channels,
                                     const SwarmAuth& auth)
    : table_(table), channels_(channels), auth_(auth) {}

ReachabilityWatch::~ReachabilityWatch() { stop(); }

void ReachabilityWatch::start() {
    thread_ = std::thread([this] { run(); });
}

void ReachabilityWatch::stop() {
    cancelled_ = true;
    {
        MutexLock lock(mutex_);
        stopping_ = true;
        for (grpc::ClientContext* call : asking_) call->TryCancel();
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
}

ReachabilityVerdict ReachabilityWatch::verdict() const {
    MutexLock lock(mutex_);
    return verdict_;
}

void ReachabilityWatch::run() {
    for (;;) {
        const bool asked = check();
        const Reachability state = verdict().state;
        // Nobody to ask yet: a second, so the first member's arrival is used at once.
        const std::chrono::milliseconds pause = !asked ? std::chrono::milliseconds(1000)
                                                : state == Reachability::Unknown
                                                    ? std::chrono::milliseconds(kRecheckUndecided)
                                                    : std::chrono::milliseconds(kRecheckDecided);
        MutexLock lock(mutex_);
        if (lock.wait_for(wake_, pause,
                          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return stopping_; }))
            return;
    }
}

bool ReachabilityWatch::check() {
    const Member self = table_.self();
    // A member that says it is private cannot be called: only the others are asked, and only they
    // count towards the failed dials a verdict needs (counted, a private member left a node with
    // one public member to ask waiting for good for a second failure).
    std::vector<Member> helpers;
    for (Member& m : table_.reachable_others())
        if (m.state == MemberState::Alive && m.reachability != Reachability::Private)
            helpers.push_back(std::move(m));
    if (helpers.empty()) return false;
    const size_t askable = helpers.size();
    std::shuffle(helpers.begin(), helpers.end(), rng_);
    if (helpers.size() > kDialBackHelpers) helpers.resize(kDialBackHelpers);

    std::vector<std::future<DialBackResult>> asks;
    for (const Member& helper : helpers)
        asks.push_back(std::async(std::launch::async, [&, helper]() {
            grpc::ClientContext context;
            {
                MutexLock lock(mutex_);
                if (stopping_) return DialBackResult{};
                asking_.insert(&context);
            }
            DialBackResult result =
                ask_dial_back(channels_.get(helper.address), auth_, self.address, inbox_, context);
            result.helper = helper.node_id;
            MutexLock lock(mutex_);
            asking_.erase(&context);
            return result;
        }));
    std::vector<DialBackResult> results;
    for (auto& ask : asks) results.push_back(ask.get());
    ReachabilityVerdict verdict = judge_reachability(self.address, results, askable);
    if (verdict.state == Reachability::Unknown) return true;
    if (verdict.state == Reachability::Private)
        verdict.detail += ". " + reachability_advice(self.address, verdict);
    Reachability before;
    {
        MutexLock lock(mutex_);
        before = verdict_.state;
        verdict_ = verdict;
    }
    table_.set_reachability(verdict.state);
    if (verdict.state != before) {
        if (verdict.state == Reachability::Private)
            spdlog::warn("peer: unreachable: {}", verdict.detail);
        else
            spdlog::info("peer: reachable at {}: {}", self.address, verdict.detail);
    }
    return true;
}

grpc::Status ReachabilityWatch::answer_dial_back(uint64_t caller, const std::string& peer,
                                                 const v1::DialBackRequest& request,
                                                 v1::DialBackResponse* response) {
    if (request.nonce().size() != sizeof(DialBackNonce))
        return {grpc::StatusCode::INVALID_ARGUMENT,
                "a dial-back nonce has " + std::to_string(sizeof(DialBackNonce)) + " bytes, not " +
                    std::to_string(request.nonce().size())};
    const auto now = std::chrono::steady_clock::now();
    {
        MutexLock lock(mutex_);
        std::erase_if(asked_,
                      [&](const auto& entry) { return now - entry.second >= kDialBackPerCaller; });
        if (!asked_.emplace(caller, now).second)
            return {grpc::StatusCode::RESOURCE_EXHAUSTED,
                    "asked for a dial-back less than " +
                        std::to_string(kDialBackPerCaller.count()) + " s ago"};
    }
    if (dialing_.fetch_add(1) >= kConcurrentDialBacks) {
        dialing_--;
        return {grpc::StatusCode::RESOURCE_EXHAUSTED, "dialing back as many as it will at once"};
    }
    DialBackNonce nonce{};
    std::copy(request.nonce().begin(), request.nonce().end(), nonce.begin());
    response->set_error(dial_back(request.address(), nonce, kDialBackTimeout, &cancelled_));
    dialing_--;
    if (const std::optional<std::string> key = connection_key_of_grpc_peer(peer))
        response->set_observed(key->substr(0, key->find(' ')));
    return grpc::Status::OK;
}

}  // namespace starling
