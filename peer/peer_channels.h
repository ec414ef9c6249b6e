// The connections a node makes to others and the credentials they use: one gRPC channel per
// address and use, kept while the address is a member or a seed, and the node's TLS
// certificates (configured files, reloadable, or made from the swarm secret), which these
// channels present and the peer server's credentials come from.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "peer/tls.h"

namespace starling {

// Exchanges get connections of their own, so bulk chunks never queue ahead of probes.
enum class ChannelUse { Membership, Exchange };

class PeerChannels {
public:
    // tls: the configured files (kept under data_dir/tls when data_dir is set), or, when TLS is
    // off, certificates made from swarm_secret. max_message_bytes: the cap of membership calls.
    PeerChannels(const TlsConfig& tls, const std::string& swarm_secret,
                 const std::filesystem::path& data_dir, size_t max_message_bytes);

    std::shared_ptr<grpc::Channel> get(const std::string& address,
                                       ChannelUse use = ChannelUse::Membership);
    // A channel of its own to one of the addresses of a seed with several, verified (with TLS)
    // against the seed's host name, since the certificate names that and not the address.
    std::shared_ptr<grpc::Channel> to_seed_address(const std::string& target,
                                                   const std::string& seed);
    // Forgets channels to addresses not in `wanted`. Calls in flight hold their own reference;
    // the connection closes when the last one ends.
    void keep_only(const std::set<std::string>& wanted);
    // The arguments of an exchange channel to `address` on a connection this node did not dial
    // (peer/punched_channel.h): verified (with TLS) against the address's host name.
    grpc::ChannelArguments exchange_arguments(const std::string& address) const;
    size_t size() const;

    // Puts the TLS files at `tls`'s paths in use for connections made from now on, once they
    // pass check_tls_files (peer/tls.h); throws starling::Error naming the problem and keeps the
    // old ones otherwise, or when `tls` would turn TLS on or off, which takes a restart. Nothing
    // to do without TLS.
    void reload_tls(const TlsConfig& tls);
    std::shared_ptr<grpc::ServerCredentials> server_credentials() const;
    const std::shared_ptr<grpc::ChannelCredentials>& credentials() const { return credentials_; }

private:
    grpc::ChannelArguments arguments(ChannelUse use) const;

    const bool tls_configured_;
    const size_t max_message_bytes_;
    std::unique_ptr<TlsCertificates> tls_;
    std::shared_ptr<grpc::ChannelCredentials> credentials_;
    mutable Mutex mutex_;
    std::map<std::pair<std::string, ChannelUse>, std::shared_ptr<grpc::Channel>> channels_
        ABSL_GUARDED_BY(mutex_);
};

}  // namespace starling
