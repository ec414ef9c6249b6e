// TLS for the peer port. With a CA, a certificate and its key, the server requires and verifies a
// client certificate from the same CA (mutual TLS): a caller without a certificate the swarm
// trusts cannot even open a connection, and every byte on the wire is encrypted and
// integrity-checked. Without TLS the peer port is plaintext and membership rests on the swarm
// secret alone (peer/auth.h).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <filesystem>
#include <memory>
#include <string>

namespace starling {

struct TlsConfig {
    std::filesystem::path ca;    // PEM: the swarm's certificate authority
    std::filesystem::path cert;  // PEM: this node's certificate, signed by the CA
    std::filesystem::path key;   // PEM: its private key
    bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// Both throw starling::Error naming the setting and the file when one of the three is missing
// or unreadable. Plaintext credentials when TLS is not enabled.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsConfig& tls);
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsConfig& tls);

// The CA certificate's PEM text ("" without TLS): what nodes trusting one CA have in common.
std::string trust_anchor(const TlsConfig& tls);

}  // namespace starling
