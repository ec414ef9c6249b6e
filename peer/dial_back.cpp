#include "peer/dial_back.h"

#include <sodium.h>

#include <algorithm>
#include <asio.hpp>
#include <fmt/format.h>

#include "peer/address.h"

namespace starling {

DialBackNonce random_dial_back_nonce() {
    DialBackNonce nonce{};
    randombytes_buf(nonce.data(), nonce.size());
    return nonce;
}

Preamble classify_preamble(std::span<const std::uint8_t> first_bytes) {
    const size_t compared = std::min(first_bytes.size(), kDialBackMagic.size());
    if (compared == 0) return Preamble::Incomplete;
    const auto begins = [&](std::string_view magic) {
        return std::equal(first_bytes.begin(),
                          first_bytes.begin() + static_cast<std::ptrdiff_t>(compared),
                          magic.begin(), [](std::uint8_t byte, char expected) {
                              return byte == static_cast<std::uint8_t>(expected);
                          });
    };
    const bool dial_back = begins(kDialBackMagic);
    if (!dial_back && !begins(kObserveMagic)) return Preamble::Other;
    if (first_bytes.size() < kDialBackPreambleBytes) return Preamble::Incomplete;
    return dial_back ? Preamble::DialBack : Preamble::Observe;
}

DialBackNonce nonce_of_preamble(std::span<const std::uint8_t> preamble) {
    DialBackNonce nonce{};
    std::copy_n(preamble.begin() + static_cast<std::ptrdiff_t>(kDialBackMagic.size()), nonce.size(),
                nonce.begin());
    return nonce;
}

std::string dial_back(const std::string& address, const DialBackNonce& nonce,
                      std::chrono::milliseconds timeout, const std::atomic<bool>* cancelled) {
    const std::optional<HostPort> at = parse_host_port(address);
    if (!at || at->port == 0) return fmt::format("'{}' is not host:port", address);
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    asio::ip::tcp::socket socket(io);
    std::array<std::uint8_t, kDialBackPreambleBytes> preamble{};
    std::copy(kDialBackMagic.begin(), kDialBackMagic.end(), preamble.begin());
    std::copy(nonce.begin(), nonce.end(), preamble.begin() + kDialBackMagic.size());
    std::string problem = fmt::format("no answer within {} ms", timeout.count());
    resolver.async_resolve(
        at->host, std::to_string(at->port),
        [&](const asio::error_code& error, const asio::ip::tcp::resolver::results_type& found) {
            if (error) {
                problem = fmt::format("cannot resolve {}: {}", at->host, error.message());
                return;
            }
            asio::async_connect(
                socket, found,
                [&](const asio::error_code& connected, const asio::ip::tcp::endpoint&) {
                    if (connected) {
                        problem = connected.message();
                        return;
                    }
                    asio::async_write(socket, asio::buffer(preamble),
                                      [&](const asio::error_code& written, size_t) {
                                          problem = written ? "connected, but could not write: " +
                                                                  written.message()
                                                            : "";
                                      });
                });
        });
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    constexpr auto kCancelCheck = std::chrono::milliseconds(100);
    while (!io.stopped() && !(cancelled && cancelled->load())) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) break;
        io.run_for(std::min<std::chrono::steady_clock::duration>(deadline - now, kCancelCheck));
    }
    return io.stopped() || !(cancelled && cancelled->load()) ? problem : "cancelled";
}

void DialBackInbox::arrived(const DialBackNonce& nonce) {
    {
        MutexLock lock(mutex_);
        seen_.push_back(nonce);
        if (seen_.size() > kKept) seen_.pop_front();
    }
    changed_.notify_all();
}

bool DialBackInbox::wait_for(const DialBackNonce& nonce, std::chrono::milliseconds limit) {
    MutexLock lock(mutex_);
    return lock.wait_for(changed_, limit, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return std::find(seen_.begin(), seen_.end(), nonce) != seen_.end();
    });
}

}  // namespace starling
