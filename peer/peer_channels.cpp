#include "peer/peer_channels.h"

#include <grpcpp/create_channel.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "peer/address.h"
#include "peer/exchange.h"

namespace starling {

PeerChannels::PeerChannels(const TlsConfig& tls, const std::string& swarm_secret,
                           const std::filesystem::path& data_dir, size_t max_message_bytes)
    : tls_configured_(tls.enabled()),
      max_message_bytes_(max_message_bytes),
      tls_(tls.enabled() ? std::make_unique<TlsCertificates>(
                               tls, data_dir.empty() ? std::filesystem::path() : data_dir / "tls")
                         : std::make_unique<TlsCertificates>(swarm_secret)),
      credentials_(tls_->channel_credentials()) {}

grpc::ChannelArguments PeerChannels::arguments(ChannelUse use) const {
    grpc::ChannelArguments args;
    const size_t cap = use == ChannelUse::Exchange ? kMaxExchangeFrameBytes : max_message_bytes_;
    args.SetMaxReceiveMessageSize(static_cast<int>(cap));
    args.SetMaxSendMessageSize(static_cast<int>(cap));
    // A channel of its own subchannels opens its own connection.
    if (use == ChannelUse::Exchange) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Probes must see a dead peer at once, not after a reconnect backoff of many seconds.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    return args;
}

std::shared_ptr<grpc::Channel> PeerChannels::get(const std::string& address, ChannelUse use) {
    MutexLock lock(mutex_);
    auto& channel = channels_[{address, use}];
    if (!channel) channel = grpc::CreateCustomChannel(address, credentials_, arguments(use));
    return channel;
}

std::shared_ptr<grpc::Channel> PeerChannels::to_seed_address(const std::string& target,
                                                             const std::string& seed) {
    grpc::ChannelArguments args = arguments(ChannelUse::Membership);
    if (tls_configured_) args.SetSslTargetNameOverride(parse_host_port(seed)->host);
    return grpc::CreateCustomChannel(target, credentials_, args);
}

grpc::ChannelArguments PeerChannels::exchange_arguments(const std::string& address) const {
    grpc::ChannelArguments args = arguments(ChannelUse::Exchange);
    if (const auto at = parse_host_port(address); tls_configured_ && at)
        args.SetSslTargetNameOverride(at->host);
    return args;
}

void PeerChannels::keep_only(const std::set<std::string>& wanted) {
    MutexLock lock(mutex_);
    std::erase_if(channels_,
                  [&](const auto& entry) { return !wanted.contains(entry.first.first); });
}

size_t PeerChannels::size() const {
    MutexLock lock(mutex_);
    return channels_.size();
}

void PeerChannels::reload_tls(const TlsConfig& tls) {
    if (tls_->from_secret() && !tls.enabled()) return;
    if (tls_->from_secret() || !tls.enabled())
        throw Error(std::string("TLS files cannot be turned ") + (tls.enabled() ? "on" : "off") +
                    " while the node runs: restart it");
    tls_->reload(tls);
    spdlog::info("peer: TLS certificate {} in use for new connections", tls.cert.string());
}

std::shared_ptr<grpc::ServerCredentials> PeerChannels::server_credentials() const {
    return tls_->server_credentials();
}

}  // namespace starling
