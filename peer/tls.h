// TLS for the peer port, always mutual: the server requires and verifies a client certificate
// from the same CA, so a caller without a certificate the swarm trusts cannot even open a
// connection, and every byte on the wire is encrypted and integrity-checked. The CA, certificate
// and key are the operator's files when configured (a running node's can be replaced), else
// made from the swarm secret (peer/secret_tls.h).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/support/status.h>

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/mutex.h"

namespace starling {

struct TlsConfig {
    std::filesystem::path ca;    // PEM: the swarm's certificate authority
    std::filesystem::path cert;  // PEM: this node's certificate, signed by the CA
    std::filesystem::path key;   // PEM: its private key
    bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

struct TlsPem {
    std::string ca, cert, key;
};

// Credentials for one call to a node: the configured files' when TLS is enabled (throws
// starling::Error naming the setting and the file when one of the three is missing or
// unreadable), else ones made from the swarm secret.
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsConfig& tls,
                                                              std::string_view swarm_secret);

// Whether a call failed because the TLS handshake refused a certificate: the far end holds
// another swarm secret or certificates from another CA. Named here because gRPC reports it as an
// unavailable connection, like a node that is down.
bool refused_in_tls_handshake(const grpc::Status& status);
// What to say of such a refusal.
inline constexpr const char* kTlsRefusal =
    "starling peer auth: the TLS handshake refused a certificate: wrong swarm secret, or a "
    "certificate from another CA";

// The CA certificate's PEM text ("" without TLS): what nodes trusting one CA have in common.
std::string trust_anchor(const TlsConfig& tls);

// Throws starling::Error naming the setting and the problem unless the three files form a set a
// peer would accept: the key belongs to the certificate, and the CA bundle verifies the
// certificate (through any intermediates after it in its file) as of now.
void check_tls_files(const TlsConfig& tls);

// A node's TLS files as gRPC serves and presents them: checked copies under stage_dir that gRPC's
// file watcher reads again every second. reload() reads the configured files again and puts them
// in place only when check_tls_files passes, so a broken rotation never goes live; connections
// made afterwards use the new certificate, open ones keep theirs.
class TlsCertificates {
public:
    // Creates stage_dir (owner-only) when missing, or a temporary one, removed with this object,
    // when it is empty; throws starling::Error as check_tls_files does.
    TlsCertificates(const TlsConfig& tls, std::filesystem::path stage_dir);
    // Certificates made from the swarm secret, held in memory; they cannot be reloaded. A node's
    // address is not in its certificate: every holder of the secret could sign any name, so the
    // name proves nothing, and peer/auth.h proves which node calls.
    explicit TlsCertificates(std::string_view swarm_secret);
    ~TlsCertificates();
    TlsCertificates(const TlsCertificates&) = delete;
    TlsCertificates& operator=(const TlsCertificates&) = delete;
    // The files at `tls`'s paths (the same as before or others); throws, changing nothing, when
    // they do not pass check_tls_files or the certificates came from the secret.
    void reload(const TlsConfig& tls);
    bool from_secret() const { return stage_dir_.empty(); }
    std::shared_ptr<grpc::ServerCredentials> server_credentials() const;
    std::shared_ptr<grpc::ChannelCredentials> channel_credentials() const;
    // How often gRPC looks at the staged files: a reload reaches new connections within this.
    static constexpr unsigned kRefreshSeconds = 1;

private:
    void stage(const TlsConfig& tls);

    std::filesystem::path stage_dir_;  // empty for certificates from the secret
    bool temporary_ = false;
    Mutex stage_mutex_;  // one stage() at a time writes the files; guards no member
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
};

}  // namespace starling
