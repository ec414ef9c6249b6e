// A throwaway PKI for the TLS tests, made with the openssl command: a CA and node certificates
// for 127.0.0.1 that it signs.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/atomic_file.h"
#include "peer/tls.h"

namespace starling::test {

inline void run_openssl(const std::string& arguments) {
    const std::string command = "openssl " + arguments + " >/dev/null 2>&1";
    REQUIRE(std::system(command.c_str()) == 0);
}

// Creates <dir>/<ca_name>.pem and .key.
inline void make_ca(const std::filesystem::path& dir, const std::string& ca_name) {
    const auto base = (dir / ca_name).string();
    run_openssl(
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=" +
        ca_name + " -keyout " + base + ".key -out " + base + ".pem");
}

// A node certificate for IP 127.0.0.1 signed by the CA; returns the TLS settings that use it.
inline TlsConfig make_node_tls(const std::filesystem::path& dir, const std::string& ca_name,
                               const std::string& node) {
    const auto base = (dir / node).string();
    const auto ca = (dir / ca_name).string();
    write_file_atomic(dir / (node + ".ext"), std::string("subjectAltName=IP:127.0.0.1\n"));
    run_openssl("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + node +
                " -keyout " + base + ".key -out " + base + ".csr");
    run_openssl("x509 -req -days 2 -in " + base + ".csr -CA " + ca + ".pem -CAkey " + ca +
                ".key -CAcreateserial -out " + base + ".pem -extfile " + base + ".ext");
    return TlsConfig{dir / (ca_name + ".pem"), dir / (node + ".pem"), dir / (node + ".key")};
}

}  // namespace starling::test
