#include "peer/grpc_log.h"

#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>
#include <string>

#include "common/mutex.h"
#include "common/throttle.h"

namespace starling {
namespace {

std::atomic<uint64_t> failed_handshakes{0};
Mutex quiet_mutex;
std::string quiet_file ABSL_GUARDED_BY(quiet_mutex);

struct HandshakeWarning {
    Mutex mutex;
    Throttle throttle ABSL_GUARDED_BY(mutex){std::chrono::seconds(30)};
    uint64_t unwarned ABSL_GUARDED_BY(mutex) = 0;
};
HandshakeWarning handshake_warning;

void warn_failed_handshake(std::string_view message) {
    const uint64_t total = ++failed_handshakes;
    MutexLock lock(handshake_warning.mutex);
    handshake_warning.unwarned++;
    if (!handshake_warning.throttle.due()) return;
    spdlog::warn(
        "peer: {} TLS handshake(s) failed ({} so far), the last: {}: a node with a wrong swarm "
        "secret or a certificate from another CA, or a stranger",
        handshake_warning.unwarned, total, message);
    handshake_warning.unwarned = 0;
}

void log(gpr_log_func_args* args) {
    const std::string_view file(args->file);
    const std::string_view message(args->message);
    {
        MutexLock lock(quiet_mutex);
        if (!quiet_file.empty() && file.ends_with(quiet_file)) return;
    }
    if (file.ends_with("ssl_transport_security.cc") &&
        message.find("Handshake failed") != std::string_view::npos) {
        warn_failed_handshake(message);
        return;
    }
    // Logged for every connection whose client names an address the certificate does not: with
    // certificates from the secret that is every connection, and where the name matters the
    // call fails and says so.
    const bool name_unmatched =
        file.ends_with("ssl_transport_security.cc") &&
        message.find("No match found for server name") != std::string_view::npos;
    // Logged for every connection whose handshake ran out of time; the connection gate counts
    // them and says so once per 30 s.
    const bool handshake_timed_out = file.ends_with("tls_security_connector.cc") &&
                                     message.find("Handshake timed out") != std::string_view::npos;
    spdlog::log(name_unmatched || handshake_timed_out      ? spdlog::level::debug
                : args->severity == GPR_LOG_SEVERITY_ERROR ? spdlog::level::err
                : args->severity == GPR_LOG_SEVERITY_INFO  ? spdlog::level::info
                                                           : spdlog::level::debug,
                "grpc: {}:{}: {}", file, args->line, message);
}

}  // namespace

void route_grpc_log() {
    static std::once_flag once;
    std::call_once(once, [] { gpr_set_log_function(&log); });
}

uint64_t failed_tls_handshakes() { return failed_handshakes.load(); }

QuietGrpcSource::QuietGrpcSource(std::string_view file) {
    route_grpc_log();
    MutexLock lock(quiet_mutex);
    quiet_file = file;
}

QuietGrpcSource::~QuietGrpcSource() {
    MutexLock lock(quiet_mutex);
    quiet_file.clear();
}

}  // namespace starling
