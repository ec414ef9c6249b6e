#include "peer/listen_address.h"

#include <optional>

#include "common/error.h"
#include "peer/address.h"

namespace starling {

void listen_on(asio::ip::tcp::acceptor& acceptor, const std::string& listen,
               const std::string& setting, const std::string& purpose) {
    const std::optional<HostPort> address = parse_host_port(listen);
    if (!address) throw Error(setting + ": \"" + listen + "\" is not HOST:PORT");
    asio::error_code error;
    asio::ip::tcp::resolver resolver(acceptor.get_executor());
    const auto results = resolver.resolve(address->host, std::to_string(address->port),
                                          asio::ip::tcp::resolver::passive, error);
    if (error || results.empty())
        throw Error(setting + ": cannot resolve " + listen + ": " + error.message());
    const asio::ip::tcp::endpoint endpoint = results.begin()->endpoint();
    acceptor.open(endpoint.protocol(), error);
    if (!error) acceptor.set_option(asio::socket_base::reuse_address(true), error);
    // "[::]" takes IPv4 connections too, as gRPC's own listener did.
    if (!error && endpoint.address().is_v6()) acceptor.set_option(asio::ip::v6_only(false), error);
    if (!error) acceptor.bind(endpoint, error);
    if (!error) acceptor.listen(asio::socket_base::max_listen_connections, error);
    if (error) {
        asio::error_code ignored;
        acceptor.close(ignored);
        throw Error(setting + ": cannot " + purpose + " on " + listen + ": " + error.message());
    }
}

}  // namespace starling
