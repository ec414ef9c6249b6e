#include "peer/tls.h"

#include "common/atomic_file.h"
#include "common/error.h"

namespace starling {
namespace {

struct TlsFiles {
    std::string ca, cert, key;
};

TlsFiles read_tls_files(const TlsConfig& tls) {
    const auto read = [](const std::filesystem::path& path, const char* setting) {
        if (path.empty())
            throw Error(std::string("TLS needs all of peer.tls_ca, peer.tls_cert and peer.tls_key; ") + setting +
                        " is not set");
        try {
            return read_file(path);
        } catch (const Error& e) {
            throw Error(std::string(setting) + ": " + e.what());
        }
    };
    return {read(tls.ca, "peer.tls_ca"), read(tls.cert, "peer.tls_cert"), read(tls.key, "peer.tls_key")};
}

}  // namespace

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsConfig& tls) {
    if (!tls.enabled()) return grpc::InsecureServerCredentials();
    const TlsFiles files = read_tls_files(tls);
    grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    options.pem_root_certs = files.ca;
    options.pem_key_cert_pairs.push_back({files.key, files.cert});
    return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsConfig& tls) {
    if (!tls.enabled()) return grpc::InsecureChannelCredentials();
    const TlsFiles files = read_tls_files(tls);
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = files.ca;
    options.pem_private_key = files.key;
    options.pem_cert_chain = files.cert;
    return grpc::SslCredentials(options);
}

std::string trust_anchor(const TlsConfig& tls) { return tls.enabled() ? read_tls_files(tls).ca : std::string(); }

}  // namespace starling
